// ibev-watch's metrics endpoint and textfile (exposition.h).
#include "apps/ibev_watch/beast.h"  // first: before Boost's headers
#include "apps/ibev_watch/exposition.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <exception>
#include <optional>
#include <utility>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <ibev/core/failure.h>

#include "apps/ibev_watch/metrics_response.h"

namespace ibev::watch {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

struct MetricsServer::State {
  State(Render r, ExpositionFailed f) : render(std::move(r)), failed(std::move(f)) {}

  void accept();
  void report(const std::string& what) const {
    if (failed) failed(what);
  }

  asio::io_context io;
  tcp::acceptor acceptor{io};
  asio::steady_timer retry{io};  // after an accept that failed
  int clients = 0;               // on the io thread only
  const Render render;
  const ExpositionFailed failed;
};

namespace {

// A client that sends nothing, or reads nothing, for this long is dropped.
constexpr std::chrono::seconds kClientTimeout{10};

// One connection: requests answered in turn (keep-alive, as Prometheus
// scrapes) until the client closes it or goes quiet.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, MetricsServer::State& server)
      : stream_(std::move(socket)), server_(server) {
    ++server_.clients;
  }
  ~Session() { --server_.clients; }

  void read() {
    request_ = {};
    stream_.expires_after(kClientTimeout);
    http::async_read(
        stream_, buffer_, request_,
        [self = shared_from_this()](beast::error_code error, std::size_t) { self->answer(error); });
  }

 private:
  void answer(beast::error_code error) {
    std::optional<MetricsResponse> response =
        respond(request_, error, server_.render, server_.failed);
    if (!response) return close();
    response_ = std::move(*response);
    send();
  }

  void send() {
    http::async_write(stream_, response_,
                      [self = shared_from_this()](beast::error_code error, std::size_t) {
                        if (!error && self->response_.keep_alive()) return self->read();
                        self->close();
                      });
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
  }

  beast::tcp_stream stream_;
  MetricsServer::State& server_;
  beast::flat_buffer buffer_;
  MetricsRequest request_;
  MetricsResponse response_;
};

// boost::system::error_code of the system category carries the errno.
[[noreturn]] void throw_for(const std::string& what, const beast::error_code& error) {
  throw_system_error(what, error.category() == boost::system::system_category() ||
                                   error.category() == boost::system::generic_category()
                               ? error.value()
                               : EIO);
}

}  // namespace

void MetricsServer::State::accept() {
  acceptor.async_accept([this](beast::error_code error, tcp::socket socket) {
    if (error == asio::error::operation_aborted) return;  // stopping
    if (error) {
      // EMFILE and the like: said, and not retried in a spin.
      report("accepting a connection: " + error.message());
      retry.expires_after(std::chrono::seconds(1));
      retry.async_wait([this](beast::error_code waited) {
        if (waited != asio::error::operation_aborted) accept();
      });
      return;
    }
    if (clients < kMaxClients) {
      std::make_shared<Session>(std::move(socket), *this)->read();
    }  // else the socket closes as it goes
    accept();
  });
}

MetricsServer::MetricsServer(const std::string& host, std::uint16_t port, Render render,
                             ExpositionFailed failed)
    : state_(std::make_unique<State>(std::move(render), std::move(failed))) {
  host_ = host;
  port_ = port;
  const std::string where = authority();
  beast::error_code error;
  const asio::ip::address address = asio::ip::make_address(host, error);
  if (error) throw_system_error("listen on " + where + ": not an IP address", EINVAL);
  const tcp::endpoint endpoint(address, port);
  tcp::acceptor& acceptor = state_->acceptor;
  if (acceptor.open(endpoint.protocol(), error); error) throw_for("socket for " + where, error);
  acceptor.set_option(asio::socket_base::reuse_address(true), error);
  if (acceptor.bind(endpoint, error); error) throw_for("bind " + where, error);
  if (acceptor.listen(asio::socket_base::max_listen_connections, error); error) {
    throw_for("listen " + where, error);
  }
  port_ = acceptor.local_endpoint().port();
  state_->accept();
  thread_ = std::thread([this] { state_->io.run(); });
}

std::string MetricsServer::authority() const {
  const bool v6 = host_.find(':') != std::string::npos;
  return (v6 ? "[" + host_ + "]" : host_) + ":" + std::to_string(port_);
}

std::string MetricsServer::url() const { return "http://" + authority() + "/metrics"; }

MetricsServer::~MetricsServer() {
  state_->io.stop();
  thread_.join();
}

// --- TextfileWriter ---

TextfileWriter::TextfileWriter(std::string path, std::chrono::milliseconds period, Render render,
                               ExpositionFailed failed)
    : path_(std::move(path)),
      period_(period),
      render_(std::move(render)),
      failed_(std::move(failed)) {
  write();  // a path that cannot be written refuses the start
  thread_ = std::thread([this] { run(); });
}

TextfileWriter::~TextfileWriter() {
  {
    detail::MutexLock lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  thread_.join();
  ::unlink(path_.c_str());
}

void TextfileWriter::changed() {
  {
    detail::MutexLock lock(mutex_);
    changed_ = true;
  }
  wake_.notify_one();
}

void TextfileWriter::run() {
  detail::UniqueLock lock(mutex_);
  while (true) {
    wake_.wait_for(lock.native(), period_,
                   [this]() IBEV_REQUIRES(mutex_) { return changed_ || stopping_; });
    if (stopping_) return;
    changed_ = false;
    lock.unlock();
    try {
      write();
    } catch (const std::exception& e) {
      if (failed_) failed_(e.what());
    }
    lock.lock();
  }
}

// node_exporter reads *.prom: the temporary name ends otherwise.
void TextfileWriter::write() const {
  const std::string text = render_();
  const std::string temporary = path_ + ".tmp";
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_system_error("open " + temporary, errno);
  for (std::size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      ::unlink(temporary.c_str());
      throw_system_error("write " + temporary, error);
    }
    done += static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    throw_system_error("close " + temporary, error);
  }
  if (::rename(temporary.c_str(), path_.c_str()) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    throw_system_error("rename " + temporary + " to " + path_, error);
  }
}

}  // namespace ibev::watch
