// The inside of a ConnectionHealth (verbs/connection_health.h), internal.
// One object, one mutex, in rooms by job, each defined in its own file:
//   - the core (this header, connection_health.cc): the HealthState, the
//     recovery ladder whose step is the one staleness token, and
//     cause_locked(), the one way every part reports a cause;
//   - the connection (connection_health.cc): the QP it runs on and the
//     listeners of its events, which are causes;
//   - liveness (liveness.cc): the keepalive and the work-request deadlines,
//     causes the connection hears about its peer;
//   - recovery (recovery_steps.cc): carries out what health/recovery.h's
//     ladder decides, and nothing else.
//
// Locking: `mutex` is a leaf but for Dispatcher::post, which takes the
// reactor's task lock (a leaf) and never calls back, and ibv_post_send in
// post_tracked() (rdma-core's QP lock, which calls nothing back). No
// handler runs under it, no other verb is called and no handle released or
// timer made under it.
#ifndef IBEV_VERBS_HEALTH_CORE_H_
#define IBEV_VERBS_HEALTH_CORE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <ibev/core/failure.h>
#include <ibev/core/process.h>
#include <ibev/core/route.h>
#include <ibev/core/thread_annotations.h>
#include <ibev/health/health.h>
#include <ibev/health/recovery.h>
#include <ibev/verbs/connection_health.h>

namespace ibev {
namespace detail {

using Clock = std::chrono::steady_clock;
using Mode = ConnectionHealth::Options::Recovery::Mode;
using HealthSubscriber = Subscriber<HealthChange>;
using ReconnectSubscriber = Subscriber<RecoveryAttempt>;

struct HealthCore;

// A recovery attempt, shared by the RecoveryAttempt copies the application
// holds; the last to go settles it ("abandoned") unless connect(),
// replace() or fail() did (recovery_steps.cc).
struct Attempt {
  ~Attempt();
  // Marks it settled; throws EALREADY naming `verb` if it was.
  void settle(const char* verb);
  // Settles it for `verb` (connect, replace): the health, still on this
  // attempt; throws EALREADY, or ECANCELED once the recovery moved on.
  std::shared_ptr<HealthCore> begin(const char* verb);

  std::weak_ptr<HealthCore> health;
  std::shared_ptr<QueuePair> qp;
  std::uint64_t step = 0;  // the ladder's when it was made
  unsigned number = 0;
  HealthCause cause;
  std::vector<std::uint64_t> undelivered;
  RcEndpoint local;
  std::atomic<bool> settled{false};
};

// A keepalive probe posted and not yet answered. Its wr_id is the address
// of its tag, which no work request of the application's can carry (as a
// drain's marker is its Drain's address) and no other probe has while the
// tag lives: a probe given up on keeps its tag until its grace ends.
struct Probe {
  std::shared_ptr<const char> tag = std::make_shared<const char>('\0');
  std::uint64_t wr_id() const { return reinterpret_cast<std::uint64_t>(tag.get()); }
  Handle taken;  // its completion, taken from the send CQ
};

// A request posted through post_tracked(), until its completion.
struct Posted {
  std::uint64_t wr_id;
  bool signaled;
  Clock::time_point at;
};

// What a connection's QP is, once found fit: its port and its signaling.
struct QpFacts {
  std::uint8_t port;
  bool signal_all;
};

// Throws std::invalid_argument naming `verb` for a QP the connection cannot
// run on (`port`: the one given, or unset for the QP's own).
QpFacts check_qp(const std::string& verb, const std::shared_ptr<QueuePair>& qp,
                 std::optional<std::uint8_t> port, const Dispatcher& dispatcher, bool keepalive,
                 bool recovery);

// The core: one mutex, the state, the ladder whose step is the one
// staleness token, the handler, and the connection's QP with the listeners
// of its events (connection_health.cc).
struct HealthCore : std::enable_shared_from_this<HealthCore> {
  // The keepalive and the work-request deadlines (liveness.cc): causes the
  // connection hears about its peer. Its state is under the core's mutex.
  class Liveness {
   public:
    Liveness(HealthCore& core, const ConnectionHealth::Options& options)
        : keepalive(options.keepalive), deadline(options.deadline), core_(core) {}

    // Every interval, on the Dispatcher's thread: a probe, or a cause.
    void tick() IBEV_EXCLUDES(core_.mutex);
    // Every quarter deadline, on the Dispatcher's thread.
    void check_deadline() IBEV_EXCLUDES(core_.mutex);
    // ConnectionHealth::completion and post_send.
    void completion(const ibv_wc& wc) IBEV_EXCLUDES(core_.mutex);
    void post_tracked(ibv_send_wr& wr, ibv_send_wr** bad_wr) IBEV_EXCLUDES(core_.mutex);
    // The connection came up, or the health stops: a probe out is given up
    // on.
    void let_go_of_probe() noexcept IBEV_EXCLUDES(core_.mutex);

    // Called by the core under its lock, which each asserts: the analysis
    // cannot see that a part's core_ is the core that calls it.
    // Up, so the peer counts as heard now.
    void restart_clock() {
      core_.mutex.assert_held();
      heard_from_ = Clock::now();
    }
    // Up or failed: what was out is the old connection's.
    void forget_requests();
    // What an attempt lists as undelivered (those still posted join the
    // list: an attempt that fails has not delivered them).
    std::vector<std::uint64_t> undelivered_now();
    KeepaliveStats stats() const {
      core_.mutex.assert_held();
      return stats_;
    }

    const ConnectionHealth::Options::Keepalive keepalive;
    const std::chrono::milliseconds deadline;

   private:
    void send_probe(Clock::time_point now, const std::shared_ptr<QueuePair>& connection)
        IBEV_EXCLUDES(core_.mutex);
    void answered(std::uint64_t wr_id, const ibv_wc& wc) IBEV_EXCLUDES(core_.mutex);
    void give_up(std::optional<Probe> out) noexcept IBEV_EXCLUDES(core_.mutex);
    void retire(const ibv_wc& wc) IBEV_REQUIRES(core_.mutex);
    void note_undelivered(std::uint64_t wr_id) IBEV_REQUIRES(core_.mutex);

    // How many undelivered wr_ids an attempt lists at most (a send queue's
    // depth is far below it).
    static constexpr std::size_t kMaxUndelivered = 1 << 16;
    // How long past its misses a probe out when the health closes is still
    // taken (a drain's marker timeout).
    static constexpr std::chrono::milliseconds kProbeGrace{5000};

    HealthCore& core_;
    std::optional<Probe> probe_ IBEV_GUARDED_BY(core_.mutex);  // out, not yet answered
    // The peer last heard: a probe answered, or the connection up.
    Clock::time_point heard_from_ IBEV_GUARDED_BY(core_.mutex) = Clock::now();
    KeepaliveStats stats_ IBEV_GUARDED_BY(core_.mutex);
    std::atomic<bool> tracking_{false};  // post_tracked() was used: completions are looked at
    std::deque<Posted> posted_ IBEV_GUARDED_BY(core_.mutex);
    // Since the connection was last up.
    std::vector<std::uint64_t> undelivered_ IBEV_GUARDED_BY(core_.mutex);
  };

  // Recovery's steps (recovery_steps.cc): what the core's ladder decides,
  // carried out. Its timers are under the core's mutex.
  class RecoverySteps {
   public:
    RecoverySteps(HealthCore& core, ConnectionHealth::Options& options);

    // Supervise the down of `at` on the Dispatcher's thread. Called by the
    // core under its lock, which it asserts.
    void post_supervise(std::uint64_t at, RecoveryInput::Kind kind);
    // What happened, told to the ladder, and the action it answers carried
    // out; `why` names the way back for an abort.
    void climb(const RecoveryInput& input, const std::string& why = {}) IBEV_EXCLUDES(core_.mutex);
    // An attempt failed (`why`): a cause; before recovering, the next rung.
    void attempt_failed(std::uint64_t at, const std::string& why, int code)
        IBEV_EXCLUDES(core_.mutex);
    // The attempt of `at` connected in place, or brought `next`: up.
    bool recovered(std::uint64_t at) IBEV_EXCLUDES(core_.mutex);
    bool replaced(std::uint64_t at, std::shared_ptr<QueuePair> next, std::uint8_t on_port,
                  bool signals_all) IBEV_EXCLUDES(core_.mutex);
    // The step `at` still current.
    bool still(std::uint64_t at) IBEV_EXCLUDES(core_.mutex);
    // No step after this; the timers released.
    void stop() noexcept IBEV_EXCLUDES(core_.mutex);

    const Mode mode;
    const ConnectOptions connect_options;
    std::shared_ptr<ReconnectSubscriber> reconnecter;  // null: no recovery

   private:
    void supervise(std::uint64_t at, RecoveryInput::Kind kind) IBEV_EXCLUDES(core_.mutex);
    template <typename Task>
    void arm(Handle RecoverySteps::*slot, std::chrono::milliseconds delay, std::uint64_t at,
             Task task) IBEV_EXCLUDES(core_.mutex);
    void drain(std::uint64_t at) IBEV_EXCLUDES(core_.mutex);
    void reconnect(std::uint64_t at) IBEV_EXCLUDES(core_.mutex);

    HealthCore& core_;
    Handle retry_timer_ IBEV_GUARDED_BY(core_.mutex);
    Handle give_up_timer_ IBEV_GUARDED_BY(core_.mutex);
  };

  HealthCore(Dispatcher& events, HealthHandler handler, ConnectionHealth::Options& options);

  // Debug builds: the caller runs on the Dispatcher's thread (a timer's or
  // a posted task's, a listener's); core/thread_annotations.h.
  void assert_dispatching() const noexcept;
  // Every part's cause goes here. Whether it changed the state (a
  // connection down already keeps the cause, and stays).
  bool cause_locked(HealthCause cause) IBEV_REQUIRES(mutex);
  // A change, if any: told, in order; the ladder steps on (what was
  // scheduled is stale), liveness forgets the old connection's requests,
  // and a down is supervised. An up `by_attempt` is a recovery.
  void changed(std::optional<HealthChange> change, bool by_attempt = false) IBEV_REQUIRES(mutex);
  // Up, the keepalive's clock restarted with it.
  std::optional<HealthChange> went_up() IBEV_REQUIRES(mutex);
  // Failed for good, with the record that says why (reported by the
  // caller, after the lock).
  Failure fail_for_good(const std::string& why) IBEV_REQUIRES(mutex);
  // The step `at` still current (nothing moved on since, not closed).
  bool current(std::uint64_t at) const IBEV_REQUIRES(mutex) {
    return ladder && ladder->current(at);
  }
  // Once the QP is closed, its address and number may be a newer QP's:
  // what names them is not this connection's news.
  bool qp_open() const IBEV_REQUIRES(mutex) { return qp && qp->get() != nullptr; }
  std::shared_ptr<QueuePair> current_qp() IBEV_EXCLUDES(mutex);

  // The listeners of `connection`'s events (its QP's, by address and by
  // number; its port's; its device's), made without the lock.
  std::vector<Handle> wire(const std::shared_ptr<QueuePair>& connection, std::uint8_t on_port)
      IBEV_EXCLUDES(mutex);
  // `connection` is the one from now on, with `heard` its listeners; the
  // old ones are returned, to be released after the lock.
  std::vector<Handle> run_on(std::shared_ptr<QueuePair> connection, std::uint8_t on_port,
                             bool signals_all, std::vector<Handle> heard) IBEV_REQUIRES(mutex);
  // No tick and no recovery step after this.
  void stop() noexcept IBEV_EXCLUDES(mutex);

  const std::weak_ptr<Dispatcher> dispatcher;
  const std::shared_ptr<Registry> registry;
  const OwningProcess process;
  const std::shared_ptr<HealthSubscriber> subscriber;

  Mutex mutex;
  HealthState health IBEV_GUARDED_BY(mutex);
  // With recovery: its step is the staleness token.
  std::optional<RecoveryLadder> ladder IBEV_GUARDED_BY(mutex);
  bool stopped IBEV_GUARDED_BY(mutex) = false;
  // The connection's; qp_num is read without the lock too (completion()'s
  // first test).
  std::shared_ptr<QueuePair> qp IBEV_GUARDED_BY(mutex);  // null before a kReconnect's first
  // A replace's, while it is wired in.
  std::shared_ptr<QueuePair> incoming IBEV_GUARDED_BY(mutex);
  std::atomic<std::uint32_t> qp_num{0};
  std::uint8_t port IBEV_GUARDED_BY(mutex) = 1;
  bool signal_all IBEV_GUARDED_BY(mutex) = false;   // the QP signals every request (sq_sig_all)
  bool device_gone IBEV_GUARDED_BY(mutex) = false;  // its device raised DEVICE_FATAL
  std::vector<Handle> listeners IBEV_GUARDED_BY(mutex);  // its events'

  Liveness liveness;
  RecoverySteps recovery;

 private:
  void tell(HealthChange change) IBEV_REQUIRES(mutex);
  // An event of `heard_qp`, which counts while it is the connection's QP
  // (or the one a replace is wiring in).
  void hear(const Event& event, const std::weak_ptr<QueuePair>& heard_qp) IBEV_EXCLUDES(mutex);
};

}  // namespace detail
}  // namespace ibev

#endif  // IBEV_VERBS_HEALTH_CORE_H_
