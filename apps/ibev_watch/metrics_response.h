// ibev-watch's answer to one HTTP request for its metrics, apart from the
// socket that carried it (exposition.h's MetricsServer reads and writes; this
// decides), so that a test or a fuzzer can hand it any bytes Beast parsed.
//
// Thread-safety: a free function; any thread. It calls `render` and `failed`
// on the caller's thread.
#ifndef IBEV_APPS_IBEV_WATCH_METRICS_RESPONSE_H_
#define IBEV_APPS_IBEV_WATCH_METRICS_RESPONSE_H_

#include <functional>
#include <optional>
#include <string>

#include "apps/ibev_watch/beast.h"  // before Boost's headers

#include <boost/beast/core/error.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

namespace ibev::watch {

using MetricsRequest = boost::beast::http::request<boost::beast::http::string_body>;
using MetricsResponse = boost::beast::http::response<boost::beast::http::string_body>;

// What to send for `request`, which a read ending in `read` gave: 200 with
// render()'s text for GET or HEAD /metrics (HEAD without the body), 404 for
// another path, 405 for another method, 500 when `render` throws (its text
// goes to `failed`, which may be empty), 400 when the bytes were not HTTP
// (a port scanner, a TLS hello), then the connection closes. nullopt when
// the read failed otherwise (the client closed, went quiet or went away):
// close without an answer. Never throws but std::bad_alloc.
std::optional<MetricsResponse> respond(const MetricsRequest& request,
                                       const boost::beast::error_code& read,
                                       const std::function<std::string()>& render,
                                       const std::function<void(const std::string&)>& failed);

}  // namespace ibev::watch

#endif  // IBEV_APPS_IBEV_WATCH_METRICS_RESPONSE_H_
