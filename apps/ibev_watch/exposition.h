// Where ibev-watch's metrics go: an HTTP endpoint Prometheus scrapes
// (--metrics-listen) and a file node_exporter's textfile collector reads
// (--metrics-textfile). Both take the text from `render` (watch_metrics.h) when
// they need it, on a thread of their own, so a slow scraper or disk never
// holds up the Dispatcher.
//
// Errors: construction binds or writes once, and throws std::system_error
// naming the call and the address or path (an address in use, a folder that
// is not there), so ibev-watch can refuse to start. Later failures (a
// client gone mid-answer, a full disk) go to `failed` with their text, and
// serving goes on.
//
// Lifetime: the destructor stops the thread and joins it; `render` and
// `failed` are not called after it returns.
#ifndef IBEV_APPS_IBEV_WATCH_EXPOSITION_H_
#define IBEV_APPS_IBEV_WATCH_EXPOSITION_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include <ibev/core/thread_annotations.h>

namespace ibev::watch {

using Render = std::function<std::string()>;
using ExpositionFailed = std::function<void(const std::string& what)>;

// Serves GET /metrics (HTTP/1.1, Boost.Beast); any other path is 404, any
// other method 405, a request that is not HTTP 400. `host` is an IPv4 or
// IPv6 literal. At most kMaxClients connections at once (a newer one is
// closed at once), so idle clients cannot use up the process's fds, which a
// re-added device needs; an accept that fails waits a second before the next.
// A client that errs or goes away is its own business: `failed` hears only
// what fails here (rendering, accepting).
class MetricsServer {
 public:
  static constexpr int kMaxClients = 64;

  MetricsServer(const std::string& host, std::uint16_t port, Render render,
                ExpositionFailed failed);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The port bound (the one asked for, or the kernel's choice for 0).
  std::uint16_t port() const noexcept { return port_; }
  // "http://HOST:PORT/metrics", an IPv6 host in brackets.
  std::string url() const;

  struct State;  // exposition.cc: Asio's io_context and acceptor

 private:
  std::string authority() const;  // HOST:PORT, [HOST]:PORT for IPv6

  std::unique_ptr<State> state_;
  std::string host_;
  std::uint16_t port_ = 0;
  std::thread thread_;
};

// Writes the text to `path` atomically (a temporary file beside it, then
// rename(2)), so the collector never reads half a file: when changed() was
// called since the last write, and at least every `period`. The destructor
// removes the file: metrics that stop being true must not stay behind (a
// crash leaves it; node_textfile_mtime_seconds shows its age).
class TextfileWriter {
 public:
  TextfileWriter(std::string path, std::chrono::milliseconds period, Render render,
                 ExpositionFailed failed);
  ~TextfileWriter();
  TextfileWriter(const TextfileWriter&) = delete;
  TextfileWriter& operator=(const TextfileWriter&) = delete;

  // Any thread; never waits for a write.
  void changed() IBEV_EXCLUDES(mutex_);

 private:
  void write() const;  // throws std::system_error
  void run() IBEV_EXCLUDES(mutex_);

  const std::string path_;
  const std::chrono::milliseconds period_;
  const Render render_;
  const ExpositionFailed failed_;
  detail::Mutex mutex_;
  std::condition_variable wake_;
  bool changed_ IBEV_GUARDED_BY(mutex_) = false;
  bool stopping_ IBEV_GUARDED_BY(mutex_) = false;
  std::thread thread_;
};

}  // namespace ibev::watch

#endif  // IBEV_APPS_IBEV_WATCH_EXPOSITION_H_
