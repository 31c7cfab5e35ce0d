// A cause's path, top-down: heard (an event's listener, a keepalive tick or
// probe, or a call of the application), moved through the HealthState under
// the lock, and a change, when there is one, posted to the Dispatcher under
// that same lock, so the handler hears the changes in the order they were
// made; the posted task is the routing primitive's guarded call
// (core/route.h). Then the keepalive: a tick per interval on the
// Dispatcher's timer, a probe and its taken completion.
//
// Locking: HealthShared::mutex is a leaf but for Dispatcher::post, which
// takes the reactor's task lock (a leaf) and never calls back. No handler
// runs under it, no verb is called and no handle released under it.
#include <ibev/verbs/connection_health.h>

#include <chrono>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include <ibev/core/process.h>
#include <ibev/core/route.h>
#include <ibev/dispatch/dispatcher.h>
#include <ibev/verbs/device.h>

namespace ibev {
namespace detail {

using HealthSubscriber = Subscriber<HealthChange>;

// How long past its misses a probe out when the health closes is still
// taken (a drain's marker timeout).
constexpr std::chrono::milliseconds kProbeGrace{5000};

struct HealthShared : std::enable_shared_from_this<HealthShared> {
  HealthShared(Dispatcher& dispatcher, const std::shared_ptr<QueuePair>& qp,
               HealthHandler handler, const ConnectionHealth::Options& options)
      : dispatcher(dispatcher.weak_ref()),
        registry(dispatcher.shared_registry()),
        qp(qp),
        qp_num(qp->qp_num()),
        keepalive(options.keepalive),
        health(options.initial),
        subscriber(std::make_shared<HealthSubscriber>(std::move(handler), AnyArg{},
                                                      options.executor)) {}

  // One move of the state; its change, if any, told in order.
  template <typename Move>
  void apply(Move&& move) {
    std::lock_guard<std::mutex> lock(mutex);
    std::optional<HealthChange> change = move(health);
    if (change) tell(std::move(*change));
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
    if (auto cause = HealthCause::of_event(event.code())) {
      apply([&](HealthState& health) { return health.cause(std::move(*cause)); });
    }
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
          tell(std::move(*change));
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
      tell(std::move(*change));
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

  // The keepalive's timer is released already: no tick after this.
  void stop() noexcept {
    std::optional<Probe> out;
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopped = true;
      std::swap(out, probe);
    }
    give_up(std::move(out));
  }

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
  const std::uint32_t qp_num;
  const ConnectionHealth::Options::Keepalive keepalive;
  std::mutex mutex;
  HealthState health;
  const std::shared_ptr<HealthSubscriber> subscriber;
  // The keepalive's, under `mutex`.
  bool stopped = false;
  std::optional<Probe> probe;  // out, not yet answered
  KeepaliveStats stats;
};

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
  if (!options.port) {
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    if (const int rc = ibv_query_qp(raw, &attr, IBV_QP_STATE | IBV_QP_PORT, &init); rc != 0) {
      throw_system_error("ibv_query_qp", rc);
    }
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
  auto shared = std::make_shared<detail::HealthShared>(device->dispatcher(), qp,
                                                       std::move(on_change), options);
  auto health = std::make_shared<ConnectionHealth>(Token{}, qp, shared);

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
  EventFilter device_causes{IBV_EVENT_PORT_ERR, IBV_EVENT_DEVICE_FATAL};
  health->heard_.push_back(device->on_event(device_causes.on_port(*options.port), hear));
  if (keepalive.interval.count() > 0) {
    health->heard_.push_back(device->dispatcher().call_every(
        keepalive.interval, [weak = std::weak_ptr<detail::HealthShared>(shared)] {
          if (auto state = weak.lock()) state->tick();
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
  if (auto cause = HealthCause::of_completion(wc)) this->cause(std::move(*cause));
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
  for (auto it = heard.rbegin(); it != heard.rend(); ++it) it->release();
  shared_->stop();
  told.release();
}

}  // namespace ibev
