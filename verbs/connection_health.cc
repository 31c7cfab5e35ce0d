// ConnectionHealth: the facade, the core and the connection's wiring. The
// other rooms of the same object (verbs/health_core.h) are liveness.cc (the
// keepalive and deadlines) and recovery_steps.cc (the ladder's actions).
//
// A cause's path, top-down: heard (an event's listener below, a keepalive
// tick or probe, a completion, or a call of the application), reported
// through cause_locked(), moved through the HealthState under the lock, and
// a change, when there is one, posted to the Dispatcher under that same
// lock, so the handler hears the changes in the order they were made (the
// posted task is the routing primitive's guarded call, core/route.h). The
// change also steps the recovery ladder on (health/recovery.h), whose step is
// the one staleness token; a down is supervised by recovery_steps.cc.
//
// Locking: health_core.h's: the core's mutex is a leaf but for
// Dispatcher::post and ibv_post_send, and nothing is called back under it.
#include <ibev/verbs/connection_health.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

#include <ibev/dispatch/dispatcher.h>
#include <ibev/verbs/device.h>
#include "health_core.h"

namespace ibev {
namespace detail {

namespace {

std::optional<RecoveryLadder> ladder_of(const ConnectionHealth::Options& options) {
  if (!options.recovery.reconnect) return std::nullopt;
  return RecoveryLadder(options.recovery.policy, std::random_device{}(), options.recovery.mode,
                        options.initial == ConnectionState::kUp);
}

}  // namespace

HealthCore::HealthCore(Dispatcher& events, HealthHandler handler,
                       ConnectionHealth::Options& options)
    : dispatcher(events.weak_ref()),
      registry(events.shared_registry()),
      subscriber(
          std::make_shared<HealthSubscriber>(std::move(handler), AnyArg{}, options.executor)),
      health(options.initial),
      ladder(ladder_of(options)),  // before `recovery` takes the reconnect callback
      liveness(*this, options),
      recovery(*this, options) {}

// --- The core ---

void HealthCore::assert_dispatching() const noexcept {
#ifndef NDEBUG
  if (auto events = dispatcher.lock()) IBEV_ASSERT_DISPATCHING(*events);
#endif
}

bool HealthCore::cause_locked(HealthCause cause) {
  std::optional<HealthChange> change = health.cause(std::move(cause));
  const bool moved = change.has_value();
  changed(std::move(change));
  return moved;
}

void HealthCore::changed(std::optional<HealthChange> made, bool by_attempt) {
  if (!made) return;
  HealthChange& change = *made;
  std::uint64_t at = 0;
  if (ladder) at = ladder->changed(change.to, Clock::now(), by_attempt);
  if (change.to == ConnectionState::kUp || change.to == ConnectionState::kFailed) {
    liveness.forget_requests();
  }
  const bool went_down = change.to == ConnectionState::kDown;
  const bool new_outage = change.from == ConnectionState::kUp;
  tell(std::move(change));
  if (recovery.reconnecter && went_down) {
    recovery.post_supervise(
        at, new_outage ? RecoveryInput::Kind::kWentDown : RecoveryInput::Kind::kAttemptFailed);
  }
}

std::optional<HealthChange> HealthCore::went_up() {
  auto change = health.up();
  if (change) liveness.restart_clock();
  return change;
}

// No tick and no recovery step after this (the keepalive's and the
// deadlines' timers are released already).
void HealthCore::stop() noexcept {
  {
    MutexLock lock(mutex);
    stopped = true;
    if (ladder) ladder->close();
  }
  recovery.stop();
  liveness.let_go_of_probe();
}

void HealthCore::tell(HealthChange change) {
  auto events = dispatcher.lock();
  if (!events) return;  // the Dispatcher is gone: nothing runs handlers
  events->post([subscriber = subscriber, registry = registry, change = std::move(change)] {
    call(subscriber, change, "connection health handler",
         [registry](const Failure& failure, const HealthChange&) { registry->report(failure); });
  });
}

Failure HealthCore::fail_for_good(const std::string& why) {
  changed(health.fail(HealthCause{HealthSource::kRecovery, 0, 0, why}));
  Failure failure;
  failure.kind = Failure::Kind::kConnectionFailed;
  failure.verb = "ConnectionHealth recovery";
  failure.error = std::make_error_code(std::errc::connection_aborted);
  if (qp) {
    failure.device = qp->device()->context();
    failure.object = qp->get();
    // The number it had: a QP closed by then (its device removed) has none.
    failure.what = "QP " + std::to_string(qp_num.load(std::memory_order_relaxed)) + ": " + why;
  } else {
    failure.what = "no QP yet: " + why;
  }
  return failure;
}

std::shared_ptr<QueuePair> HealthCore::current_qp() {
  MutexLock lock(mutex);
  return qp;
}

// --- The connection: its QP and the listeners of its events ---

std::vector<Handle> HealthCore::wire(const std::shared_ptr<QueuePair>& connection,
                                     std::uint8_t on_port) {
  const Handler listener = [weak = weak_from_this(),
                            heard_qp = std::weak_ptr<QueuePair>(connection)](const Event& event) {
    if (auto self = weak.lock()) self->hear(event, heard_qp);
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

std::vector<Handle> HealthCore::run_on(std::shared_ptr<QueuePair> connection, std::uint8_t on_port,
                                       bool signals_all, std::vector<Handle> heard) {
  qp = std::move(connection);
  qp_num.store(qp->qp_num(), std::memory_order_relaxed);
  port = on_port;
  signal_all = signals_all;
  device_gone = false;
  std::swap(heard, listeners);
  return heard;
}

void HealthCore::hear(const Event& event, const std::weak_ptr<QueuePair>& heard_qp) {
  assert_dispatching();
  const auto open = heard_qp.lock();
  if (!open || open->get() == nullptr) return;
  if (event.code() == IBV_EVENT_PORT_ACTIVE) {
    {
      MutexLock lock(mutex);
      if (open != (incoming ? incoming : qp)) return;
    }
    return recovery.climb({RecoveryInput::Kind::kPortActive}, "PORT_ACTIVE");
  }
  auto cause = HealthCause::of_event(event.code());
  if (!cause) return;
  std::optional<Failure> failed;
  {
    MutexLock lock(mutex);
    if (open != (incoming ? incoming : qp)) return;
    const bool fatal = event.code() == IBV_EVENT_DEVICE_FATAL;
    if (fatal) device_gone = true;
    cause_locked(std::move(*cause));
    // In place, a QP is reset on its own device only: whatever the state,
    // there is nothing left to attempt.
    if (fatal && recovery.reconnecter && recovery.mode == Mode::kResetInPlace && !stopped &&
        health.state() != ConnectionState::kFailed) {
      failed = fail_for_good(
          "IBV_EVENT_DEVICE_FATAL: the device is gone, and a QP is reset "
          "in place on its own device only");
    }
  }
  if (failed) registry->report(*failed);
}

QpFacts check_qp(const std::string& verb, const std::shared_ptr<QueuePair>& qp,
                 std::optional<std::uint8_t> port, const Dispatcher& dispatcher, bool keepalive,
                 bool recovery) {
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

}  // namespace detail

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
                                                         HealthHandler on_change, Options options) {
  const std::string verb = "ConnectionHealth::create";
  if (!on_change) throw std::invalid_argument(verb + ": the handler is empty");
  validate(verb, options);
  const auto& keepalive = options.keepalive;
  const bool recovery = static_cast<bool>(options.recovery.reconnect);
  std::optional<detail::QpFacts> facts;
  if (qp) {
    facts = detail::check_qp(verb, qp, options.port, dispatcher, keepalive.interval.count() > 0,
                             recovery);
  }
  auto shared = std::make_shared<detail::HealthCore>(dispatcher, std::move(on_change), options);
  auto health = std::make_shared<ConnectionHealth>(Token{}, shared);
  const auto keep = [&health](Handle handle) {
    detail::MutexLock lock(health->close_mutex_);
    health->heard_.push_back(std::move(handle));
  };
  // Released last of these: a reconnect call running is waited for after
  // nothing else can start one.
  if (shared->recovery.reconnecter) {
    keep(detail::subscription(
        shared->recovery.reconnecter,
        [process = detail::OwningProcess{}](const auto*) { return !process.inherited(); }));
  }
  const bool made = qp == nullptr;  // by its recovery: the first attempt, at once
  if (qp) {
    // The listeners hold the state weakly: it goes with the ConnectionHealth.
    // Wired in as a replace's QP is, so what they hear before run_on counts.
    {
      detail::MutexLock lock(shared->mutex);
      shared->incoming = qp;
    }
    auto heard = shared->wire(qp, facts->port);
    detail::MutexLock lock(shared->mutex);
    shared->run_on(std::move(qp), facts->port, facts->signal_all, std::move(heard));
    shared->incoming.reset();
  }
  if (keepalive.interval.count() > 0) {
    keep(dispatcher.call_every(keepalive.interval,
                               [weak = std::weak_ptr<detail::HealthCore>(shared)] {
                                 if (auto state = weak.lock()) state->liveness.tick();
                               }));
  }
  if (options.deadline.count() > 0) {
    keep(dispatcher.call_every(std::max(options.deadline / 4, std::chrono::milliseconds(1)),
                               [weak = std::weak_ptr<detail::HealthCore>(shared)] {
                                 if (auto state = weak.lock()) state->liveness.check_deadline();
                               }));
  }
  if (made) {
    detail::MutexLock lock(shared->mutex);
    shared->recovery.post_supervise(shared->ladder->first_attempt(),
                                    RecoveryInput::Kind::kWentDown);
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

ConnectionHealth::ConnectionHealth(Token, std::shared_ptr<detail::HealthCore> shared)
    : shared_(std::move(shared)),
      told_(detail::subscription(shared_->subscriber,
                                 [process = detail::OwningProcess{}](const auto*) {
                                   return !process.inherited();  // no list: nothing to unlink
                                 })) {}

ConnectionHealth::~ConnectionHealth() { close(); }

ConnectionState ConnectionHealth::state() const {
  detail::MutexLock lock(shared_->mutex);
  return shared_->health.state();
}

std::vector<HealthCause> ConnectionHealth::causes() const {
  detail::MutexLock lock(shared_->mutex);
  return shared_->health.causes();
}

void ConnectionHealth::completion(const ibv_wc& wc) { shared_->liveness.completion(wc); }

void ConnectionHealth::post_send(ibv_send_wr& wr, ibv_send_wr** bad_wr) {
  shared_->liveness.post_tracked(wr, bad_wr);
}

void ConnectionHealth::cause(HealthCause cause) {
  detail::MutexLock lock(shared_->mutex);
  shared_->cause_locked(std::move(cause));
}

void ConnectionHealth::recovering() {
  detail::MutexLock lock(shared_->mutex);
  shared_->changed(shared_->health.recovering());
}

void ConnectionHealth::up() {
  bool came_up = false;
  {
    detail::MutexLock lock(shared_->mutex);
    auto change = shared_->went_up();
    came_up = change.has_value();
    shared_->changed(std::move(change));
  }
  if (came_up) shared_->liveness.let_go_of_probe();
}

std::shared_ptr<QueuePair> ConnectionHealth::queue_pair() const { return shared_->current_qp(); }

KeepaliveStats ConnectionHealth::keepalive_stats() const {
  detail::MutexLock lock(shared_->mutex);
  return shared_->liveness.stats();
}

void ConnectionHealth::fail(HealthCause cause) {
  detail::MutexLock lock(shared_->mutex);
  shared_->changed(shared_->health.fail(std::move(cause)));
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
    return release_inherited();
  }
  std::vector<Handle> heard;
  Handle told;
  {
    detail::MutexLock lock(close_mutex_);
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
    detail::MutexLock lock(shared_->mutex);
    listeners.swap(shared_->listeners);
    qp.swap(shared_->qp);
  }
  for (Handle& handle : listeners) handle.release();
  for (auto it = heard.rbegin(); it != heard.rend(); ++it) it->release();
  told.release();
}

void ConnectionHealth::release_inherited() noexcept {
  for (Handle& handle : heard_) handle.release();
  told_.release();
}

void ConnectionHealth::retry_now() {
  shared_->recovery.climb({RecoveryInput::Kind::kRetryNow}, "retry_now()");
}

}  // namespace ibev
