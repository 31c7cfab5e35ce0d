// A cause's path, top-down: heard (an event's listener, a keepalive tick or
// probe, or a call of the application), moved through the HealthState under
// the lock, and a change, when there is one, posted to the Dispatcher under
// that same lock, so the handler hears the changes in the order they were
// made; the posted task is the routing primitive's guarded call
// (core/route.h). Then the keepalive: a tick per interval on the
// Dispatcher's timer, a probe and its taken completion. Then deadlines: the
// requests posted through post_send(), retired by their completions. Then
// recovery: a down change posts a step; the steps run on the Dispatcher's
// thread (supervise: wait or give up; attempt: drain; drained: reset,
// recovering, the application's reconnect), and the application's
// RecoveryAttempt::connect (any thread) brings the connection up. Every
// step carries the `step` it was made for; any change since makes it stale,
// and a stale step does nothing.
//
// Locking: HealthShared::mutex is a leaf but for Dispatcher::post, which
// takes the reactor's task lock (a leaf) and never calls back, and
// ibv_post_send in post_send() (rdma-core's QP lock, which calls nothing
// back). No handler runs under it, no other verb is called and no handle
// released or timer made under it.
#include <ibev/verbs/connection_health.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <deque>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

#include <ibev/core/process.h>
#include <ibev/core/route.h>
#include <ibev/dispatch/dispatcher.h>
#include <ibev/verbs/device.h>

namespace ibev {
namespace detail {

using HealthSubscriber = Subscriber<HealthChange>;
using ReconnectSubscriber = Subscriber<RecoveryAttempt>;
using Clock = std::chrono::steady_clock;

// A recovery attempt, shared by the RecoveryAttempt copies the application
// holds; the last to go settles it ("abandoned") unless connect() or fail()
// did.
struct Attempt {
  ~Attempt();
  // Marks it settled; throws EALREADY naming `verb` if it was.
  void settle(const char* verb);

  std::weak_ptr<HealthShared> health;
  std::shared_ptr<QueuePair> qp;
  std::uint64_t step = 0;  // HealthShared::step when it was made
  unsigned number = 0;
  HealthCause cause;
  std::vector<std::uint64_t> undelivered;
  RcEndpoint local;
  std::atomic<bool> settled{false};
};

// How long past its misses a probe out when the health closes is still
// taken (a drain's marker timeout).
constexpr std::chrono::milliseconds kProbeGrace{5000};

struct HealthShared : std::enable_shared_from_this<HealthShared> {
  HealthShared(Dispatcher& dispatcher, const std::shared_ptr<QueuePair>& qp,
               HealthHandler handler, ConnectionHealth::Options& options, bool signal_all)
      : dispatcher(dispatcher.weak_ref()),
        registry(dispatcher.shared_registry()),
        qp(qp),
        qp_num(qp->qp_num()),
        keepalive(options.keepalive),
        deadline(options.deadline),
        signal_all(signal_all),
        connect_options(options.recovery.connect),
        port(*options.port),
        health(options.initial),
        subscriber(std::make_shared<HealthSubscriber>(std::move(handler), AnyArg{},
                                                      options.executor)) {
    if (options.recovery.reconnect) {
      schedule.emplace(options.recovery.policy, std::random_device{}());
      reconnecter = std::make_shared<ReconnectSubscriber>(std::move(options.recovery.reconnect),
                                                          AnyArg{}, options.executor);
    }
  }

  // One move of the state; its change, if any, told in order.
  template <typename Move>
  void apply(Move&& move) {
    std::lock_guard<std::mutex> lock(mutex);
    std::optional<HealthChange> change = move(health);
    if (change) changed(std::move(*change));
  }

  // Under the lock: a change is told, and with recovery steered: whatever
  // was scheduled before it is stale; a down begins an outage (from up) or
  // fails its attempt (from recovering), and the next step is posted.
  void changed(HealthChange change) {
    ++step;
    if (change.to == ConnectionState::kUp || change.to == ConnectionState::kFailed) {
      posted.clear();  // what was out before is the old connection's
      undelivered.clear();
      pending.reset();
      if (schedule) schedule->ended();  // an up the application made too
    }
    const bool went_down = change.to == ConnectionState::kDown;
    const bool new_outage = change.from == ConnectionState::kUp;
    tell(std::move(change));
    if (reconnecter && went_down) post_supervise(new_outage);
  }

  // Under the lock: the next recovery step, for the current `step`.
  void post_supervise(bool new_outage) {
    if (auto events = dispatcher.lock()) {
      events->post([weak = weak_from_this(), at = step, new_outage] {
        if (auto self = weak.lock()) self->supervise(at, new_outage);
      });
    }
  }

  void tell(HealthChange change) {
    auto events = dispatcher.lock();
    if (!events) return;  // the Dispatcher is gone: nothing runs handlers
    events->post([subscriber = subscriber, registry = registry, change = std::move(change)] {
      call(subscriber, change, "connection health handler",
           [registry](const Failure& failure, const HealthChange&) { registry->report(failure); });
    });
  }

  // Once the QP is closed, its address and number may be a newer QP's: what
  // names them is not this connection's news.
  bool qp_open() const {
    auto open = qp.lock();
    return open && open->get() != nullptr;
  }

  void hear(const Event& event) {
    if (!qp_open()) return;
    if (event.code() == IBV_EVENT_PORT_ACTIVE) {
      port_came_back();
      return;
    }
    auto cause = HealthCause::of_event(event.code());
    if (!cause) return;
    std::optional<Failure> failed;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (auto change = health.cause(std::move(*cause))) changed(std::move(*change));
      // A QP is reset in place on its own device only: whatever the state,
      // there is nothing left to attempt.
      if (event.code() == IBV_EVENT_DEVICE_FATAL && reconnecter && !stopped &&
          health.state() != ConnectionState::kFailed) {
        failed = fail_for_good("IBV_EVENT_DEVICE_FATAL: the device is gone, and a QP is reset "
                               "in place on its own device only");
      }
    }
    if (failed) registry->report(*failed);
  }

  // --- The keepalive ---

  // A probe posted and not yet answered. Its wr_id is the address of its
  // tag, which no work request of the application's can carry (as a
  // drain's marker is its Drain's address) and no other probe has while
  // the tag lives: a probe given up on keeps its tag until its grace ends.
  struct Probe {
    std::shared_ptr<const char> tag = std::make_shared<const char>('\0');
    std::uint64_t wr_id() const { return reinterpret_cast<std::uint64_t>(tag.get()); }
    std::chrono::steady_clock::time_point sent;
    Handle taken;  // its completion, taken from the send CQ
  };

  // Every interval, on the Dispatcher's thread: while up, a probe, unless
  // one is out; one out for `misses` intervals is a cause. Timed from its
  // post, not by ticks counted: a busy loop runs late ticks once.
  void tick() {
    if (!qp_open()) return;
    const auto now = std::chrono::steady_clock::now();
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (stopped || health.state() != ConnectionState::kUp) return;
      if (probe) {
        // Half an interval early still counts: ticks come a little late
        // or a little early, the probe was sent at one.
        if (now - probe->sent + keepalive.interval / 2 < keepalive.interval * keepalive.misses) {
          return;
        }
        if (auto change = health.cause(HealthCause{
                HealthSource::kKeepalive, 0, probe->wr_id(),
                "no keepalive answer in " +
                    std::to_string(keepalive.interval.count() * keepalive.misses) + " ms"})) {
          changed(std::move(*change));
        }
        return;  // down: no probe until up() again
      }
    }
    send_probe(now);
  }

  // A zero-length RDMA write, signaled; its completion is taken (answered).
  // What fails is reported; nothing is out then, and the next tick tries
  // again.
  void send_probe(std::chrono::steady_clock::time_point now) {
    Probe next;
    next.sent = now;
    auto connection = qp.lock();
    Dispatcher* cq_events = connection ? connection->send_cq()->served_by() : nullptr;
    if (cq_events == nullptr || connection->get() == nullptr) return;
    try {
      next.taken = cq_events->take_completion(
          connection->send_cq()->get(), qp_num, next.wr_id(),
          [weak = weak_from_this(), wr_id = next.wr_id()](const ibv_wc& wc) {
            if (auto self = weak.lock()) self->answered(wr_id, wc);
          });
      ibv_send_wr post{};
      post.wr_id = next.wr_id();
      post.opcode = IBV_WR_RDMA_WRITE;
      post.send_flags = IBV_SEND_SIGNALED;
      connection->post_send(post);
    } catch (const std::exception& e) {
      registry->report(Failure::verb_failed("ConnectionHealth keepalive", errno_of(e), e.what()));
      return;
    }
    std::lock_guard<std::mutex> lock(mutex);
    ++stats.sent;
    if (!stopped && !probe) probe = std::move(next);
  }  // a probe not kept (stopped meanwhile): its handle goes, the post is flushed or lost with the QP

  // The probe's completion (on the CQ's thread). A late one, of a probe
  // given up on, was only taken.
  void answered(std::uint64_t wr_id, const ibv_wc& wc) {
    std::optional<Probe> done;
    std::lock_guard<std::mutex> lock(mutex);
    if (!probe || probe->wr_id() != wr_id) return;
    ++stats.answered;
    done = std::move(probe);
    probe.reset();
    if (wc.status == IBV_WC_SUCCESS || wc.status == IBV_WC_WR_FLUSH_ERR) return;
    if (auto change = health.cause(HealthCause{
            HealthSource::kKeepalive, static_cast<int>(wc.status), wc.wr_id,
            std::string("keepalive: ") + ibv_wc_status_str(wc.status)})) {
      changed(std::move(*change));
    }
  }  // its handle released here, after the lock, from inside its own call: no wait

  // A probe out that will not be answered here any more (the health
  // closes, or comes up again: a reset QP drops what was posted) is still
  // taken for interval x misses and kProbeGrace more, so that its
  // completion never reaches the CQ's handler, by a timer of its own that
  // lets go of the probe and itself when it fires. Call without the lock.
  void give_up(std::optional<Probe> out) noexcept {
    auto events = dispatcher.lock();
    if (!out || !events) return;
    struct Grace {
      std::mutex mutex;
      std::optional<Probe> probe;
      Handle timer;
      bool fired = false;
    };
    try {
      auto grace = std::make_shared<Grace>();
      grace->probe = std::move(out);
      Handle timer = events->call_after(
          keepalive.interval * keepalive.misses + kProbeGrace, [grace] {
            std::optional<Probe> probe;
            Handle timer;  // both released outside the lock; the timer from inside its task
            std::lock_guard<std::mutex> lock(grace->mutex);
            grace->fired = true;
            std::swap(probe, grace->probe);
            std::swap(timer, grace->timer);
          });
      std::lock_guard<std::mutex> lock(grace->mutex);
      if (!grace->fired) std::swap(grace->timer, timer);
    } catch (const std::exception&) {
      // No timer: the probe's completion, if it comes, reaches the handler.
    }
  }

  // The keepalive's and the deadlines' timers are released already: no tick
  // after this; and no recovery step.
  void stop() noexcept {
    std::optional<Probe> out;
    Handle retry, overdue;
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopped = true;
      ++step;
      std::swap(out, probe);
      std::swap(retry, retry_timer);
      std::swap(overdue, give_up_timer);
    }
    give_up(std::move(out));
  }  // the recovery's timers released here, outside the lock

  // The connection came up: what was out before is given up on.
  void came_up() noexcept {
    std::optional<Probe> out;
    {
      std::lock_guard<std::mutex> lock(mutex);
      std::swap(out, probe);
    }
    give_up(std::move(out));
  }

  const std::weak_ptr<Dispatcher> dispatcher;
  const std::shared_ptr<Registry> registry;
  const std::weak_ptr<QueuePair> qp;  // the ConnectionHealth holds it
  const OwningProcess process;
  // --- Deadlines: what post_send() posted, until its completion ---

  struct Posted {
    std::uint64_t wr_id;
    bool signaled;
    Clock::time_point at;
  };

  // Under the lock. A completion retires its request and those posted
  // before it (a send queue completes in order; unsignaled requests have no
  // completion of their own unless they fail); a request whose own
  // completion is an error or a flush was not delivered.
  void retire(const ibv_wc& wc) {
    const bool success = wc.status == IBV_WC_SUCCESS;
    if (success && (wc.opcode & IBV_WC_RECV) != 0) return;
    // A success is a signaled request's; an error may be any request's.
    const auto it = std::find_if(posted.begin(), posted.end(), [&](const Posted& p) {
      return p.wr_id == wc.wr_id && (p.signaled || !success);
    });
    if (it == posted.end()) return;
    if (!success) note_undelivered(wc.wr_id);
    posted.erase(posted.begin(), it + 1);
  }

  void note_undelivered(std::uint64_t wr_id) {
    if (undelivered.size() < kMaxUndelivered) undelivered.push_back(wr_id);
  }

  // Every quarter deadline, on the Dispatcher's thread: while up, the
  // oldest signaled request outstanding past its deadline is a cause.
  void check_deadline() {
    if (!qp_open()) return;
    std::lock_guard<std::mutex> lock(mutex);
    if (stopped || health.state() != ConnectionState::kUp) return;
    const auto oldest = std::find_if(posted.begin(), posted.end(),
                                     [](const Posted& p) { return p.signaled; });
    if (oldest == posted.end()) return;
    const auto waited =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - oldest->at);
    if (waited < deadline) return;
    if (auto change = health.cause(HealthCause{
            HealthSource::kDeadline, 0, oldest->wr_id,
            "wr_id " + std::to_string(oldest->wr_id) + " had no completion in " +
                std::to_string(waited.count()) + " ms (deadline " +
                std::to_string(deadline.count()) + " ms)"})) {
      changed(std::move(*change));
    }
  }

  // --- Recovery: the steps, on the Dispatcher's thread ---

  bool current(std::uint64_t at) const { return !stopped && at == step; }
  bool still(std::uint64_t at) {
    std::lock_guard<std::mutex> lock(mutex);
    return current(at);
  }

  // The state went down (a new outage, or an attempt that failed): give up,
  // or wait for the next attempt; while the port is down, PORT_ACTIVE
  // starts that wait.
  void supervise(std::uint64_t at, bool new_outage) {
    // Asked here rather than remembered: on the Dispatcher's thread, as
    // PORT_ACTIVE is heard, so an activation after this finds `pending`.
    // A port that cannot be asked is taken as up: the attempt will say.
    bool port_active = true;
    if (auto connection = qp.lock()) {
      try {
        port_active = connection->device()->query_port(port).state == IBV_PORT_ACTIVE;
      } catch (const std::exception&) {
      }
    }
    std::optional<Failure> failed;
    std::optional<std::chrono::milliseconds> wait;
    std::uint64_t outage_at = 0;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!current(at)) return;
      const auto now = Clock::now();
      const RecoveryDecision decision =
          new_outage ? schedule->went_down(now) : schedule->attempt_failed(now);
      if (!decision.delay) {
        failed = fail_for_good(decision.why);
      } else if (!port_active) {
        pending = decision.delay;
      } else {
        wait = decision.delay;
      }
      if (new_outage && !failed) outage_at = ++outage;
    }
    if (failed) return registry->report(*failed);
    if (outage_at != 0) {
      arm(&HealthShared::give_up_timer, schedule->policy().give_up_after, at,
          [weak = weak_from_this(), outage_at] {
            if (auto self = weak.lock()) self->overdue(outage_at);
          });
    }
    if (wait) arm_attempt(*wait, at);
  }

  void port_came_back() {
    std::optional<std::chrono::milliseconds> wait;
    std::uint64_t at;
    {
      std::lock_guard<std::mutex> lock(mutex);
      std::swap(wait, pending);
      at = step;
    }
    if (wait) arm_attempt(*wait, at);
  }

  // The outage `at_outage` has lasted give_up_after, if it still goes on.
  void overdue(std::uint64_t at_outage) {
    std::optional<Failure> failed;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (stopped || at_outage != outage) return;
      const auto state = health.state();
      if (state == ConnectionState::kUp || state == ConnectionState::kFailed) return;
      if (auto why = schedule->overdue(Clock::now())) failed = fail_for_good(*why);
    }
    if (failed) registry->report(*failed);
  }

  // Under the lock: failed, with the record that says why (reported by the
  // caller, after the lock).
  Failure fail_for_good(const std::string& why) {
    if (auto change = health.fail(HealthCause{HealthSource::kRecovery, 0, 0, why})) {
      changed(std::move(*change));
    }
    Failure failure;
    failure.kind = Failure::Kind::kConnectionFailed;
    failure.verb = "ConnectionHealth recovery";
    failure.error = std::make_error_code(std::errc::connection_aborted);
    if (auto connection = qp.lock()) {
      failure.device = connection->device()->context();
      failure.object = connection->get();
    }
    failure.what = "QP " + std::to_string(qp_num) + ": " + why;
    return failure;
  }

  // Without the lock: a timer for `task`, kept in `slot` while step `at` is
  // current; the one it replaces, or it if stale, released here. A timer
  // that cannot be made fails the connection (nothing else would retry).
  template <typename Task>
  void arm(Handle HealthShared::*slot, std::chrono::milliseconds delay, std::uint64_t at,
           Task task) {
    auto events = dispatcher.lock();
    if (!events) return;
    Handle timer;
    try {
      timer = events->call_after(delay, std::move(task));
    } catch (const std::exception& e) {
      std::optional<Failure> failed;
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (current(at)) failed = fail_for_good(std::string("no timer: ") + e.what());
      }
      if (failed) registry->report(*failed);
      return;
    }
    std::lock_guard<std::mutex> lock(mutex);
    if (current(at)) std::swap(this->*slot, timer);
  }  // `timer` (the old one, or the stale new one) released here, after the lock

  void arm_attempt(std::chrono::milliseconds wait, std::uint64_t at) {
    arm(&HealthShared::retry_timer, wait, at, [weak = weak_from_this(), at] {
      if (auto self = weak.lock()) self->attempt(at);
    });
  }

  // The wait is over: drain the QP, so that everything posted before has
  // completed and the CQ's handler has had it. A QP in RESET (an attempt
  // before this one reset it and failed) holds nothing to drain.
  void attempt(std::uint64_t at) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!current(at) || health.state() != ConnectionState::kDown) return;
    }
    auto connection = qp.lock();
    try {
      if (!connection || connection->get() == nullptr) throw std::system_error(
          ENODEV, std::generic_category(), "the QP is closed");
      ibv_qp_attr attr{};
      ibv_qp_init_attr init{};
      if (const int rc = ibv_query_qp(connection->get(), &attr, IBV_QP_STATE, &init); rc != 0) {
        throw_system_error("ibv_query_qp", rc);
      }
      if (attr.qp_state == IBV_QPS_RESET) return drained(at, {});
      connection->drain_async(DrainOptions{}, [weak = weak_from_this(), at](
                                                  const DrainReport&, std::error_code error) {
        if (auto self = weak.lock()) self->drained(at, error);
      });
    } catch (const std::exception& e) {
      attempt_failed(at, "drain: " + std::string(e.what()), errno_of(e));
    }
  }

  // Drained: reset with a fresh PSN, then recovering, then the application.
  void drained(std::uint64_t at, std::error_code error) {
    if (error) return attempt_failed(at, "drain: " + error.message(), error.value());
    auto made = std::make_shared<Attempt>();
    made->qp = qp.lock();
    if (!still(at)) {
      made->settled = true;  // closed, or moved on meanwhile: the QP is not ours to reset
      return;
    }
    try {
      if (!made->qp) throw std::system_error(ENODEV, std::generic_category(), "the QP is closed");
      made->qp->reset();
      made->local = made->qp->endpoint(connect_options.port, connect_options.gid_index);
    } catch (const std::exception& e) {
      made->settled = true;
      return attempt_failed(at, "reset: " + std::string(e.what()), errno_of(e));
    }
    made->health = weak_from_this();
    std::lock_guard<std::mutex> lock(mutex);
    if (!current(at)) {
      made->settled = true;  // nothing to report: what made it stale is told
      return;
    }
    made->number = schedule->attempts() + 1;
    made->cause = health.causes().empty() ? HealthCause{} : health.causes().front();
    for (const Posted& p : posted) note_undelivered(p.wr_id);
    posted.clear();
    made->undelivered = std::move(undelivered);
    undelivered.clear();
    if (auto change = health.recovering()) changed(std::move(*change));
    made->step = step;
    // Posted after the change, so the handler hears recovering first.
    auto events = dispatcher.lock();
    if (!events) {
      made->settled = true;
      return;
    }
    events->post([reconnecter = reconnecter, registry = registry, attempt = RecoveryAttempt(made)] {
      call(reconnecter, attempt, "connection recovery's reconnect",
           [registry](const Failure& failure, const RecoveryAttempt&) { registry->report(failure); });
    });
  }

  // An attempt failed: a cause. Recovering goes down (changed() steps on);
  // failed before it came to recovering (the drain, the reset), the state
  // is down already, and the next step is this one's to post.
  void attempt_failed(std::uint64_t at, const std::string& why, int code) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!current(at)) return;
    HealthCause cause{HealthSource::kRecovery, code, 0,
                      "attempt " + std::to_string(schedule->attempts() + 1) + ": " + why};
    if (auto change = health.cause(std::move(cause))) return changed(std::move(*change));
    ++step;
    post_supervise(false);
  }

  // RecoveryAttempt::connect succeeded: up, counted in the damping window.
  bool recovered(std::uint64_t at) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!current(at)) return false;
      schedule->recovered(Clock::now());
      if (auto change = health.up()) changed(std::move(*change));
    }
    came_up();
    return true;
  }

  // How many undelivered wr_ids an attempt lists at most (a send queue's
  // depth is far below it).
  static constexpr std::size_t kMaxUndelivered = 1 << 16;

  const std::uint32_t qp_num;
  const ConnectionHealth::Options::Keepalive keepalive;
  const std::chrono::milliseconds deadline;
  const bool signal_all;  // the QP signals every request (sq_sig_all)
  const ConnectOptions connect_options;
  const std::uint8_t port;
  std::mutex mutex;
  HealthState health;
  const std::shared_ptr<HealthSubscriber> subscriber;
  std::shared_ptr<ReconnectSubscriber> reconnecter;  // null: no recovery
  // The keepalive's, under `mutex`.
  bool stopped = false;
  std::optional<Probe> probe;  // out, not yet answered
  KeepaliveStats stats;
  // The deadlines' and the recovery's, under `mutex`.
  std::atomic<bool> tracking{false};  // post_send() was used: completions are looked at
  std::deque<Posted> posted;
  std::vector<std::uint64_t> undelivered;  // since the last attempt
  std::optional<RecoverySchedule> schedule;
  std::uint64_t step = 0;    // every change and every step moves it
  std::uint64_t outage = 0;  // every outage begun moves it
  std::optional<std::chrono::milliseconds> pending;  // an attempt's wait, until PORT_ACTIVE
  Handle retry_timer;
  Handle give_up_timer;
};

Attempt::~Attempt() {
  if (settled) return;
  if (auto shared = health.lock()) {
    shared->attempt_failed(step, "abandoned: neither connect() nor fail() was called", 0);
  }
}

void Attempt::settle(const char* verb) {
  if (settled.exchange(true)) {
    throw std::system_error(EALREADY, std::generic_category(),
                            std::string(verb) + ": this attempt was settled already");
  }
}

}  // namespace detail

std::shared_ptr<ConnectionHealth> ConnectionHealth::create(std::shared_ptr<QueuePair> qp,
                                                           HealthHandler on_change,
                                                           Options options) {
  const std::string verb = "ConnectionHealth::create";
  if (qp == nullptr) throw std::invalid_argument(verb + ": the QP is null");
  if (!on_change) throw std::invalid_argument(verb + ": the handler is empty");
  ibv_qp* raw = qp->get();
  if (raw == nullptr) throw std::invalid_argument(verb + ": the QP is closed");
  if (raw->qp_type != IBV_QPT_RC) {
    throw std::invalid_argument(verb + ": a connection is an RC QP");
  }
  const std::shared_ptr<Device>& device = qp->device();
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  if (const int rc = ibv_query_qp(raw, &attr, IBV_QP_STATE | IBV_QP_PORT, &init); rc != 0) {
    throw_system_error("ibv_query_qp", rc);
  }
  if (!options.port) {
    options.port = attr.qp_state != IBV_QPS_RESET && attr.port_num != 0 ? attr.port_num : 1;
  }
  if (*options.port < 1 || *options.port > device->port_count()) {
    throw std::invalid_argument(verb + ": port " + std::to_string(*options.port) +
                                " is not a port of " + device->name());
  }
  const auto& keepalive = options.keepalive;
  if (keepalive.interval.count() < 0 || (keepalive.interval.count() > 0 && keepalive.misses == 0)) {
    throw std::invalid_argument(verb + ": a keepalive needs an interval of 0 (none) or more, " +
                                "and at least one miss");
  }
  if (keepalive.interval.count() > 0 && qp->send_cq()->served_by() == nullptr) {
    throw std::invalid_argument(verb + ": the keepalive's completions are taken from the send " +
                                "CQ, which no Dispatcher serves (kPolled)");
  }
  if (options.deadline.count() < 0) {
    throw std::invalid_argument(verb + ": a deadline of 0 (none) or more");
  }
  if (options.recovery.reconnect) {
    try {
      options.recovery.policy.validate();
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(verb + ": " + e.what());
    }
    if (qp->send_cq()->served_by() == nullptr || qp->recv_cq()->served_by() == nullptr) {
      throw std::invalid_argument(verb + ": recovery drains the QP through its Dispatcher, " +
                                  "and a CQ of it is kPolled");
    }
  }
  auto shared = std::make_shared<detail::HealthShared>(device->dispatcher(), qp,
                                                       std::move(on_change), options,
                                                       init.sq_sig_all != 0);
  auto health = std::make_shared<ConnectionHealth>(Token{}, qp, shared);
  // Released last of these: a reconnect call running is waited for after
  // nothing else can start one.
  if (shared->reconnecter) {
    health->heard_.push_back(detail::subscription(
        shared->reconnecter, [process = detail::OwningProcess{}](const auto*) {
          return !process.inherited();
        }));
  }

  // The listeners hold the state weakly: it goes with the ConnectionHealth.
  const Handler hear = [weak = std::weak_ptr<detail::HealthShared>(shared)](const Event& event) {
    if (auto state = weak.lock()) state->hear(event);
  };
  const EventFilter qp_causes{IBV_EVENT_QP_FATAL, IBV_EVENT_QP_REQ_ERR, IBV_EVENT_QP_ACCESS_ERR,
                              IBV_EVENT_PATH_MIG_ERR};
  Registry& registry = device->registry();
  health->heard_.push_back(registry.attach(raw, qp_causes, hear));
  health->heard_.push_back(registry.attach(
      raw->context, ObjectNumber{ElementKind::kQp, raw->qp_num}, qp_causes, hear));
  EventFilter device_causes{IBV_EVENT_PORT_ERR, IBV_EVENT_PORT_ACTIVE, IBV_EVENT_DEVICE_FATAL};
  health->heard_.push_back(device->on_event(device_causes.on_port(*options.port), hear));
  if (keepalive.interval.count() > 0) {
    health->heard_.push_back(device->dispatcher().call_every(
        keepalive.interval, [weak = std::weak_ptr<detail::HealthShared>(shared)] {
          if (auto state = weak.lock()) state->tick();
        }));
  }
  if (options.deadline.count() > 0) {
    health->heard_.push_back(device->dispatcher().call_every(
        std::max(options.deadline / 4, std::chrono::milliseconds(1)),
        [weak = std::weak_ptr<detail::HealthShared>(shared)] {
          if (auto state = weak.lock()) state->check_deadline();
        }));
  }
  return health;
}

ConnectionHealth::ConnectionHealth(Token, std::shared_ptr<QueuePair> qp,
                                   std::shared_ptr<detail::HealthShared> shared)
    : qp_(std::move(qp)),
      shared_(std::move(shared)),
      told_(detail::subscription(shared_->subscriber,
                                 [process = detail::OwningProcess{}](const auto*) {
                                   return !process.inherited();  // no list: nothing to unlink
                                 })) {}

ConnectionHealth::~ConnectionHealth() { close(); }

ConnectionState ConnectionHealth::state() const {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->health.state();
}

std::vector<HealthCause> ConnectionHealth::causes() const {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->health.causes();
}

void ConnectionHealth::completion(const ibv_wc& wc) {
  if (wc.qp_num != shared_->qp_num || !shared_->qp_open()) return;
  auto cause = HealthCause::of_completion(wc);
  if (!cause && !shared_->tracking.load(std::memory_order_relaxed)) return;
  shared_->apply([&](HealthState& health) -> std::optional<HealthChange> {
    shared_->retire(wc);
    if (!cause) return std::nullopt;
    return health.cause(std::move(*cause));
  });
}

void ConnectionHealth::post_send(ibv_send_wr& wr, ibv_send_wr** bad_wr) {
  ibv_send_wr* bad = nullptr;
  std::lock_guard<std::mutex> lock(shared_->mutex);
  shared_->tracking.store(true, std::memory_order_relaxed);
  const auto now = detail::Clock::now();
  const std::size_t before = shared_->posted.size();
  for (const ibv_send_wr* next = &wr; next != nullptr; next = next->next) {
    const bool signaled = shared_->signal_all || (next->send_flags & IBV_SEND_SIGNALED) != 0;
    shared_->posted.push_back({next->wr_id, signaled, now});
  }
  try {
    qp_->post_send(wr, &bad);
  } catch (...) {
    // The requests from `bad` on were not posted (all of them when the
    // verb was not reached: a closed QP).
    if (bad == nullptr) bad = &wr;
    std::size_t posted = 0;
    for (const ibv_send_wr* next = &wr; next != nullptr && next != bad; next = next->next) ++posted;
    shared_->posted.resize(before + posted);
    if (bad_wr != nullptr) *bad_wr = bad;
    throw;
  }
}

void ConnectionHealth::cause(HealthCause cause) {
  shared_->apply([&](HealthState& health) { return health.cause(std::move(cause)); });
}

void ConnectionHealth::recovering() {
  shared_->apply([](HealthState& health) { return health.recovering(); });
}

void ConnectionHealth::up() {
  bool came_up = false;
  shared_->apply([&came_up](HealthState& health) {
    auto change = health.up();
    came_up = change.has_value();
    return change;
  });
  if (came_up) shared_->came_up();
}

KeepaliveStats ConnectionHealth::keepalive_stats() const {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->stats;
}

void ConnectionHealth::fail(HealthCause cause) {
  shared_->apply([&](HealthState& health) { return health.fail(std::move(cause)); });
}

// The listeners first, so no cause arrives after; then the handler, waited
// for. The handles are taken under the lock and released by the thread that
// took them (core/handle.h's rule); a close() that finds them taken still
// keeps the wait rule, on the handler's guard.
void ConnectionHealth::close() noexcept {
  if (shared_->process.inherited()) {
    // A forked child's copy: its handles are inert here, and its locks, its
    // handler's guard and its Dispatcher are as the parent's threads left
    // them at the fork: nothing of them is taken or waited for.
    for (Handle& handle : heard_) handle.release();
    told_.release();
    return;
  }
  std::vector<Handle> heard;
  Handle told;
  {
    std::lock_guard<std::mutex> lock(close_mutex_);
    heard.swap(heard_);
    told = std::move(told_);
  }
  if (!told.active()) {
    detail::CallGuard& guard = shared_->subscriber->guard;
    guard.close();
    if (!guard.running_here()) guard.wait_idle();
    return;
  }
  // Stopped first, so no step starts (no reset of a QP that is no longer
  // the health's) while the listeners and timers are let go.
  shared_->stop();
  for (auto it = heard.rbegin(); it != heard.rend(); ++it) it->release();
  told.release();
}

unsigned RecoveryAttempt::number() const noexcept { return attempt_->number; }
const HealthCause& RecoveryAttempt::cause() const noexcept { return attempt_->cause; }
const std::vector<std::uint64_t>& RecoveryAttempt::undelivered() const noexcept {
  return attempt_->undelivered;
}
const RcEndpoint& RecoveryAttempt::local() const noexcept { return attempt_->local; }
QueuePair& RecoveryAttempt::queue_pair() const noexcept { return *attempt_->qp; }

void RecoveryAttempt::connect(const RcEndpoint& remote) const {
  constexpr const char* verb = "RecoveryAttempt::connect";
  detail::Attempt& attempt = *attempt_;
  attempt.settle(verb);
  auto shared = attempt.health.lock();
  const auto cancelled = [verb] {
    return std::system_error(ECANCELED, std::generic_category(),
                             std::string(verb) + ": the recovery ended (failed or closed)");
  };
  if (!shared || !shared->still(attempt.step)) throw cancelled();
  try {
    attempt.qp->connect(remote, shared->connect_options);
  } catch (const std::exception& e) {
    shared->attempt_failed(attempt.step, "connect: " + std::string(e.what()), errno_of(e));
    throw;
  }
  if (!shared->recovered(attempt.step)) throw cancelled();
}

void RecoveryAttempt::fail(const std::string& why) const {
  attempt_->settle("RecoveryAttempt::fail");
  if (auto shared = attempt_->health.lock()) shared->attempt_failed(attempt_->step, why, 0);
}

}  // namespace ibev
