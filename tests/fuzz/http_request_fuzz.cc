// libFuzzer target: ibev-watch's metrics endpoint (apps/ibev_watch/
// metrics_response.h) over any bytes a client could send on one connection.
// The bytes are read as the server reads them (Beast's http::read into a
// fresh request each time, over a stream that hands them out in chunks of
// the first byte's size, as a network may), and each answer is checked:
// only the statuses the server promises, the metrics as rendered for GET
// /metrics, no body for HEAD, a 400 closing the connection, and the
// response as sent parsing back to itself. A broken promise aborts.
// tools/fuzz.sh builds and runs it.
#include "apps/ibev_watch/beast.h"  // first: the parser as ibev-watch has it

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>

#include "apps/ibev_watch/metrics_response.h"

namespace {

namespace http = boost::beast::http;
using ibev::watch::MetricsRequest;
using ibev::watch::MetricsResponse;

[[noreturn]] void broken(const std::string& what) {
  std::fprintf(stderr, "broken invariant: %s\n", what.c_str());
  std::abort();
}

// A SyncReadStream over the bytes: at most `chunk` a read, then end of file.
struct Bytes {
  std::string_view rest;
  std::size_t chunk;

  template <typename Buffers>
  std::size_t read_some(const Buffers& buffers, boost::system::error_code& error) {
    error = {};
    if (rest.empty()) {
      error = boost::asio::error::eof;
      return 0;
    }
    const std::size_t n = boost::asio::buffer_copy(
        buffers, boost::asio::buffer(rest.data(), std::min(chunk, rest.size())));
    rest.remove_prefix(n);
    return n;
  }
  template <typename Buffers>
  std::size_t read_some(const Buffers& buffers) {
    boost::system::error_code error;
    const std::size_t n = read_some(buffers, error);
    if (error) throw boost::system::system_error(error);
    return n;
  }
};

const std::string kMetrics = "# TYPE ibev_up gauge\nibev_up 1\n";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  // The first byte: the chunk size, and whether rendering fails (odd).
  const bool render_fails = (data[0] & 1) != 0;
  Bytes stream{std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1),
               std::size_t{data[0]} / 2 + 1};
  const auto render = [&]() -> std::string {
    if (render_fails) throw std::runtime_error("no device list");
    return kMetrics;
  };
  int reported = 0;
  const auto failed = [&](const std::string&) { ++reported; };

  boost::beast::flat_buffer buffer;
  // Each request on the connection in turn, as the server's session reads.
  for (int requests = 0;; ++requests) {
    MetricsRequest request;
    boost::beast::error_code error;
    http::read(stream, buffer, request, error);
    const int reported_before = reported;
    const std::optional<MetricsResponse> response =
        ibev::watch::respond(request, error, render, failed);
    if (!response) {
      if (!error) broken("no answer to a request read whole");
      break;
    }
    const int status = response->result_int();
    const bool head = !error && request.method() == http::verb::head;
    const bool metrics =
        !error && request.target() == "/metrics" && (head || request.method() == http::verb::get);
    switch (status) {
      case 200:
        if (!metrics || render_fails) broken("200 for something else than the metrics");
        if (response->body() != (head ? "" : kMetrics)) broken("200 without the metrics");
        break;
      case 400:
        if (!error) broken("400 for a request read whole");
        if (response->keep_alive()) broken("400 keeping the connection");
        break;
      case 404:
        if (error || request.target() == "/metrics") broken("404 for /metrics");
        break;
      case 405:
        if (error || !(request.target() == "/metrics") || metrics) broken("405 for GET or HEAD");
        if ((*response)[http::field::allow] != "GET, HEAD") broken("405 without Allow");
        break;
      case 500:
        if (!metrics || !render_fails) broken("500 for a render that did not fail");
        if (reported != reported_before + 1) broken("500 not reported");
        break;
      default:
        broken("status " + std::to_string(status));
    }
    if (status != 500 && reported != reported_before)
      broken("reported a failure for " + std::to_string(status));
    if (head && !response->body().empty()) broken("a body for HEAD");

    // As sent: it parses back to the same status and body.
    std::ostringstream sent;
    sent << *response;
    const std::string text = sent.str();
    Bytes back{text, text.size()};
    http::response_parser<http::string_body> parser;
    parser.skip(head);
    boost::beast::flat_buffer back_buffer;
    boost::beast::error_code back_error;
    http::read(back, back_buffer, parser, back_error);
    if (back_error) broken("the response does not parse: " + back_error.message() + "\n" + text);
    const MetricsResponse& reread = parser.get();
    if (reread.result_int() != status || reread.body() != response->body() ||
        reread.keep_alive() != response->keep_alive()) {
      broken("the response parses back otherwise:\n" + text);
    }
    if (!response->keep_alive() || requests > 1000) break;
  }
  return 0;
}
