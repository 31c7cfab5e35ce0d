// ibev-watch's answer to a metrics request (metrics_response.h).
#include "apps/ibev_watch/metrics_response.h"

#include <exception>
#include <utility>

#include <boost/beast/http/error.hpp>
#include <boost/beast/http/field.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/verb.hpp>

#include <ibev/formats/prometheus_text.h>

namespace ibev::watch {

namespace http = boost::beast::http;

namespace {

void reply(MetricsResponse& response, http::status status, const char* type, std::string body) {
  response.result(status);
  response.set(http::field::content_type, type);
  response.body() = std::move(body);
  response.prepare_payload();
}

}  // namespace

std::optional<MetricsResponse> respond(const MetricsRequest& request,
                                       const boost::beast::error_code& read,
                                       const std::function<std::string()>& render,
                                       const std::function<void(const std::string&)>& failed) {
  MetricsResponse response;
  if (read && read.category() == http::make_error_code(http::error::bad_target).category() &&
      read != http::error::end_of_stream) {
    // Not HTTP: told so, then closed.
    response.version(11);
    response.keep_alive(false);
    reply(response, http::status::bad_request, "text/plain", "ibev-watch: not an HTTP request\n");
    return response;
  }
  // A client closing, going quiet or going away is not a failure here.
  if (read) return std::nullopt;
  response.version(request.version());
  response.keep_alive(request.keep_alive());
  response.set(http::field::server, "ibev-watch");
  if (request.target() != "/metrics") {
    reply(response, http::status::not_found, "text/plain", "ibev-watch serves /metrics only\n");
  } else if (request.method() != http::verb::get && request.method() != http::verb::head) {
    response.set(http::field::allow, "GET, HEAD");
    reply(response, http::status::method_not_allowed, "text/plain", "GET or HEAD /metrics\n");
  } else {
    try {
      reply(response, http::status::ok, MetricsText::kContentType, render());
    } catch (const std::exception& e) {
      if (failed) failed(std::string("rendering the metrics: ") + e.what());
      reply(response, http::status::internal_server_error, "text/plain",
            "ibev-watch: no metrics\n");
    }
  }
  if (request.method() == http::verb::head) response.body().clear();
  return response;
}

}  // namespace ibev::watch
