// ibev::ConnectionHealth: one health signal for an RC connection (a QP with
// its peer), given its handler at creation as every ibev handler is. The
// states, causes and transitions are health/health.h's: the application hears
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
// probe unanswered when `misses` intervals have passed since the peer was
// last heard (its last probe answered, or the connection up) is a cause
// (kKeepalive, code 0), as is one that completes with an error (kKeepalive,
// code its ibv_wc_status): a peer whose process died, whose host went or
// whose cable was pulled is noticed while no traffic flows, without
// spinning (the Dispatcher's periodic timer, shared by every keepalive of
// that interval), within interval x misses of its last answer (and so of
// its end; with misses 1, two intervals: a probe is judged at the tick
// after the one that posted it), give or take half an interval of timer
// slack; never before (misses - 1) x interval. A probe that leaves late
// still has misses - 1 intervals to be answered.
// A probe out when the health closes, or comes up again, is still taken for
// interval x misses and 5 s more. A probe takes one send queue entry, so leave one free in the
// QP's capabilities; it is posted from the Dispatcher's thread (rdma-core's
// QPs take posts from several threads); the peer's QP needs
// IBV_ACCESS_REMOTE_WRITE (connect()'s default), and the send CQ a
// Dispatcher (not kPolled).
//
// Deadlines (Options::deadline): work requests posted through post_send()
// are tracked until completion() hears theirs (a completion retires those
// posted before it too, as a send queue completes in order); a signaled one
// still outstanding `deadline` after its post is a cause (kDeadline, its
// wr_id): a request hung behind a peer that stopped answering, with retry
// counts that would take minutes, is noticed in about deadline x 1.25 (the
// check runs every quarter deadline). Receives are told apart by opcode
// when they succeed; a receive that fails carries no opcode, so keep its
// wr_ids apart from the tracked sends' (most code's wr_ids are addresses).
//
// Recovery (Options::recovery, given a reconnect callback): reset in place,
// supervised. When the connection goes down, ibev waits (backoff with
// jitter, health/recovery.h; while its port is down, until PORT_ACTIVE), then
// drains the QP (QueuePair::drain: every request posted before has
// completed, flushed or not, and the CQ's handler has had it; causes heard
// until now are the old connection's), resets it with a fresh PSN, moves the
// state to recovering and calls `reconnect` with a RecoveryAttempt: the
// application tells its peer attempt.local(), learns the peer's endpoint
// (the peer resets its QP too), re-posts its receives (ibev never guesses
// them) and calls attempt.connect(), which brings the connection up. An
// attempt that fails (connect throws, fail(), abandoned, a cause while
// recovering) is followed by the next, farther apart; an outage that lasts
// give_up_after, or a down after max_recoveries recoveries within the
// damping window, fails the connection for good, with one Failure
// (kConnectionFailed) saying why. In place, a DEVICE_FATAL fails it at
// once: a QP is not reset on a device that is gone. With Mode::kReconnect
// the QP is replaced instead of reset: the attempt (drained first, unless
// the device is gone or the drain cannot be made: then nothing posted was
// delivered) hands the old QP over, and the application (or
// cm/cm_session.h) brings a new one, on whatever device now reaches
// the peer, with attempt.replace(); a DEVICE_FATAL is then one more cause,
// and while the old QP's port is down, attempts go on every max_delay,
// for the peer may be reached another way; PORT_ACTIVE fails an attempt
// in progress (made into a dead link) and starts the next at once.
// Requests posted through post_send() that
// were not delivered (their own completion an error or a flush, or none by
// the end of the drain) are listed in the attempt, in posting order, to be
// sent again by the application if it wants them: ibev resends nothing.
// Where ibev differs from NVMe-oF's host (reconnect_delay, ctrl_loss_tmo):
// the delay grows and is jittered rather than fixed, and the window bounds
// a fault that recurs on every reconnect, which a fixed delay retries for
// ever.
//
// Threads: every member may be called from any thread, and from inside the
// handler. The handler runs on the Dispatcher's thread, one call at a time,
// in the order of the transitions, with no lock held; with an Executor, its
// calls are handed over in that order (a strand keeps it).
//
// Lifetime: close() (or destruction) stops the handler with the wait rule of
// core/handle.h (waiting for a running call unless it is that call's own
// thread), and the reconnect callback likewise; after it nothing is heard or
// told, and an attempt still held connects nothing (ECANCELED). Holds the
// QP (the latest) until close(); the Dispatcher must outlive it, as every
// ibev object's.
#ifndef IBEV_VERBS_CONNECTION_HEALTH_H_
#define IBEV_VERBS_CONNECTION_HEALTH_H_

#include <infiniband/verbs.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <ibev/core/executor.h>
#include <ibev/core/handle.h>
#include <ibev/core/thread_annotations.h>
#include <ibev/health/health.h>
#include <ibev/health/recovery.h>
#include <ibev/verbs/queue_pair.h>
#include <ibev/verbs/rc_endpoint.h>

namespace ibev {

namespace detail {
struct HealthCore;  // health_core.h
struct Attempt;
}  // namespace detail

using HealthHandler = std::function<void(const HealthChange& change)>;

// One attempt to bring a connection back (ConnectionHealth's recovery): in
// place, its QP drained and in RESET with a fresh PSN, waiting for the
// application to connect it to its peer again (connect()); with
// Mode::kReconnect, the old QP drained, waiting for a new one (replace()).
// Copies share the attempt; when the last goes with none of connect(),
// replace() or fail() called, the attempt failed ("abandoned"), and the next
// is scheduled. Any thread.
class RecoveryAttempt {
 public:
  explicit RecoveryAttempt(std::shared_ptr<detail::Attempt> attempt) noexcept
      : attempt_(std::move(attempt)) {}

  // 1 for an outage's first attempt.
  unsigned number() const noexcept;
  // The recovery's step this attempt was made at (health/recovery.h): a later
  // attempt of the same connection has a larger one.
  std::uint64_t step() const noexcept;
  // What the outage began with.
  const HealthCause& cause() const noexcept;
  // The wr_ids posted through ConnectionHealth::post_send() and not
  // delivered since the connection was last up (an earlier attempt of the
  // outage that failed listed them too), in posting order: theirs to send
  // again, or not, once this attempt is up. Only what was posted: a list
  // an earlier outage's attempt gave, which the application had not posted
  // again when this outage began (its up handler ran after the connection
  // went down again), is not on it, and stays the application's to send.
  const std::vector<std::uint64_t>& undelivered() const noexcept;
  // This QP as its peer must now see it (Recovery::connect's port and GID
  // index, the new PSN): what the application tells the peer. In place
  // only (empty with Mode::kReconnect).
  const RcEndpoint& local() const noexcept;
  // In place: the QP, in RESET: to_init() and post_recv() go here before
  // connect(). With Mode::kReconnect: the QP being replaced, drained (null
  // for a connection's first attempt): the application lets it go.
  const std::shared_ptr<QueuePair>& queue_pair() const noexcept;

  // RESET or INIT -> RTS against `remote` with Recovery::connect: the
  // connection is up. Throws what QueuePair::connect throws (the attempt
  // failed; the next is scheduled), std::system_error ECANCELED (the
  // recovery ended meanwhile: failed, given up, closed) or EALREADY (this
  // attempt was settled already).
  void connect(const RcEndpoint& remote) const;
  // The attempt failed, `why` (the peer did not answer, say): the next is
  // scheduled. Throws std::system_error EALREADY as connect() does.
  void fail(const std::string& why) const;
  // Not settled, and the recovery still on it (no cause since, not closed).
  bool current() const;
  // Mode::kReconnect: the connection is up again on `qp`, a new RC QP in
  // RTS and connected (through the CM, say), on the same Dispatcher; from
  // now on its events, port and completions are the connection's, and the
  // QP before it is not (the health lets go of it). Throws
  // std::invalid_argument (in place; a null, closed or non-RC QP, or one
  // the keepalive or recovery cannot use, as create() says), then
  // ECANCELED or EALREADY as connect() does; any throw fails the attempt.
  void replace(std::shared_ptr<QueuePair> qp) const;

 private:
  std::shared_ptr<detail::Attempt> attempt_;
};

// The keepalive's probes: posted, and answered (succeeded or failed) in time.
struct KeepaliveStats {
  std::uint64_t sent = 0;
  std::uint64_t answered = 0;
};

class ConnectionHealth {
 public:
  struct Options {
    // The port whose PORT_ERR is a cause. Unset: the QP's own (past RESET;
    // port 1 for a QP still in RESET). A QP a recovery brings in
    // (replace()) is heard on its own port.
    std::optional<std::uint8_t> port;
    // kDown for a connection not yet made, to be brought up by up().
    ConnectionState initial = ConnectionState::kUp;
    Executor executor;  // where the handler runs; empty: the dispatching thread
    struct Keepalive {
      std::chrono::milliseconds interval{0};  // 0: no keepalive
      unsigned misses = 3;
    } keepalive;
    // A signaled request posted through post_send() without its completion
    // this long is a cause. 0: none.
    std::chrono::milliseconds deadline{0};
    struct Recovery {
      // kResetInPlace: an attempt resets the QP and the application
      // connects it again (RecoveryAttempt::connect). kReconnect: the QP
      // is not kept (its peer is gone, its device removed): an attempt
      // brings a new one, connected (RecoveryAttempt::replace), as a
      // connection through the CM does (cm/cm_session.h).
      using Mode = RecoveryLadder::Mode;
      Mode mode = Mode::kResetInPlace;
      RecoveryPolicy policy;
      // What an attempt connects with in place; its port and GID index
      // make local().
      ConnectOptions connect;
      // Called once per attempt, on the handler's thread (or Executor),
      // after the handler has heard the change to recovering. Empty: no
      // recovery; the application moves the state itself.
      std::function<void(const RecoveryAttempt& attempt)> reconnect;
    } recovery;
  };

  // Throws std::invalid_argument (null or closed QP, not RC, empty handler,
  // port 0 or beyond the device's ports; a keepalive with a negative
  // interval, no misses, or a kPolled send CQ; a negative deadline; a
  // recovery whose policy RecoveryPolicy::validate refuses, or whose QP has
  // a kPolled CQ: the drain is the Dispatcher's) or std::system_error (the
  // timers, ibv_query_qp, ibv_query_port).
  static std::shared_ptr<ConnectionHealth> create(std::shared_ptr<QueuePair> qp,
                                                  HealthHandler on_change, Options options);
  static std::shared_ptr<ConnectionHealth> create(std::shared_ptr<QueuePair> qp,
                                                  HealthHandler on_change) {
    return create(std::move(qp), std::move(on_change), Options{});
  }
  // A connection not made yet, made by its recovery (Mode::kReconnect, with
  // a reconnect callback; initial kDown): the first attempt starts at once
  // and brings the first QP (RecoveryAttempt::replace), with the backoff,
  // damping and give_up_after of any outage. Throws as above, and
  // std::invalid_argument without that recovery or with an initial kUp.
  static std::shared_ptr<ConnectionHealth> create(Dispatcher& dispatcher, HealthHandler on_change,
                                                  Options options);
  // What create() refuses of `options` whatever the QP (a keepalive, a
  // deadline, a recovery policy): std::invalid_argument naming `verb`.
  static void validate(const std::string& verb, const Options& options);
  ~ConnectionHealth();
  ConnectionHealth(const ConnectionHealth&) = delete;
  ConnectionHealth& operator=(const ConnectionHealth&) = delete;

  ConnectionState state() const;
  // The causes heard since the connection was last up, first first
  // (HealthState::kMaxCauses of them at most).
  std::vector<HealthCause> causes() const;
  KeepaliveStats keepalive_stats() const;
  // The QP the connection runs on (with Mode::kReconnect, the latest an
  // attempt brought; null before the first).
  std::shared_ptr<QueuePair> queue_pair() const;

  // A completion polled from one of the QP's CQs (for another QP: ignored).
  // With deadlines or recovery, give it every one, flushes too.
  void completion(const ibv_wc& wc);
  // QueuePair::post_send, each request tracked for its deadline and, if it
  // is not delivered, for a recovery attempt's undelivered(). Throws what
  // post_send throws (the requests from `bad_wr` on are not tracked), and
  // std::system_error ENOTCONN with recovery while the connection is not
  // up (nothing posted: send it once up) or with no QP yet.
  void post_send(ibv_send_wr& wr, ibv_send_wr** bad_wr = nullptr);
  void cause(HealthCause cause);
  // With recovery: the way to the peer is back (a reconnecting peer's
  // request, a route): an attempt waited for starts now, and one in
  // progress fails (a cause), the next starting at once. PORT_ACTIVE does
  // this by itself with Mode::kReconnect.
  void retry_now();
  void recovering();
  void up();
  void fail(HealthCause cause);

  void close() noexcept;

 private:
  struct Token {};

 public:
  explicit ConnectionHealth(Token, std::shared_ptr<detail::HealthCore> shared);

 private:
  // A forked child's close(): its handles are inert, and the parent's
  // threads may have left close_mutex_ held at the fork: not taken.
  void release_inherited() noexcept IBEV_NO_THREAD_SAFETY_ANALYSIS;
  static std::shared_ptr<ConnectionHealth> make(Dispatcher& dispatcher,
                                                std::shared_ptr<QueuePair> qp,
                                                HealthHandler on_change, Options options);

  const std::shared_ptr<detail::HealthCore> shared_;  // holds the QP
  detail::Mutex close_mutex_;
  // The reconnect callback; the keepalive's and deadlines' timers.
  std::vector<Handle> heard_ IBEV_GUARDED_BY(close_mutex_);
  Handle told_ IBEV_GUARDED_BY(close_mutex_);  // the application's handler
};

}  // namespace ibev

#endif  // IBEV_VERBS_CONNECTION_HEALTH_H_
