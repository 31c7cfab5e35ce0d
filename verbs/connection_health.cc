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
  // Settles it for `verb` (connect, replace): the health, still on this
  // attempt; throws EALREADY, or ECANCELED once the recovery moved on.
  std::shared_ptr<HealthShared> begin(const char* verb);

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

using Mode = ConnectionHealth::Options::Recovery::Mode;

struct HealthShared : std::enable_shared_from_this<HealthShared> {
  HealthShared(Dispatcher& dispatcher, HealthHandler handler, ConnectionHealth::Options& options)
      : dispatcher(dispatcher.weak_ref()),
        registry(dispatcher.shared_registry()),
        keepalive(options.keepalive),
        deadline(options.deadline),
        mode(options.recovery.mode),
        connect_options(options.recovery.connect),
        health(options.initial),
        subscriber(std::make_shared<HealthSubscriber>(std::move(handler), AnyArg{},
                                                      options.executor)) {
    ever_up = options.initial == ConnectionState::kUp;
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
    if (change.to == ConnectionState::kUp) ever_up = true;
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
  void post_supervise(bool new_outage, bool at_once = false) {
    if (auto events = dispatcher.lock()) {
      events->post([weak = weak_from_this(), at = step, new_outage, at_once] {
        if (auto self = weak.lock()) self->supervise(at, new_outage, at_once);
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

  // --- The QP: the one the connection runs on, and its listeners ---

  // Under the lock. Once the QP is closed, its address and number may be a
  // newer QP's: what names them is not this connection's news.
  bool qp_open() const { return qp && qp->get() != nullptr; }
  std::shared_ptr<QueuePair> current_qp() {
    std::lock_guard<std::mutex> lock(mutex);
    return qp;
  }

  // The listeners of `connection`'s events (its QP's, by address and by
  // number; its port's; its device's), made without the lock, for wiring
  // `generation`: what they hear counts while that wiring is the current.
  std::vector<Handle> wire(const std::shared_ptr<QueuePair>& connection, std::uint8_t on_port,
                           std::uint64_t generation) {
    const Handler listener = [weak = weak_from_this(), generation,
                              heard_qp = std::weak_ptr<QueuePair>(connection)](const Event& event) {
      if (auto self = weak.lock()) self->hear(event, generation, heard_qp);
    };
    const EventFilter qp_causes{IBV_EVENT_QP_FATAL, IBV_EVENT_QP_REQ_ERR, IBV_EVENT_QP_ACCESS_ERR,
                                IBV_EVENT_PATH_MIG_ERR};
    ibv_qp* raw = connection->get();
    const std::shared_ptr<Device>& device = connection->device();
    Registry& events = device->registry();
    std::vector<Handle> heard;
    heard.push_back(events.attach(raw->context, ObjectNumber{ElementKind::kQp, raw->qp_num}, raw,
                                  qp_causes, listener));
    EventFilter device_causes{IBV_EVENT_PORT_ERR, IBV_EVENT_PORT_ACTIVE, IBV_EVENT_DEVICE_FATAL};
    heard.push_back(device->on_event(device_causes.on_port(on_port), listener));
    return heard;
  }

  // Under the lock: `connection` is the one from now on, with `heard` its
  // listeners (of wiring `generation`); the old ones are returned, to be
  // released after the lock.
  std::vector<Handle> run_on(std::shared_ptr<QueuePair> connection, std::uint8_t on_port,
                             bool signals_all, std::uint64_t generation,
                             std::vector<Handle> heard) {
    qp = std::move(connection);
    qp_num.store(qp->qp_num(), std::memory_order_relaxed);
    port = on_port;
    signal_all = signals_all;
    device_gone = false;
    wiring = generation;
    std::swap(heard, listeners);
    return heard;
  }

  // An event of `heard_qp` (the QP a wiring was made for: the current one,
  // or, during a replace, the one about to be).
  void hear(const Event& event, std::uint64_t generation,
            const std::weak_ptr<QueuePair>& heard_qp) {
    const auto open = heard_qp.lock();
    if (!open || open->get() == nullptr) return;
    if (event.code() == IBV_EVENT_PORT_ACTIVE) {
      port_came_back(generation);
      return;
    }
    auto cause = HealthCause::of_event(event.code());
    if (!cause) return;
    std::optional<Failure> failed;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (generation != wiring) return;
      const bool fatal = event.code() == IBV_EVENT_DEVICE_FATAL;
      if (fatal) device_gone = true;
      if (auto change = health.cause(std::move(*cause))) changed(std::move(*change));
      // In place, a QP is reset on its own device only: whatever the state,
      // there is nothing left to attempt.
      if (fatal && reconnecter && mode == Mode::kResetInPlace && !stopped &&
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
    Handle taken;  // its completion, taken from the send CQ
  };

  // Every interval, on the Dispatcher's thread: while up, a probe, unless
  // one is out. With one out, `misses` intervals since the peer was last
  // heard (a probe answered, or the connection came up) are a cause: timed
  // from that, not from the probe's post (a probe leaves up to an interval
  // after the peer went, which would stretch the bound to misses + 1
  // intervals), and not by ticks counted (a busy loop runs late ticks once).
  void tick() {
    const auto now = std::chrono::steady_clock::now();
    std::shared_ptr<QueuePair> connection;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (stopped || health.state() != ConnectionState::kUp || !qp_open()) return;
      if (probe) {
        // Half an interval early still counts: ticks come a little late
        // or a little early, and the last answer came just after one.
        if (now - heard_from + keepalive.interval / 2 < keepalive.interval * keepalive.misses) {
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
      connection = qp;
    }
    send_probe(now, connection);
  }

  // A zero-length RDMA write, signaled; its completion is taken (answered).
  // What fails is reported; nothing is out then, and the next tick tries
  // again.
  void send_probe(std::chrono::steady_clock::time_point now,
                  const std::shared_ptr<QueuePair>& connection) {
    Probe next;
    Dispatcher* cq_events = connection->send_cq()->served_by();
    if (cq_events == nullptr) return;
    try {
      next.taken = cq_events->take_completion(
          connection->send_cq()->get(), connection->qp_num(), next.wr_id(),
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
    if (!stopped && !probe && qp == connection) {
      // A probe that leaves late (a post that failed, a loop that stalled)
      // still gets misses - 1 intervals of its own to be answered.
      heard_from = std::max(heard_from, now - keepalive.interval);
      probe = std::move(next);
    }
  }  // a probe not kept (stopped or replaced meanwhile): its handle goes, the post is flushed or lost with the QP

  // The probe's completion (on the CQ's thread). A late one, of a probe
  // given up on, was only taken.
  void answered(std::uint64_t wr_id, const ibv_wc& wc) {
    std::optional<Probe> done;
    std::lock_guard<std::mutex> lock(mutex);
    if (!probe || probe->wr_id() != wr_id) return;
    ++stats.answered;
    done = std::move(probe);
    probe.reset();
    if (wc.status == IBV_WC_SUCCESS) heard_from = std::chrono::steady_clock::now();
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
    std::lock_guard<std::mutex> lock(mutex);
    if (stopped || health.state() != ConnectionState::kUp || !qp_open()) return;
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
  // starts that wait. A connection made by its recovery attempts `at_once`.
  void supervise(std::uint64_t at, bool new_outage, bool at_once) {
    // Asked here rather than remembered: on the Dispatcher's thread, as
    // PORT_ACTIVE is heard, so an activation after this finds `pending`.
    // A port that cannot be asked is taken as up: the attempt will say. A
    // QP on a device that is gone has no port to wait for (a QP replacing
    // it may be on another device); nor has a connection with no QP yet.
    bool port_active = true;
    std::shared_ptr<QueuePair> connection;
    std::uint8_t on_port = 1;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!device_gone) connection = qp;
      on_port = port;
    }
    if (connection) {
      try {
        port_active = connection->device()->query_port(on_port).state == IBV_PORT_ACTIVE;
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
        // A QP to be replaced may be replaced on another port or device:
        // attempts go on, at the backoff's longest, PORT_ACTIVE bringing
        // the next forward.
        if (mode == Mode::kReconnect) wait = schedule->policy().max_delay;
      } else {
        wait = at_once || soon ? std::chrono::milliseconds(0) : *decision.delay;
      }
      soon = false;
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

  // In place, the attempt waited for starts after its wait. A QP to be
  // replaced: the way back is there now (retry_now()).
  void port_came_back(std::uint64_t generation) {
    std::optional<std::chrono::milliseconds> wait;
    std::uint64_t at;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (generation != wiring) return;
      std::swap(wait, pending);
      at = step;
    }
    if (mode == Mode::kReconnect) return retry_now("PORT_ACTIVE");
    if (wait) arm_attempt(*wait, at);
  }

  // The way to the peer is back (`why`): an attempt waited for starts now;
  // one in progress since before (its requests into a dead link, say)
  // fails, and the next starts now.
  void retry_now(const std::string& why) {
    std::uint64_t at;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (stopped || !reconnecter) return;
      const ConnectionState state = health.state();
      if (state == ConnectionState::kRecovering) {
        soon = true;
        if (auto change = health.cause(HealthCause{
                HealthSource::kRecovery, 0, 0,
                "attempt " + std::to_string(schedule->attempts() + 1) + ": " + why +
                    " came during it"})) {
          changed(std::move(*change));
        }
        return;
      }
      if (state != ConnectionState::kDown) return;
      pending.reset();
      soon = true;  // a supervise still to run arms no wait either
      at = step;
    }
    arm_attempt(std::chrono::milliseconds(0), at);
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
    if (qp) {
      failure.device = qp->device()->context();
      failure.object = qp->get();
      failure.what = "QP " + std::to_string(qp->qp_num()) + ": " + why;
    } else {
      failure.what = "no QP yet: " + why;
    }
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
  // before this one reset it and failed) holds nothing to drain; nor does
  // none, and a QP to be replaced on a device that is gone cannot drain
  // (nothing posted on it was delivered).
  void attempt(std::uint64_t at) {
    std::shared_ptr<QueuePair> connection;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!current(at) || health.state() != ConnectionState::kDown) return;
      if (attempted && *attempted == at) return;  // two timers for one step (retry_now, supervise)
      attempted = at;
      connection = qp;
      if (mode == Mode::kReconnect && (!qp_open() || device_gone)) connection.reset();
    }
    if (mode == Mode::kReconnect && !connection) return drained(at, {});
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
      // A QP to be replaced is replaced all the same (drained() says why).
      if (mode == Mode::kReconnect) {
        return drained(at, std::error_code(errno_of(e), std::generic_category()));
      }
      attempt_failed(at, "drain: " + std::string(e.what()), errno_of(e));
    }
  }

  // Drained: reset with a fresh PSN (in place), then recovering, then the
  // application. A QP to be replaced whose drain failed is replaced all the
  // same: what it held is undelivered.
  void drained(std::uint64_t at, std::error_code error) {
    if (error && mode == Mode::kResetInPlace) {
      return attempt_failed(at, "drain: " + error.message(), error.value());
    }
    auto made = std::make_shared<Attempt>();
    made->qp = current_qp();
    if (!still(at)) {
      made->settled = true;  // closed, or moved on meanwhile: the QP is not ours to reset
      return;
    }
    if (mode == Mode::kResetInPlace) {
      try {
        if (!made->qp) throw std::system_error(ENODEV, std::generic_category(), "the QP is closed");
        made->qp->reset();
        made->local = made->qp->endpoint(connect_options.port, connect_options.gid_index);
      } catch (const std::exception& e) {
        made->settled = true;
        return attempt_failed(at, "reset: " + std::string(e.what()), errno_of(e));
      }
    }
    made->health = weak_from_this();
    std::lock_guard<std::mutex> lock(mutex);
    if (!current(at)) {
      made->settled = true;  // nothing to report: what made it stale is told
      return;
    }
    made->number = schedule->attempts() + 1;
    made->cause = health.causes().empty() ? HealthCause{} : health.causes().front();
    // Listed again by every attempt until one brings the connection up: an
    // attempt that fails has not delivered them either.
    for (const Posted& p : posted) note_undelivered(p.wr_id);
    posted.clear();
    made->undelivered = undelivered;
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

  // RecoveryAttempt::connect succeeded: up, counted in the damping window
  // (a connection's first up is not a recovery).
  bool recovered(std::uint64_t at) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!current(at)) return false;
      up_again();
    }
    came_up();
    return true;
  }

  // Under the lock: the state up, and the keepalive's clock restarted with
  // it, so that no tick between this and came_up() times from before.
  std::optional<HealthChange> went_up() {
    auto change = health.up();
    if (change) heard_from = std::chrono::steady_clock::now();
    return change;
  }

  // Under the lock.
  void up_again() {
    if (ever_up) schedule->recovered(Clock::now());
    if (auto change = went_up()) changed(std::move(*change));
  }

  // RecoveryAttempt::replace: `next` is the connection's QP, listened to
  // before it is (so that no event of it is missed; one heard before the
  // swap is a cause of the attempt), and up.
  bool replaced(std::uint64_t at, std::shared_ptr<QueuePair> next, std::uint8_t on_port,
                bool signals_all) {
    std::uint64_t generation;
    std::uint64_t before;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!current(at)) return false;
      before = wiring;
      generation = wiring = ++wirings;
    }
    std::vector<Handle> heard;
    try {
      heard = wire(next, on_port, generation);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex);
      if (wiring == generation) wiring = before;
      throw;
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!current(at)) {
        if (wiring == generation) wiring = before;  // the old QP's events count again
        return false;
      }  // `heard` released after the lock
      heard = run_on(std::move(next), on_port, signals_all, generation, std::move(heard));
      up_again();
    }
    heard.clear();  // the old QP's listeners, after the lock
    came_up();
    return true;
  }

  // How many undelivered wr_ids an attempt lists at most (a send queue's
  // depth is far below it).
  static constexpr std::size_t kMaxUndelivered = 1 << 16;

  const ConnectionHealth::Options::Keepalive keepalive;
  const std::chrono::milliseconds deadline;
  const Mode mode;
  const ConnectOptions connect_options;
  std::mutex mutex;
  // The QP and what is its, under `mutex`; qp_num is read without it too
  // (completion()'s first test).
  std::shared_ptr<QueuePair> qp;  // null before a kReconnect's first
  std::atomic<std::uint32_t> qp_num{0};
  std::uint8_t port = 1;
  bool signal_all = false;   // the QP signals every request (sq_sig_all)
  bool device_gone = false;  // its device raised DEVICE_FATAL
  std::vector<Handle> listeners;  // its events'
  std::uint64_t wiring = 0;       // which listeners' events count
  std::uint64_t wirings = 0;      // made so far
  bool ever_up = false;           // a first up is no recovery
  HealthState health;
  const std::shared_ptr<HealthSubscriber> subscriber;
  std::shared_ptr<ReconnectSubscriber> reconnecter;  // null: no recovery
  // The keepalive's, under `mutex`.
  bool stopped = false;
  std::optional<Probe> probe;  // out, not yet answered
  // The peer last heard: a probe answered, or the connection up.
  std::chrono::steady_clock::time_point heard_from = std::chrono::steady_clock::now();
  KeepaliveStats stats;
  // The deadlines' and the recovery's, under `mutex`.
  std::atomic<bool> tracking{false};  // post_send() was used: completions are looked at
  std::deque<Posted> posted;
  std::vector<std::uint64_t> undelivered;  // since the connection was last up
  std::optional<RecoverySchedule> schedule;
  std::uint64_t step = 0;    // every change and every step moves it
  std::uint64_t outage = 0;  // every outage begun moves it
  std::optional<std::chrono::milliseconds> pending;  // an attempt's wait, until PORT_ACTIVE
  bool soon = false;  // retry_now(): the next attempt without a wait
  std::optional<std::uint64_t> attempted;  // the step whose attempt has started
  Handle retry_timer;
  Handle give_up_timer;
};

Attempt::~Attempt() {
  if (settled) return;
  if (auto shared = health.lock()) {
    shared->attempt_failed(step, "abandoned: none of connect(), replace() or fail() was called",
                           0);
  }
}

void Attempt::settle(const char* verb) {
  if (settled.exchange(true)) {
    throw std::system_error(EALREADY, std::generic_category(),
                            std::string(verb) + ": this attempt was settled already");
  }
}

std::system_error cancelled(const char* verb) {
  return std::system_error(ECANCELED, std::generic_category(),
                           std::string(verb) + ": the recovery ended (failed or closed)");
}

std::shared_ptr<HealthShared> Attempt::begin(const char* verb) {
  settle(verb);
  auto shared = health.lock();
  if (!shared || !shared->still(step)) throw cancelled(verb);
  return shared;
}

}  // namespace detail

namespace {

// What a connection's QP is, once found fit: its port and its signaling.
struct QpFacts {
  std::uint8_t port;
  bool signal_all;
};

// Throws std::invalid_argument naming `verb` for a QP the connection cannot
// run on (`port`: the one given, or unset for the QP's own).
QpFacts check_qp(const std::string& verb, const std::shared_ptr<QueuePair>& qp,
                 std::optional<std::uint8_t> port, const Dispatcher& dispatcher,
                 bool keepalive, bool recovery) {
  if (qp == nullptr) throw std::invalid_argument(verb + ": the QP is null");
  ibv_qp* raw = qp->get();
  if (raw == nullptr) throw std::invalid_argument(verb + ": the QP is closed");
  if (raw->qp_type != IBV_QPT_RC) {
    throw std::invalid_argument(verb + ": a connection is an RC QP");
  }
  const std::shared_ptr<Device>& device = qp->device();
  if (&device->dispatcher() != &dispatcher) {
    throw std::invalid_argument(verb + ": the QP is served by another Dispatcher");
  }
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  if (const int rc = ibv_query_qp(raw, &attr, IBV_QP_STATE | IBV_QP_PORT, &init); rc != 0) {
    throw_system_error("ibv_query_qp", rc);
  }
  if (!port) port = attr.qp_state != IBV_QPS_RESET && attr.port_num != 0 ? attr.port_num : 1;
  if (*port < 1 || *port > device->port_count()) {
    throw std::invalid_argument(verb + ": port " + std::to_string(*port) + " is not a port of " +
                                device->name());
  }
  if (keepalive && qp->send_cq()->served_by() == nullptr) {
    throw std::invalid_argument(verb + ": the keepalive's completions are taken from the send " +
                                "CQ, which no Dispatcher serves (kPolled)");
  }
  if (recovery &&
      (qp->send_cq()->served_by() == nullptr || qp->recv_cq()->served_by() == nullptr)) {
    throw std::invalid_argument(verb + ": recovery drains the QP through its Dispatcher, " +
                                "and a CQ of it is kPolled");
  }
  return QpFacts{*port, init.sq_sig_all != 0};
}

}  // namespace

std::shared_ptr<ConnectionHealth> ConnectionHealth::create(std::shared_ptr<QueuePair> qp,
                                                           HealthHandler on_change,
                                                           Options options) {
  // The rest of the QP is check_qp's, in make().
  if (qp == nullptr) throw std::invalid_argument("ConnectionHealth::create: the QP is null");
  Dispatcher& dispatcher = qp->device()->dispatcher();
  return make(dispatcher, std::move(qp), std::move(on_change), std::move(options));
}

std::shared_ptr<ConnectionHealth> ConnectionHealth::create(Dispatcher& dispatcher,
                                                           HealthHandler on_change,
                                                           Options options) {
  const std::string verb = "ConnectionHealth::create";
  if (!options.recovery.reconnect || options.recovery.mode != Options::Recovery::Mode::kReconnect ||
      options.initial != ConnectionState::kDown) {
    throw std::invalid_argument(verb + ": a connection without a QP is made by its recovery: " +
                                "Mode::kReconnect, a reconnect callback, initial kDown");
  }
  return make(dispatcher, nullptr, std::move(on_change), std::move(options));
}

std::shared_ptr<ConnectionHealth> ConnectionHealth::make(Dispatcher& dispatcher,
                                                         std::shared_ptr<QueuePair> qp,
                                                         HealthHandler on_change,
                                                         Options options) {
  const std::string verb = "ConnectionHealth::create";
  if (!on_change) throw std::invalid_argument(verb + ": the handler is empty");
  validate(verb, options);
  const auto& keepalive = options.keepalive;
  const bool recovery = static_cast<bool>(options.recovery.reconnect);
  std::optional<QpFacts> facts;
  if (qp) {
    facts = check_qp(verb, qp, options.port, dispatcher, keepalive.interval.count() > 0,
                             recovery);
  }
  auto shared = std::make_shared<detail::HealthShared>(dispatcher, std::move(on_change), options);
  auto health = std::make_shared<ConnectionHealth>(Token{}, shared);
  // Released last of these: a reconnect call running is waited for after
  // nothing else can start one.
  if (shared->reconnecter) {
    health->heard_.push_back(detail::subscription(
        shared->reconnecter, [process = detail::OwningProcess{}](const auto*) {
          return !process.inherited();
        }));
  }
  if (qp) {
    // The listeners hold the state weakly: it goes with the ConnectionHealth.
    auto heard = shared->wire(qp, facts->port, 0);
    std::lock_guard<std::mutex> lock(shared->mutex);
    shared->run_on(std::move(qp), facts->port, facts->signal_all, 0, std::move(heard));
  }
  if (keepalive.interval.count() > 0) {
    health->heard_.push_back(dispatcher.call_every(
        keepalive.interval, [weak = std::weak_ptr<detail::HealthShared>(shared)] {
          if (auto state = weak.lock()) state->tick();
        }));
  }
  if (options.deadline.count() > 0) {
    health->heard_.push_back(dispatcher.call_every(
        std::max(options.deadline / 4, std::chrono::milliseconds(1)),
        [weak = std::weak_ptr<detail::HealthShared>(shared)] {
          if (auto state = weak.lock()) state->check_deadline();
        }));
  }
  if (!shared->qp) {
    std::lock_guard<std::mutex> lock(shared->mutex);
    shared->post_supervise(true, true);  // the first attempt, at once
  }
  return health;
}

void ConnectionHealth::validate(const std::string& verb, const Options& options) {
  const auto& keepalive = options.keepalive;
  if (keepalive.interval.count() < 0 || (keepalive.interval.count() > 0 && keepalive.misses == 0)) {
    throw std::invalid_argument(verb + ": a keepalive needs an interval of 0 (none) or more, " +
                                "and at least one miss");
  }
  if (options.deadline.count() < 0) {
    throw std::invalid_argument(verb + ": a deadline of 0 (none) or more");
  }
  try {
    options.recovery.policy.validate();
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(verb + ": " + e.what());
  }
}

ConnectionHealth::ConnectionHealth(Token, std::shared_ptr<detail::HealthShared> shared)
    : shared_(std::move(shared)),
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
  if (wc.qp_num != shared_->qp_num.load(std::memory_order_relaxed)) return;
  auto cause = HealthCause::of_completion(wc);
  if (!cause && !shared_->tracking.load(std::memory_order_relaxed)) return;
  shared_->apply([&](HealthState& health) -> std::optional<HealthChange> {
    if (wc.qp_num != shared_->qp_num || !shared_->qp_open()) return std::nullopt;
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
    // With recovery, what is posted while not up would reach no attempt's
    // undelivered(): it is refused (posted: nothing; bad_wr: the first).
    if (!shared_->qp || (shared_->reconnecter && shared_->health.state() != ConnectionState::kUp)) {
      throw std::system_error(ENOTCONN, std::generic_category(),
                              "ConnectionHealth::post_send: the connection is not up");
    }
    shared_->qp->post_send(wr, &bad);
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
  shared_->apply([&came_up, shared = shared_.get()](HealthState&) {
    auto change = shared->went_up();
    came_up = change.has_value();
    return change;
  });
  if (came_up) shared_->came_up();
}

std::shared_ptr<QueuePair> ConnectionHealth::queue_pair() const { return shared_->current_qp(); }

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
  // the health's, no QP replaced) while the listeners and timers are let go.
  shared_->stop();
  std::vector<Handle> listeners;  // the QP's events', the last a replace made included
  std::shared_ptr<QueuePair> qp;  // let go, as close() promises
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    listeners.swap(shared_->listeners);
    qp.swap(shared_->qp);
  }
  for (Handle& handle : listeners) handle.release();
  for (auto it = heard.rbegin(); it != heard.rend(); ++it) it->release();
  told.release();
}

unsigned RecoveryAttempt::number() const noexcept { return attempt_->number; }
const HealthCause& RecoveryAttempt::cause() const noexcept { return attempt_->cause; }
const std::vector<std::uint64_t>& RecoveryAttempt::undelivered() const noexcept {
  return attempt_->undelivered;
}
const RcEndpoint& RecoveryAttempt::local() const noexcept { return attempt_->local; }
const std::shared_ptr<QueuePair>& RecoveryAttempt::queue_pair() const noexcept {
  return attempt_->qp;
}

void RecoveryAttempt::connect(const RcEndpoint& remote) const {
  constexpr const char* verb = "RecoveryAttempt::connect";
  detail::Attempt& attempt = *attempt_;
  auto shared = attempt.begin(verb);
  try {
    if (shared->mode != detail::Mode::kResetInPlace) {
      throw std::invalid_argument(std::string(verb) +
                                  ": Mode::kReconnect replaces the QP (RecoveryAttempt::replace)");
    }
    attempt.qp->connect(remote, shared->connect_options);
  } catch (const std::exception& e) {
    shared->attempt_failed(attempt.step, "connect: " + std::string(e.what()), errno_of(e));
    throw;
  }
  if (!shared->recovered(attempt.step)) throw detail::cancelled(verb);
}

void RecoveryAttempt::replace(std::shared_ptr<QueuePair> qp) const {
  constexpr const char* verb = "RecoveryAttempt::replace";
  detail::Attempt& attempt = *attempt_;
  auto shared = attempt.begin(verb);
  try {
    if (shared->mode != detail::Mode::kReconnect) {
      throw std::invalid_argument(std::string(verb) +
                                  ": Mode::kResetInPlace keeps the QP (RecoveryAttempt::connect)");
    }
    auto events = shared->dispatcher.lock();
    if (!events) throw detail::cancelled(verb);
    const QpFacts facts = check_qp(verb, qp, std::nullopt, *events,
                                   shared->keepalive.interval.count() > 0, true);
    if (!shared->replaced(attempt.step, std::move(qp), facts.port, facts.signal_all)) {
      throw detail::cancelled(verb);
    }
  } catch (const std::exception& e) {
    shared->attempt_failed(attempt.step, "replace: " + std::string(e.what()), errno_of(e));
    throw;
  }
}

bool RecoveryAttempt::current() const {
  auto shared = attempt_->health.lock();
  return !attempt_->settled && shared && shared->still(attempt_->step);
}

void ConnectionHealth::retry_now() { shared_->retry_now("retry_now()"); }

void RecoveryAttempt::fail(const std::string& why) const {
  attempt_->settle("RecoveryAttempt::fail");
  if (auto shared = attempt_->health.lock()) shared->attempt_failed(attempt_->step, why, 0);
}

}  // namespace ibev
