// Recovery's steps: what health/recovery.h's ladder decides, carried out.
// When to attempt, wait or give up is the ladder's; what is here is how to
// do a step with the QP at hand (a QP to be replaced whose drain cannot be
// made is replaced all the same; in place, a DEVICE_FATAL fails at once,
// connection_health.cc). Each step tells the ladder what happened (climb())
// and does the one action it answers, stamped with the ladder's step; a
// step whose stamp is no longer current does nothing.
//
// The way of one outage: a down change (core) posts supervise(), which asks
// the port and climbs: wait (a timer, or PORT_ACTIVE); then drain() (the QP,
// through its Dispatcher); then reconnect() (in place the QP reset with a
// fresh PSN), the state recovering, and the application's reconnect
// callback with a RecoveryAttempt; its connect() or replace() brings the
// connection up (recovered(), replaced()). A failure anywhere is
// attempt_failed(): a cause, and the ladder's next rung.
// Locking: health_core.h's.
#include <cerrno>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

#include <ibev/dispatch/dispatcher.h>
#include <ibev/verbs/device.h>
#include "health_core.h"

namespace ibev {
namespace detail {

HealthCore::RecoverySteps::RecoverySteps(HealthCore& core, ConnectionHealth::Options& options)
    : mode(options.recovery.mode), connect_options(options.recovery.connect), core_(core) {
  if (options.recovery.reconnect) {
    reconnecter = std::make_shared<ReconnectSubscriber>(std::move(options.recovery.reconnect),
                                                        AnyArg{}, options.executor);
  }
}

void HealthCore::RecoverySteps::post_supervise(std::uint64_t at, RecoveryInput::Kind kind) {
  core_.mutex.assert_held();
  if (auto events = core_.dispatcher.lock()) {
    events->post([weak = core_.weak_from_this(), at, kind] {
      if (auto self = weak.lock()) self->recovery.supervise(at, kind);
    });
  }
}

// Asked here rather than remembered: on the Dispatcher's thread, as
// PORT_ACTIVE is heard, so an activation after this finds the wait held for
// it. A port that cannot be asked is taken as up: the attempt will say. A
// QP on a device that is gone has no port to wait for (a QP replacing it
// may be on another device); nor has a connection with no QP yet.
void HealthCore::RecoverySteps::supervise(std::uint64_t at, RecoveryInput::Kind kind) {
  core_.assert_dispatching();
  std::shared_ptr<QueuePair> connection;
  std::uint8_t on_port = 1;
  {
    MutexLock lock(core_.mutex);
    if (!core_.current(at)) return;
    if (!core_.device_gone) connection = core_.qp;
    on_port = core_.port;
  }
  bool port_active = true;
  if (connection) {
    try {
      port_active = connection->device()->query_port(on_port).state == IBV_PORT_ACTIVE;
    } catch (const std::exception&) {
    }
  }
  climb({kind, at, port_active});
}

void HealthCore::RecoverySteps::climb(const RecoveryInput& input, const std::string& why) {
  RecoveryAction action;
  std::optional<Failure> failed;
  std::chrono::milliseconds give_up_after{0};
  {
    MutexLock lock(core_.mutex);
    if (!core_.ladder) return;
    action = core_.ladder->next(input, Clock::now());
    give_up_after = core_.ladder->policy().give_up_after;
    switch (action.kind) {
      case RecoveryAction::Kind::kFail:
        failed = core_.fail_for_good(action.why);
        break;
      case RecoveryAction::Kind::kAbort:
        // The change to down supervises the next attempt.
        core_.cause_locked(HealthCause{HealthSource::kRecovery, 0, 0,
                                       "attempt " + std::to_string(core_.ladder->attempt_number()) +
                                           ": " + why + " came during it"});
        break;
      default:
        break;
    }
  }
  if (failed) return core_.registry->report(*failed);
  switch (action.kind) {
    case RecoveryAction::Kind::kWait:
      if (action.outage_began) {
        arm(&RecoverySteps::give_up_timer_, give_up_after, action.step,
            [weak = core_.weak_from_this()] {
              if (auto self = weak.lock()) self->recovery.climb({RecoveryInput::Kind::kOverdue});
            });
      }
      if (action.delay) {
        arm(&RecoverySteps::retry_timer_, *action.delay, action.step,
            [weak = core_.weak_from_this(), at = action.step] {
              if (auto self = weak.lock()) self->recovery.climb({RecoveryInput::Kind::kWaited, at});
            });
      }
      return;
    case RecoveryAction::Kind::kDrain:
      return drain(action.step);
    case RecoveryAction::Kind::kReset:
    case RecoveryAction::Kind::kReconnect:
      return reconnect(action.step);
    default:
      return;
  }
}

// Without the lock: a timer for `task`, kept in `slot` while step `at` is
// current; the one it replaces, or it if stale, released here. A timer that
// cannot be made fails the connection (nothing else would retry).
template <typename Task>
void HealthCore::RecoverySteps::arm(Handle HealthCore::RecoverySteps::*slot,
                                    std::chrono::milliseconds delay, std::uint64_t at, Task task) {
  auto events = core_.dispatcher.lock();
  if (!events) return;
  Handle timer;
  try {
    timer = events->call_after(delay, std::move(task));
  } catch (const std::exception& e) {
    std::optional<Failure> failed;
    {
      MutexLock lock(core_.mutex);
      if (core_.current(at)) failed = core_.fail_for_good(std::string("no timer: ") + e.what());
    }
    if (failed) core_.registry->report(*failed);
    return;
  }
  MutexLock lock(core_.mutex);
  if (core_.current(at)) std::swap(this->*slot, timer);
}  // `timer` (the old one, or the stale new one) released here, after the lock

// The wait is over: drain the QP, so that everything posted before has
// completed and the CQ's handler has had it. A QP in RESET (an attempt
// before this one reset it and failed) holds nothing to drain; a QP to be
// replaced on a device that is gone, or none, cannot drain (nothing posted
// on it was delivered), and one whose drain fails is replaced all the same.
void HealthCore::RecoverySteps::drain(std::uint64_t at) {
  std::shared_ptr<QueuePair> connection;
  {
    MutexLock lock(core_.mutex);
    if (!core_.current(at)) return;
    connection = core_.qp;
    if (mode == Mode::kReconnect && (!core_.qp_open() || core_.device_gone)) connection.reset();
  }
  const auto drained = [weak = core_.weak_from_this(), at](std::error_code error) {
    auto self = weak.lock();
    if (!self) return;
    if (error && self->recovery.mode == Mode::kResetInPlace) {
      return self->recovery.attempt_failed(at, "drain: " + error.message(), error.value());
    }
    self->recovery.climb({RecoveryInput::Kind::kDrained, at});
  };
  if (mode == Mode::kReconnect && !connection) return drained({});
  try {
    if (!connection || connection->get() == nullptr) {
      throw std::system_error(ENODEV, std::generic_category(), "the QP is closed");
    }
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    if (const int rc = ibv_query_qp(connection->get(), &attr, IBV_QP_STATE, &init); rc != 0) {
      throw_system_error("ibv_query_qp", rc);
    }
    if (attr.qp_state == IBV_QPS_RESET) return drained({});
    connection->drain_async(
        DrainOptions{}, [drained](const DrainReport&, std::error_code error) { drained(error); });
  } catch (const std::exception& e) {
    if (mode == Mode::kReconnect)
      return drained(std::error_code(errno_of(e), std::generic_category()));
    attempt_failed(at, "drain: " + std::string(e.what()), errno_of(e));
  }
}

// Drained: in place the QP reset with a fresh PSN; then recovering, then
// the application's reconnect with the attempt.
void HealthCore::RecoverySteps::reconnect(std::uint64_t at) {
  auto made = std::make_shared<Attempt>();
  {
    MutexLock lock(core_.mutex);  // the QP and whether it is still ours, read together
    made->qp = core_.qp;
    if (!core_.current(at)) {
      made->settled = true;  // closed, or moved on meanwhile: the QP is not ours to reset
      return;
    }
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
  made->health = core_.weak_from_this();
  MutexLock lock(core_.mutex);
  if (!core_.current(at)) {
    made->settled = true;  // nothing to report: what made it stale is told
    return;
  }
  made->number = core_.ladder->attempt_number();
  const auto& causes = core_.health.causes();
  made->cause = causes.empty() ? HealthCause{} : causes.front();
  made->undelivered = core_.liveness.undelivered_now();
  core_.changed(core_.health.recovering());
  made->step = core_.ladder->step();
  // Posted after the change, so the handler hears recovering first.
  auto events = core_.dispatcher.lock();
  if (!events) {
    made->settled = true;
    return;
  }
  events->post([reconnecter = reconnecter, registry = core_.registry,
                attempt = RecoveryAttempt(made)] {
    call(reconnecter, attempt, "connection recovery's reconnect",
         [registry](const Failure& failure, const RecoveryAttempt&) { registry->report(failure); });
  });
}

// An attempt failed: a cause. Recovering goes down (changed() supervises);
// failed before it came to recovering (the drain, the reset), the state is
// down already, and the ladder is told so here.
void HealthCore::RecoverySteps::attempt_failed(std::uint64_t at, const std::string& why, int code) {
  MutexLock lock(core_.mutex);
  if (!core_.current(at)) return;
  if (core_.cause_locked(
          HealthCause{HealthSource::kRecovery, code, 0,
                      "attempt " + std::to_string(core_.ladder->attempt_number()) + ": " + why})) {
    return;
  }
  post_supervise(core_.ladder->failed_early(), RecoveryInput::Kind::kAttemptFailed);
}

// RecoveryAttempt::connect succeeded: up, counted in the damping window (a
// connection's first up is not a recovery).
bool HealthCore::RecoverySteps::recovered(std::uint64_t at) {
  {
    MutexLock lock(core_.mutex);
    if (!core_.current(at)) return false;
    core_.changed(core_.went_up(), true);
  }
  core_.liveness.let_go_of_probe();
  return true;
}

// RecoveryAttempt::replace: `next` is the connection's QP, listened to
// before it is (so that no event of it is missed; one heard before the swap
// is a cause of the attempt, and the old QP's are no longer), and up.
bool HealthCore::RecoverySteps::replaced(std::uint64_t at, std::shared_ptr<QueuePair> next,
                                         std::uint8_t on_port, bool signals_all) {
  {
    MutexLock lock(core_.mutex);
    if (!core_.current(at)) return false;
    core_.incoming = next;
  }
  std::vector<Handle> heard;
  try {
    heard = core_.wire(next, on_port);
  } catch (...) {
    MutexLock lock(core_.mutex);
    if (core_.incoming == next) core_.incoming.reset();  // the old QP's events count again
    throw;
  }
  {
    MutexLock lock(core_.mutex);
    if (core_.incoming == next) core_.incoming.reset();
    if (!core_.current(at)) return false;  // `heard` released after the lock
    heard = core_.run_on(std::move(next), on_port, signals_all, std::move(heard));
    core_.changed(core_.went_up(), true);
  }
  heard.clear();  // the old QP's listeners, after the lock
  core_.liveness.let_go_of_probe();
  return true;
}

bool HealthCore::RecoverySteps::still(std::uint64_t at) {
  MutexLock lock(core_.mutex);
  return core_.current(at);
}

// No step after this (the ladder is closed): the timers go.
void HealthCore::RecoverySteps::stop() noexcept {
  Handle retry, overdue;
  {
    MutexLock lock(core_.mutex);
    std::swap(retry, retry_timer_);
    std::swap(overdue, give_up_timer_);
  }
}  // released here, outside the lock

// --- The attempt the application holds ---

Attempt::~Attempt() {
  if (settled) return;
  if (auto shared = health.lock()) {
    shared->recovery.attempt_failed(
        step, "abandoned: none of connect(), replace() or fail() was called", 0);
  }
}

void Attempt::settle(const char* verb) {
  if (settled.exchange(true)) {
    throw std::system_error(EALREADY, std::generic_category(),
                            std::string(verb) + ": this attempt was settled already");
  }
}

namespace {

std::system_error cancelled(const char* verb) {
  return std::system_error(ECANCELED, std::generic_category(),
                           std::string(verb) + ": the recovery ended (failed or closed)");
}

}  // namespace

std::shared_ptr<HealthCore> Attempt::begin(const char* verb) {
  settle(verb);
  auto shared = health.lock();
  if (!shared || !shared->recovery.still(step)) throw cancelled(verb);
  return shared;
}

}  // namespace detail

unsigned RecoveryAttempt::number() const noexcept { return attempt_->number; }
std::uint64_t RecoveryAttempt::step() const noexcept { return attempt_->step; }
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
    if (shared->recovery.mode != detail::Mode::kResetInPlace) {
      throw std::invalid_argument(std::string(verb) +
                                  ": Mode::kReconnect replaces the QP (RecoveryAttempt::replace)");
    }
    attempt.qp->connect(remote, shared->recovery.connect_options);
  } catch (const std::exception& e) {
    shared->recovery.attempt_failed(attempt.step, "connect: " + std::string(e.what()), errno_of(e));
    throw;
  }
  if (!shared->recovery.recovered(attempt.step)) throw detail::cancelled(verb);
}

void RecoveryAttempt::replace(std::shared_ptr<QueuePair> qp) const {
  constexpr const char* verb = "RecoveryAttempt::replace";
  detail::Attempt& attempt = *attempt_;
  auto shared = attempt.begin(verb);
  try {
    if (shared->recovery.mode != detail::Mode::kReconnect) {
      throw std::invalid_argument(std::string(verb) +
                                  ": Mode::kResetInPlace keeps the QP (RecoveryAttempt::connect)");
    }
    auto events = shared->dispatcher.lock();
    if (!events) throw detail::cancelled(verb);
    const detail::QpFacts facts = detail::check_qp(
        verb, qp, std::nullopt, *events, shared->liveness.keepalive.interval.count() > 0, true);
    if (!shared->recovery.replaced(attempt.step, std::move(qp), facts.port, facts.signal_all)) {
      throw detail::cancelled(verb);
    }
  } catch (const std::exception& e) {
    shared->recovery.attempt_failed(attempt.step, "replace: " + std::string(e.what()), errno_of(e));
    throw;
  }
}

bool RecoveryAttempt::current() const {
  auto shared = attempt_->health.lock();
  return !attempt_->settled && shared && shared->recovery.still(attempt_->step);
}

void RecoveryAttempt::fail(const std::string& why) const {
  attempt_->settle("RecoveryAttempt::fail");
  if (auto shared = attempt_->health.lock())
    shared->recovery.attempt_failed(attempt_->step, why, 0);
}

}  // namespace ibev
