// A session's path, top-down: its health (Mode::kReconnect) calls
// attempt() once per attempt, after the old QP is drained; the attempt
// closes the old id and makes the new one (active: resolve, route, MakeQp,
// connect; passive: MakeQp, accept the peer's request, or wait for one);
// heard() takes the id's CM events, and ESTABLISHED replaces the health's
// QP, bringing the session up. A CM event of an id the session has moved
// on from is not its news. The acceptor that hands a passive link its
// requests is cm_session.cc's.
//
// Locking: CmLink::mutex, and nothing under it: no CM call, no health call,
// no callback and no id closed (closing an id waits for its running
// handler, which may be waiting for that lock).
#include "cm_link.h"

#include <cerrno>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

#include <ibev/core/failure.h>

namespace ibev {
namespace detail {

void CmLink::attempt(const RecoveryAttempt& next) {
  std::shared_ptr<CmId> old;
  std::shared_ptr<CmId> request;
  std::uint64_t at;
  {
    MutexLock lock(mutex);
    if (closed) return;  // dropped: abandoned, and stale anyway
    at = next.step();
    in_progress = next;
    std::swap(old, current);
    if (role == Role::kPassive) {
      std::swap(request, waiting);
      current = request;  // accepting it from now on: a newer request fails this attempt
    }
  }
  hang_up(old);
  if (role == Role::kActive) return resolve(at, next);
  if (request) accept(at, std::move(request), next);
  // else: waiting for the peer's request (or give_up_after)
}

void CmLink::resolve(std::uint64_t at, const RecoveryAttempt& attempt) {
  try {
    auto next = CmId::create(channel, hearing(), CmId::Options{RDMA_PS_TCP, executor});
    if (!adopt(at, next)) return next->close();
    next->resolve_addr(source ? &*source : nullptr, destination, resolve_timeout);
  } catch (const std::exception& e) {
    fail(at, attempt, e.what());
  }
}

void CmLink::accept(std::uint64_t at, std::shared_ptr<CmId> request,
                    const RecoveryAttempt& attempt) {
  try {
    if (!adopt(at, request)) return;  // dropped: rejected
    auto qp = made(*request, attempt);
    request->accept(std::move(qp), connect);
  } catch (const std::exception& e) {
    fail(at, attempt, e.what());
  }
}

bool CmLink::adopt(std::uint64_t at, const std::shared_ptr<CmId>& next) {
  Handle timer = channel->dispatcher().call_after(connect_timeout, [weak = weak_from_this(), at] {
    if (auto self = weak.lock()) self->timed_out(at);
  });
  MutexLock lock(mutex);
  if (!attempting(at)) return false;
  current = next;
  std::swap(timer, connect_timer);
  return true;
}  // the timer replaced (or the unused one) released after the lock

void CmLink::timed_out(std::uint64_t at) noexcept {
  std::optional<RecoveryAttempt> attempt;
  {
    MutexLock lock(mutex);
    if (!attempting(at)) return;
    attempt = in_progress;
  }
  fail(at, *attempt, "not ESTABLISHED in " + std::to_string(connect_timeout.count()) + " ms");
}

std::shared_ptr<QueuePair> CmLink::made(CmId& on, const RecoveryAttempt& attempt) {
  auto qp = make_qp(on, attempt);
  if (!qp) throw std::invalid_argument("MakeQp gave no QP");
  return qp;
}

void CmLink::settled(std::uint64_t at) noexcept {
  Handle timer;
  MutexLock lock(mutex);
  if (!attempting(at)) return;
  in_progress.reset();
  std::swap(timer, connect_timer);
}  // released after the lock

void CmLink::fail(std::uint64_t at, const RecoveryAttempt& attempt,
                  const std::string& why) noexcept {
  settled(at);
  try {
    attempt.fail(why);
  } catch (const std::exception&) {
  }
}

CmHandler CmLink::hearing() {
  return [weak = weak_from_this()](const CmEvent& event) {
    if (auto self = weak.lock()) self->heard(event);
  };
}

void CmLink::heard(const CmEvent& event) noexcept {
  try {
    hear(event);
  } catch (const std::exception& e) {
    channel->dispatcher().registry().report(
        Failure::verb_failed("CmSession: " + event.name(), errno_of(e), e.what()));
  }
}

void CmLink::hear(const CmEvent& event) {
  std::shared_ptr<CmId> on;
  std::shared_ptr<CmId> gone;
  std::optional<RecoveryAttempt> attempt;
  std::shared_ptr<ConnectionHealth> told;
  std::uint64_t at = 0;
  {
    MutexLock lock(mutex);
    if (closed) return;
    // A request not taken yet whose device is gone goes (so can the
    // device); whatever else it hears is the next attempt's to find.
    if (waiting && waiting.get() == event.id && event.code == RDMA_CM_EVENT_DEVICE_REMOVAL) {
      std::swap(gone, waiting);
    } else if (current && current.get() == event.id) {
      on = current;
      attempt = in_progress;
      if (attempt) at = attempt->step();
      told = health.lock();
    }
  }
  if (gone) gone->close();
  if (!on) return;  // an id moved on from
  const std::string what =
      event.name() +
      (event.status != 0 ? " (status " + std::to_string(event.status) + ")" : std::string());
  try {
    switch (event.code) {
      case RDMA_CM_EVENT_ADDR_RESOLVED:
        on->resolve_route(resolve_timeout);
        return;
      case RDMA_CM_EVENT_ROUTE_RESOLVED:
        if (attempt) on->connect(made(*on, *attempt), connect);
        return;
      case RDMA_CM_EVENT_ESTABLISHED:
        return established(at, on, attempt);
      case RDMA_CM_EVENT_DISCONNECTED:
        answer(*on);
        break;
      case RDMA_CM_EVENT_DEVICE_REMOVAL:
        forget(on);
        on->close();  // the device goes once its ids do
        break;
      default:
        break;
    }
  } catch (const std::exception& e) {
    if (attempt) fail(at, *attempt, what + ": " + e.what());
    return;
  }
  // A cause: during an attempt, the attempt's failure; else the health's.
  const bool error =
      event.code == RDMA_CM_EVENT_ADDR_ERROR || event.code == RDMA_CM_EVENT_ROUTE_ERROR;
  auto cause = health_cause_of_cm_event(event.code);
  if (!cause && !error) return;
  if (attempt) return fail(at, *attempt, what);
  if (cause && told) {
    cause->what = what;
    told->cause(std::move(*cause));
  }
}

void CmLink::established(std::uint64_t at, const std::shared_ptr<CmId>& on,
                         const std::optional<RecoveryAttempt>& attempt) {
  bool taken = false;
  if (attempt) {
    settled(at);
    try {
      attempt->replace(on->queue_pair());
      taken = true;
    } catch (const std::exception&) {
      // replace() failed the attempt (or it was over): the id is retired below.
    }
  }
  std::shared_ptr<CmId> dropped;
  {
    MutexLock lock(mutex);
    if (!taken && current == on) current.reset();
    if (taken) std::swap(dropped, waiting);  // a request older than this connection
  }
  if (dropped) dropped->close();  // rejected
  if (!taken) hang_up(on);
}

void CmLink::hang_up(const std::shared_ptr<CmId>& on) noexcept {
  if (!on) return;
  if (on->queue_pair()) answer(*on);
  on->close();
}

void CmLink::answer(CmId& on) noexcept {
  try {
    on.disconnect();
  } catch (const std::exception&) {
  }
}

void CmLink::forget(const std::shared_ptr<CmId>& on) {
  MutexLock lock(mutex);
  if (current == on) current.reset();
}

void CmLink::requested(std::shared_ptr<CmId> request) {
  std::optional<RecoveryAttempt> attempt;
  std::shared_ptr<ConnectionHealth> told;
  std::uint64_t at;
  bool accepting = false;
  {
    MutexLock lock(mutex);
    if (closed) return;  // `request` dropped: rejected
    attempt = in_progress;
    at = attempt ? attempt->step() : 0;
    accepting = current != nullptr;
    told = health.lock();
  }
  // Taken by the attempt waiting for it, if it still is (a cause since
  // made it stale: the next attempt takes the request).
  if (attempt && !accepting && attempt->current()) {
    return accept(at, std::move(request), *attempt);
  }
  std::shared_ptr<CmId> dropped;
  {
    MutexLock lock(mutex);
    if (closed) return;
    dropped = std::move(waiting);
    waiting = std::move(request);
  }
  if (dropped) dropped->close();  // rejected
  if (attempt && accepting) fail(at, *attempt, "the peer asked again");
  if (!told) return;
  if (told->state() == ConnectionState::kUp) {
    told->cause(HealthCause{HealthSource::kCmEvent, RDMA_CM_EVENT_CONNECT_REQUEST, 0,
                            "RDMA_CM_EVENT_CONNECT_REQUEST: the peer connects again"});
  } else {
    told->retry_now();
  }
}

bool CmLink::live() {
  std::shared_ptr<ConnectionHealth> told;
  {
    MutexLock lock(mutex);
    if (closed) return false;
    told = health.lock();
  }
  return told && told->state() != ConnectionState::kFailed;
}

void CmLink::close() noexcept {
  std::vector<std::shared_ptr<CmId>> ids;
  Handle timer;
  {
    MutexLock lock(mutex);
    if (closed) return;
    closed = true;
    ids.push_back(std::move(current));
    ids.push_back(std::move(waiting));
    in_progress.reset();
    std::swap(timer, connect_timer);
  }
  for (auto& on : ids) hang_up(on);
  if (on_close) on_close();
}

// The health a session's link steers: its recovery replaces the QP through
// the link, the state starts down (the first connect is the first attempt),
// and a failed session lets its ids go (the peer hears it) before the
// application's handler hears of it.
std::shared_ptr<ConnectionHealth> session_health(Dispatcher& dispatcher,
                                                 const std::shared_ptr<CmLink>& link,
                                                 HealthHandler on_change,
                                                 ConnectionHealth::Options options) {
  options.initial = ConnectionState::kDown;
  options.recovery.mode = ConnectionHealth::Options::Recovery::Mode::kReconnect;
  options.recovery.reconnect = [weak = std::weak_ptr<CmLink>(link)](const RecoveryAttempt& a) {
    if (auto self = weak.lock()) self->attempt(a);
  };
  auto health = ConnectionHealth::create(
      dispatcher,
      [weak = std::weak_ptr<CmLink>(link),
       on_change = std::move(on_change)](const HealthChange& change) {
        if (change.to == ConnectionState::kFailed) {
          if (auto self = weak.lock()) self->close();
        }
        on_change(change);
      },
      std::move(options));
  MutexLock lock(link->mutex);
  link->health = health;
  return health;
}

}  // namespace detail
}  // namespace ibev
