// ibev::ConnectionHealth: one health signal for an RC connection (a QP with
// its peer), given its handler at creation as every ibev handler is. The
// states, causes and transitions are core/health.h's: the application hears
// one transition per change (up, down, recovering, failed), each with the
// cause that made it, never one call per cause.
//
// What it hears by itself, beside the QP's own handler: the QP's async events
// (QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR, PATH_MIG_ERR; by address and by QP
// number, as QueuePair's handler hears them), PORT_ERR on its port, and
// DEVICE_FATAL. What it is told: completion() takes each completion the
// application polls from the QP's CQs (a non-flush error is a cause; a
// success or a flush is not), cause() any cause the application knows (a CM
// event, a timeout of its own). recovering(), up() and fail() are the
// application's (or its recovery's) moves; nothing brings a connection up by
// itself, not even PORT_ACTIVE: a QP in ERR carries nothing until it is
// reset or replaced. Once the QP is closed, nothing of it is a cause (its
// address and number may be a newer QP's).
//
// Keepalive (Options::keepalive): while the connection is up, every interval
// a zero-length RDMA write (no memory, no receive consumed at the peer),
// signaled, unless the last one is still out; its completion is taken by
// ibev (Dispatcher::take_completion: the CQ's handler never sees it). A
// probe still unanswered `misses` intervals after it was sent is a cause
// (kKeepalive, code 0), as is one that completes with an error (kKeepalive,
// code its ibv_wc_status): a peer whose process died, whose host went or
// whose cable was pulled is noticed while no traffic flows, without
// spinning (one periodic timer of the Dispatcher), within (misses + 1) x
// interval: the probe that finds it gone leaves at most an interval after.
// A probe out when the health closes, or comes up again, is still taken for
// interval x misses and 5 s more. A probe takes one send queue entry, so leave one free in the
// QP's capabilities; it is posted from the Dispatcher's thread (rdma-core's
// QPs take posts from several threads); the peer's QP needs
// IBV_ACCESS_REMOTE_WRITE (connect()'s default), and the send CQ a
// Dispatcher (not kPolled).
//
// Threads: every member may be called from any thread, and from inside the
// handler. The handler runs on the Dispatcher's thread, one call at a time,
// in the order of the transitions, with no lock held; with an Executor, its
// calls are handed over in that order (a strand keeps it).
//
// Lifetime: close() (or destruction) stops the handler with the wait rule of
// core/handle.h (waiting for a running call unless it is that call's own
// thread); after it nothing is heard or told. Holds the QP; the Dispatcher
// must outlive it, as every ibev object's.
#ifndef IBEV_VERBS_CONNECTION_HEALTH_H_
#define IBEV_VERBS_CONNECTION_HEALTH_H_

#include <infiniband/verbs.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include <ibev/core/executor.h>
#include <ibev/core/handle.h>
#include <ibev/core/health.h>
#include <ibev/verbs/queue_pair.h>

namespace ibev {

namespace detail {
struct HealthShared;  // connection_health.cc
}  // namespace detail

using HealthHandler = std::function<void(const HealthChange& change)>;

// The keepalive's probes: posted, and answered (succeeded or failed) in time.
struct KeepaliveStats {
  std::uint64_t sent = 0;
  std::uint64_t answered = 0;
};

class ConnectionHealth {
 public:
  struct Options {
    // The port whose PORT_ERR is a cause. Unset: the QP's own (past RESET;
    // port 1 for a QP still in RESET).
    std::optional<std::uint8_t> port;
    // kDown for a connection not yet made, to be brought up by up().
    ConnectionState initial = ConnectionState::kUp;
    Executor executor;  // where the handler runs; empty: the dispatching thread
    struct Keepalive {
      std::chrono::milliseconds interval{0};  // 0: no keepalive
      unsigned misses = 3;
    } keepalive;
  };

  // Throws std::invalid_argument (null or closed QP, not RC, empty handler,
  // port 0 or beyond the device's ports; a keepalive with a negative
  // interval, no misses, or a kPolled send CQ) or std::system_error (the
  // keepalive's timer).
  static std::shared_ptr<ConnectionHealth> create(std::shared_ptr<QueuePair> qp,
                                                  HealthHandler on_change, Options options);
  static std::shared_ptr<ConnectionHealth> create(std::shared_ptr<QueuePair> qp,
                                                  HealthHandler on_change) {
    return create(std::move(qp), std::move(on_change), Options{});
  }
  ~ConnectionHealth();
  ConnectionHealth(const ConnectionHealth&) = delete;
  ConnectionHealth& operator=(const ConnectionHealth&) = delete;

  ConnectionState state() const;
  // The causes heard since the connection was last up, first first
  // (HealthState::kMaxCauses of them at most).
  std::vector<HealthCause> causes() const;
  KeepaliveStats keepalive_stats() const;
  const std::shared_ptr<QueuePair>& queue_pair() const noexcept { return qp_; }

  // A completion polled from one of the QP's CQs (for another QP: ignored).
  void completion(const ibv_wc& wc);
  void cause(HealthCause cause);
  void recovering();
  void up();
  void fail(HealthCause cause);

  void close() noexcept;

 private:
  struct Token {};

 public:
  ConnectionHealth(Token, std::shared_ptr<QueuePair> qp,
                   std::shared_ptr<detail::HealthShared> shared);

 private:
  const std::shared_ptr<QueuePair> qp_;
  const std::shared_ptr<detail::HealthShared> shared_;
  std::mutex close_mutex_;     // around taking the handles below
  std::vector<Handle> heard_;  // the QP's, port's and device's events; the keepalive's timer
  Handle told_;                // the application's handler
};

}  // namespace ibev

#endif  // IBEV_VERBS_CONNECTION_HEALTH_H_
