// A wait is a latch fed by up to three subscriptions: the target's event
// (an object handler or a device listener), the target device's loss (a
// DEVICE_FATAL listener), and, in the callback form, a timer in the
// Dispatcher's loop (Dispatcher::call_after). The first to fire the latch decides; the others are
// absorbed. The blocking form times out on its own clock instead of a timer.
//
// Locking: the latch's mutex guards its result and is held only to set or
// read it, never while a callback runs.
#include <ibev/dispatch/event_wait.h>

#include <condition_variable>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ibev/core/failure.h>
#include <ibev/core/thread_annotations.h>

namespace ibev {
namespace detail {

struct WaitLatch {
  // True for the one call that decides the result.
  bool fire(WaitResult result) IBEV_EXCLUDES(mutex) {
    MutexLock lock(mutex);
    if (this->result) return false;
    this->result = std::move(result);
    fired.notify_all();
    return true;
  }

  Mutex mutex;
  std::condition_variable fired;
  std::optional<WaitResult> result IBEV_GUARDED_BY(mutex);
};

}  // namespace detail

namespace {

ibv_context* device_of(const WaitTarget& target) {
  return std::visit([](auto* object) -> ibv_context* {
    if (object == nullptr) throw std::invalid_argument("ibev::wait_for: the target is null");
    if constexpr (std::is_same_v<decltype(object), ibv_context*>) {
      return object;
    } else {
      return object->context;
    }
  }, target);
}

// Several handles as one, released newest first.
Handle combine(std::vector<Handle> handles) {
  auto held = std::make_shared<std::vector<Handle>>(std::move(handles));
  return Handle([held]() noexcept {
    for (auto it = held->rbegin(); it != held->rend(); ++it) it->release();
  });
}

// The target's event and its device's loss, each into `on`.
std::vector<Handle> subscribe(Registry& registry, const WaitTarget& target,
                              const EventFilter& filter,
                              const std::function<void(WaitResult)>& on,
                              const Executor& executor) {
  ibv_context* device = device_of(target);
  const Handler heard = [on](const Event& event) {
    on(WaitResult{WaitResult::Outcome::kEvent, event});
  };
  std::vector<Handle> handles;
  handles.push_back(std::visit(
      [&](auto* object) {
        if constexpr (std::is_same_v<decltype(object), ibv_context*>) {
          return registry.listen(object, filter, heard, executor);
        } else {
          return registry.attach(object, filter, heard, executor);
        }
      },
      target));
  handles.push_back(registry.listen(
      device, EventFilter{IBV_EVENT_DEVICE_FATAL},
      [on](const Event& event) {
        if (event.loss() != DeviceLoss::kNone) {
          on(WaitResult{WaitResult::Outcome::kDeviceLost, event});
        }
      },
      executor));
  return handles;
}

void require_positive(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) {
    throw std::invalid_argument("ibev::wait_for: the timeout must be above zero, not " +
                                std::to_string(timeout.count()) + " ms");
  }
}

}  // namespace

std::string_view to_string(WaitResult::Outcome outcome) noexcept {
  switch (outcome) {
    case WaitResult::Outcome::kEvent:
      return "event";
    case WaitResult::Outcome::kTimedOut:
      return "timed out";
    case WaitResult::Outcome::kDeviceLost:
      return "device lost";
  }
  return "unknown";
}

EventWait wait_for(Dispatcher& dispatcher, WaitTarget target, EventFilter filter,
                   std::chrono::milliseconds timeout) {
  require_positive(timeout);
  auto latch = std::make_shared<detail::WaitLatch>();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Handle subscriptions = combine(subscribe(
      dispatcher.registry(), target, filter,
      [latch](WaitResult result) { latch->fire(std::move(result)); }, {}));
  return EventWait(std::move(latch), deadline, std::move(subscriptions), &dispatcher);
}

Handle wait_for(Dispatcher& dispatcher, WaitTarget target, EventFilter filter,
                std::chrono::milliseconds timeout, WaitCallback done, Executor executor) {
  require_positive(timeout);
  if (!done) throw std::invalid_argument("ibev::wait_for: the callback is empty");
  auto latch = std::make_shared<detail::WaitLatch>();
  auto on = [latch, done = std::move(done)](WaitResult result) {
    if (latch->fire(result)) done(result);
  };
  std::vector<Handle> handles = subscribe(dispatcher.registry(), target, filter, on, executor);

  handles.push_back(dispatcher.call_after(
      timeout, [on] { on(WaitResult{WaitResult::Outcome::kTimedOut, std::nullopt}); }, executor));
  return combine(std::move(handles));
}

WaitResult EventWait::wait() {
  if (!latch_ || (!subscriptions_.active() && !result())) {
    throw std::logic_error("EventWait::wait: nothing to wait for (empty or cancelled)");
  }
  if (dispatcher_ != nullptr && dispatcher_->in_dispatcher_thread()) {
    throw std::logic_error(
        "EventWait::wait: called on the dispatching thread, which delivers what it waits "
        "for; use the callback form of ibev::wait_for there");
  }
  WaitResult outcome;
  {
    detail::UniqueLock lock(latch_->mutex);
    if (!latch_->fired.wait_until(lock.native(), deadline_,
                                  [&]() IBEV_REQUIRES(latch_->mutex) {
                                    return latch_->result.has_value();
                                  })) {
      latch_->result = WaitResult{WaitResult::Outcome::kTimedOut, std::nullopt};
    }
    outcome = *latch_->result;
  }
  subscriptions_.release();
  return outcome;
}

std::optional<WaitResult> EventWait::result() const {
  if (!latch_) return std::nullopt;
  detail::MutexLock lock(latch_->mutex);
  return latch_->result;
}

void EventWait::cancel() noexcept { subscriptions_.release(); }

}  // namespace ibev
