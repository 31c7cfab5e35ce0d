// Where ibev-watch's metrics go (exposition.h), without a device: the HTTP
// endpoint's answers and refusals, the textfile's atomic rewrite, and
// promtool's verdict on the whole exposition (watch_metrics.h). The text
// format itself: tests/formats/prometheus_text_test.cc.
#define BOOST_TEST_MODULE ibev_watch_exposition
#include "apps/ibev_watch/beast.h"  // first: the parser as ibev-watch has it

#include <sys/socket.h>

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include <ibev/dispatch/dispatcher.h>
#include <ibev/formats/prometheus_text.h>

#include "apps/ibev_watch/exposition.h"
#include "apps/ibev_watch/metrics_response.h"
#include "apps/ibev_watch/watch_metrics.h"
#include "tests/support/testing.h"

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using ibev::MetricsText;
using ibev::testing::eventually;
using namespace std::chrono_literals;

namespace {

std::string tmp_dir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir ? dir : "/tmp";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

struct Answer {
  unsigned status = 0;
  std::string content_type;
  std::string body;
};

Answer request(std::uint16_t port, http::verb method, const std::string& target) {
  asio::io_context io;
  beast::tcp_stream stream(io);
  stream.connect(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  http::request<http::empty_body> req(method, target, 11);
  req.set(http::field::host, "127.0.0.1");
  http::write(stream, req);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.skip(method == http::verb::head);  // a HEAD answer has no body to read
  http::read(stream, buffer, parser);
  const auto& res = parser.get();
  return {res.result_int(), std::string(res[http::field::content_type]), res.body()};
}

ibv_context* fake_device() {
  static ibv_context context{};
  return &context;
}

}  // namespace

// --- the HTTP endpoint ---

BOOST_AUTO_TEST_CASE(serves_metrics_and_refuses_the_rest) {
  std::atomic<int> failures{0};
  ibev::watch::MetricsServer server(
      "127.0.0.1", 0, [] { return std::string("ibev_watch_up 1\n"); },
      [&](const std::string&) { ++failures; });
  BOOST_REQUIRE(server.port() != 0);
  const Answer ok = request(server.port(), http::verb::get, "/metrics");
  BOOST_TEST(ok.status == 200u);
  BOOST_TEST(ok.content_type == MetricsText::kContentType);
  BOOST_TEST(ok.body == "ibev_watch_up 1\n");
  BOOST_TEST(request(server.port(), http::verb::head, "/metrics").body.empty());
  BOOST_TEST(request(server.port(), http::verb::get, "/").status == 404u);
  BOOST_TEST(request(server.port(), http::verb::post, "/metrics").status == 405u);
  BOOST_TEST(failures == 0);
}

BOOST_AUTO_TEST_CASE(a_render_that_throws_is_a_500_and_a_scrape_error) {
  std::atomic<int> failures{0};
  ibev::watch::MetricsServer server(
      "127.0.0.1", 0, []() -> std::string { throw std::runtime_error("no"); },
      [&](const std::string& what) {
        if (what.find("rendering the metrics: no") != std::string::npos) ++failures;
      });
  BOOST_TEST(request(server.port(), http::verb::get, "/metrics").status == 500u);
  BOOST_TEST(failures == 1);
  // And it goes on serving.
  BOOST_TEST(request(server.port(), http::verb::get, "/metrics").status == 500u);
}

BOOST_AUTO_TEST_CASE(an_address_in_use_names_the_bind_and_its_errno) {
  const auto render = [] { return std::string(); };
  ibev::watch::MetricsServer first("127.0.0.1", 0, render, {});
  try {
    ibev::watch::MetricsServer second("127.0.0.1", first.port(), render, {});
    BOOST_FAIL("a second bind of port " << first.port() << " was taken");
  } catch (const std::system_error& e) {
    BOOST_TEST(e.code().value() == EADDRINUSE);
    BOOST_TEST(std::string(e.what()).find("bind 127.0.0.1:" + std::to_string(first.port())) !=
                   std::string::npos,
               e.what());
  }
}

BOOST_DATA_TEST_CASE(a_host_that_is_no_ip_address_is_einval,
                     boost::unit_test::data::make({"localhost", "300.1.1.1", "::1::2"}), host) {
  try {
    ibev::watch::MetricsServer server(host, 0, [] { return std::string(); }, {});
    BOOST_FAIL(host << " was bound");
  } catch (const std::system_error& e) {
    BOOST_TEST(e.code().value() == EINVAL);
    BOOST_TEST(std::string(e.what()).find("not an IP address") != std::string::npos, e.what());
  }
}

// --- the textfile ---

BOOST_AUTO_TEST_CASE(the_textfile_is_written_at_once_and_again_on_change) {
  const std::string path = tmp_dir() + "/ibev.prom";
  std::atomic<int> renders{0};
  ibev::watch::TextfileWriter writer(
      path, 1h, [&] { return "ibev_render " + std::to_string(++renders) + "\n"; }, {});
  BOOST_TEST(read_file(path) == "ibev_render 1\n");
  writer.changed();
  eventually([&] { return read_file(path) == "ibev_render 2\n"; }, 10s);
  BOOST_TEST(read_file(path) == "ibev_render 2\n");
  std::ifstream leftover(path + ".tmp");
  BOOST_TEST(!leftover, "the temporary file was renamed, not left");
}

BOOST_AUTO_TEST_CASE(the_textfile_is_rewritten_every_period_without_change) {
  const std::string path = tmp_dir() + "/period.prom";
  std::atomic<int> renders{0};
  ibev::watch::TextfileWriter writer(
      path, 20ms, [&] { return "ibev_render " + std::to_string(++renders) + "\n"; }, {});
  BOOST_TEST(eventually([&] { return renders >= 3; }, 10s));
}

BOOST_AUTO_TEST_CASE(a_textfile_in_a_missing_folder_names_the_open_and_enoent) {
  const std::string path = tmp_dir() + "/no/such/folder/ibev.prom";
  try {
    ibev::watch::TextfileWriter writer(path, 1h, [] { return std::string(); }, {});
    BOOST_FAIL("wrote " << path);
  } catch (const std::system_error& e) {
    BOOST_TEST(e.code().value() == ENOENT);
    BOOST_TEST(std::string(e.what()).find("open " + path + ".tmp") != std::string::npos, e.what());
  }
}

// --- the whole exposition, as Prometheus's own checker reads it ---

BOOST_AUTO_TEST_CASE(promtool_accepts_the_exposition) {
  ibev::Dispatcher dispatcher;
  ibev::watch::WatchMetrics metrics;
  const auto now = std::chrono::system_clock::now();
  metrics.added("rxe0");
  metrics.event(ibev::Event::synthesize(fake_device(), IBV_EVENT_PORT_ERR, ibev::Port{1}), "rxe0",
                now);
  metrics.event(ibev::Event::synthesize(fake_device(), IBV_EVENT_GID_CHANGE, ibev::Port{1}), "rxe0",
                now);
  metrics.event(ibev::Event::synthesize(fake_device(), 77, ibev::WholeDevice{}), "rxe0", now);
  metrics.removed("rxe0", ibev::DeviceLoss::kRemoved);
  metrics.scrape_error();
  const std::string text = metrics.render(dispatcher, {});
  BOOST_TEST(text.find("ibev_watch_events_total{device=\"rxe0\",port=\"1\",event=\"IBV_EVENT_"
                       "PORT_ERR\",element=\"port\"} 1\n") != std::string::npos,
             text);
  BOOST_TEST(
      text.find("ibev_watch_device_removals_total{device=\"rxe0\",reason=\"removed\"} 1\n") !=
          std::string::npos,
      text);
  BOOST_TEST(text.find("ibev_watch_devices 0\n") != std::string::npos, text);
  // Every removal series is there from the add on, at 0 but the one that came.
  BOOST_TEST(text.find("ibev_watch_device_removals_total{device=\"rxe0\",reason=\"fatal\"} 0\n") !=
                 std::string::npos,
             text);
  BOOST_TEST(text.find("ibev_watch_scrape_errors_total 1\n") != std::string::npos, text);
  BOOST_TEST(text.find("ibev_dispatcher_turns_total ") != std::string::npos, text);

  const std::string path = tmp_dir() + "/exposition.prom";
  std::ofstream(path) << text;
  const std::string report = tmp_dir() + "/promtool.out";
  const int status =
      std::system(("promtool check metrics <" + path + " >" + report + " 2>&1").c_str());
  BOOST_TEST(status == 0, "promtool check metrics:\n" << read_file(report) << "\non:\n" << text);
}

namespace {

// A client's bytes as the server's reads get them: one piece a read, then
// end of file (Beast's SyncReadStream).
struct Pieces {
  std::vector<std::string> pieces;
  std::size_t next = 0;

  template <typename Buffers>
  std::size_t read_some(const Buffers& buffers, beast::error_code& error) {
    error = {};
    if (next == pieces.size()) {
      error = asio::error::eof;
      return 0;
    }
    const std::string& piece = pieces[next++];
    return asio::buffer_copy(buffers, asio::buffer(piece));
  }
  template <typename Buffers>
  std::size_t read_some(const Buffers& buffers) {
    beast::error_code error;
    const std::size_t n = read_some(buffers, error);
    if (error) throw beast::system_error(error);
    return n;
  }
};

}  // namespace

// Found by tests/fuzz/http_request_fuzz.cc: Beast 1.74 aborted ibev-watch
// (built with assertions) on a final chunk whose CRLF came in a later read
// (apps/ibev_watch/beast.h). The request is read, and answered.
BOOST_AUTO_TEST_CASE(a_final_chunk_in_pieces_is_read) {
  Pieces client{{"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n",
                 "\r", "\n"}};
  beast::flat_buffer buffer;
  ibev::watch::MetricsRequest request;
  beast::error_code error;
  http::read(client, buffer, request, error);
  BOOST_TEST(!error, error.message());
  const auto response = ibev::watch::respond(
      request, error, [] { return std::string("ibev_up 1\n"); }, nullptr);
  BOOST_REQUIRE(response);
  BOOST_TEST(response->result_int() == 200);
  BOOST_TEST(response->body() == "ibev_up 1\n");
}
