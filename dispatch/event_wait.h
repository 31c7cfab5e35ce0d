// Waiting for one async event of one object, port or device, with a
// timeout: what the kernel's consumers do with a completion around
// IB_EVENT_QP_LAST_WQE_REACHED or IB_EVENT_SQ_DRAINED, and UCX keeps
// "waiters" for.
//
//   ibev::EventWait drained = ibev::wait_for(dispatcher, qp->get(),
//                                            {IBV_EVENT_SQ_DRAINED}, 2s);
//   qp->drain_send_queue();                  // the action, after the wait
//   const ibev::WaitResult r = drained.wait();  // kEvent, kTimedOut, kDeviceLost
//
// Arm the wait before the action that raises the event: it hears only
// events resolved after it was made. It fires once (a latch): an event that
// repeats, as QP_LAST_WQE_REACHED does on Linux 6.12, is absorbed. It also
// ends when the target's device is lost (the DEVICE_FATAL carrying a
// DeviceLoss, core/event.h), with that event; an injected DEVICE_FATAL does
// not end it. The wait is one more handler of the object (Registry::attach)
// or listener of the device: the object's own handler still hears the event.
//
// Two forms. EventWait blocks an application thread in wait(); calling it
// on the dispatching thread, which delivers what it waits for, throws
// std::logic_error. The callback form never blocks anyone: `done` runs once,
// on the dispatching thread unless given an executor, with the event, the
// loss, or kTimedOut from a timer in the Dispatcher's loop (call_after).
// Dropping either (EventWait or the Handle) cancels the wait, under the rule
// of core/handle.h: released on another thread it returns when `done` is not
// running and never will.
//
// Thread-safety: wait_for() may be called from any thread, the handlers and
// the dispatching thread included. An EventWait is one thread's at a time.
#ifndef IBEV_DISPATCH_EVENT_WAIT_H_
#define IBEV_DISPATCH_EVENT_WAIT_H_

#include <infiniband/verbs.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <variant>

#include <ibev/core/event.h>
#include <ibev/core/event_filter.h>
#include <ibev/core/executor.h>
#include <ibev/core/handle.h>
#include <ibev/dispatch/dispatcher.h>

namespace ibev {

struct WaitResult {
  enum class Outcome { kEvent, kTimedOut, kDeviceLost };
  Outcome outcome = Outcome::kTimedOut;
  // kEvent: the event that came; kDeviceLost: the DEVICE_FATAL saying so.
  std::optional<Event> event;
};
std::string_view to_string(WaitResult::Outcome outcome) noexcept;

using WaitCallback = std::function<void(const WaitResult& result)>;

// An object (its events), or a device (its port and device events; the
// filter's port, if any, narrows to one port).
using WaitTarget = std::variant<ibv_cq*, ibv_qp*, ibv_srq*, ibv_wq*, ibv_context*>;

namespace detail {
struct WaitLatch;
}  // namespace detail

class EventWait {
 public:
  EventWait() = default;
  EventWait(EventWait&&) noexcept = default;
  EventWait& operator=(EventWait&&) noexcept = default;

  // Blocks until the event, the device's loss or the timeout; then the wait
  // is over (nothing more is heard) and each call returns the same result.
  // Throws std::logic_error on the dispatching thread, or for an empty or
  // cancelled EventWait.
  WaitResult wait();
  // What it ended with, without blocking; nullopt while it waits.
  std::optional<WaitResult> result() const;
  // Stops waiting; wait() then throws std::logic_error.
  void cancel() noexcept;

 private:
  friend EventWait wait_for(Dispatcher&, WaitTarget, EventFilter, std::chrono::milliseconds);
  EventWait(std::shared_ptr<detail::WaitLatch> latch, std::chrono::steady_clock::time_point deadline,
            Handle subscriptions, const Dispatcher* dispatcher)
      : latch_(std::move(latch)),
        deadline_(deadline),
        subscriptions_(std::move(subscriptions)),
        dispatcher_(dispatcher) {}

  std::shared_ptr<detail::WaitLatch> latch_;
  std::chrono::steady_clock::time_point deadline_{};
  Handle subscriptions_;
  const Dispatcher* dispatcher_ = nullptr;
};

// The blocking form. Throws std::invalid_argument (a null target, a filter
// naming events the target does not carry, a timeout not above zero) or
// what Registry::attach/listen throw.
EventWait wait_for(Dispatcher& dispatcher, WaitTarget target, EventFilter filter,
                   std::chrono::milliseconds timeout);

// The callback form; also throws what Dispatcher::call_after throws.
Handle wait_for(Dispatcher& dispatcher, WaitTarget target, EventFilter filter,
                std::chrono::milliseconds timeout, WaitCallback done, Executor executor = {});

}  // namespace ibev

#endif  // IBEV_DISPATCH_EVENT_WAIT_H_
