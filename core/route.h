// Internal to ibev: the one routing primitive. Every list of callbacks ibev
// keeps (an object's event handlers, a device's listeners, the unclaimed
// observers, device watchers, device clients, CM ids) is made of these
// pieces, so they share one snapshot rule, one guarded call and one release.
//
//  - A Subscriber is one subscription: its callback, the filter it asked for,
//    the Executor it runs on (none: the calling thread) and the CallGuard its
//    release waits on.
//  - A Snapshot is who hears one thing, fixed when it was taken; a
//    subscription made after that does not hear it, one released after it is
//    skipped. Routing takes it when it resolves an event (before the ack, so
//    an event for an object reaches that object's handlers, never those of a
//    newer object at the same address).
//  - deliver() is the one guarded call: filter; skip if released; run inline
//    or hand a task to the executor (a refusal is a failure); inside the
//    guard; what the callback throws becomes a Failure for `report`. Its
//    executor hand-off, hand_to(), is also that of the fd and completion
//    sources (dispatch/), which have no list.
//  - unsubscribe() is the one release, the wait rule of core/handle.h:
//    close (no call starts), unlink, wait for calls on other threads; in a
//    forked child, a list inherited from the parent is left as it is.
//    subscription() makes the Handle that calls it.
//
// The lists that hold subscribers, and take snapshots of them, are in
// core/subscriber_lists.h.
//
// Thread-safety: a Snapshot may be delivered on any thread, concurrently; no
// lock is held while a callback runs, so callbacks may subscribe, release
// (their own handle too) and deliver.
#ifndef IBEV_CORE_ROUTE_H_
#define IBEV_CORE_ROUTE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ibev/core/call_guard.h>
#include <ibev/core/executor.h>
#include <ibev/core/failure.h>
#include <ibev/core/handle.h>

namespace ibev::detail {

// The filter of a subscription that hears everything it is told.
struct AnyArg {
  template <typename Arg>
  bool matches(const Arg&) const noexcept {
    return true;
  }
};

template <typename Arg, typename Filter = AnyArg>
struct Subscriber {
  using Argument = Arg;
  using Callback = std::function<void(const Arg&)>;

  Subscriber(Callback c, Filter f = {}, Executor e = {})
      : callback(std::move(c)),
        filter(std::move(f)),
        executor(e ? std::make_unique<const Executor>(std::move(e)) : nullptr) {}

  CallGuard guard;  // release waits on it
  const Callback callback;
  const Filter filter;
  // Null: the delivering thread. Held apart because few subscriptions name
  // one, and a Subscriber is made per QP and CQ.
  const std::unique_ptr<const Executor> executor;
};

// Runs `call` inside `guard` unless the guard is closed (released); returns
// whether it ran.
template <typename Call>
bool guarded_call(CallGuard& guard, const Call& call) noexcept {
  const auto entered = guard.enter();
  if (entered) call();
  return static_cast<bool>(entered);
}

// The executor hand-off: hands `executor` a task that runs the call
// `make_call()` returns inside `guard` (guarded_call), so not at all once
// the guard is closed. make_call runs only here, never on a path without an
// executor: the call holds what it needs where the executor runs it (its
// owner, which keeps `guard`; copies of what it reads). Returns false, and
// reports, when making it (its captures' copies) or the executor (refusing
// it) threw. `what` names the task for the report ("a completion batch").
template <typename MakeCall, typename Report>
bool hand_to(const Executor& executor, CallGuard& guard, const MakeCall& make_call,
             const char* what, const Report& report) noexcept {
  if (auto threw = exception_text([&] {
        executor([&guard, call = make_call()]() noexcept { guarded_call(guard, call); });
      })) {
    report(Failure::handler_threw("executor",
                                  std::string("the executor refused ") + what + ": " + *threw));
    return false;
  }
  return true;
}

// One subscriber told `arg`: false when its filter declines it or it was
// released; else it ran, or its task was handed to its executor. A failure
// goes to `report(Failure, const Arg&)`, which may add what `arg` names (a
// device, an object); it is copied into the executor's task, so it must stay
// valid wherever that runs.
template <typename Sub, typename Report>
bool call(const std::shared_ptr<Sub>& subscriber, const typename Sub::Argument& arg,
          const char* what_ran, const Report& report) noexcept {
  if (!subscriber->filter.matches(arg) || subscriber->guard.closed()) return false;
  auto run = [](const std::shared_ptr<Sub>& subscriber, const typename Sub::Argument& arg,
                const char* what_ran, const Report& report) noexcept {
    reported_call(
        what_ran, [&] { subscriber->callback(arg); },
        [&](Failure failure) { report(std::move(failure), arg); });
  };
  if (!subscriber->executor) {
    return guarded_call(subscriber->guard, [&] { run(subscriber, arg, what_ran, report); });
  }
  return hand_to(
      *subscriber->executor, subscriber->guard,
      [&] {
        return [subscriber, arg, what_ran, report, run]() noexcept {
          run(subscriber, arg, what_ran, report);
        };
      },
      "a handler's task", [&](Failure failure) { report(std::move(failure), arg); });
}

enum class Order : std::uint8_t { kRegistration, kReverse };

template <typename Sub>
class Snapshot {
 public:
  using List = std::vector<std::shared_ptr<Sub>>;

  Snapshot() noexcept = default;
  explicit Snapshot(std::shared_ptr<Sub> only) noexcept : only_(std::move(only)) {}
  explicit Snapshot(std::shared_ptr<const List> several) noexcept
      : several_(std::move(several)) {}

  bool empty() const noexcept { return !only_ && (!several_ || several_->empty()); }
  // The newest subscriber not released, or null: a CM id's key has one
  // (cm/cm_state.h), and a second only while it is rerouted (the new one is
  // subscribed before the old is released) or a release whose unlink could
  // not allocate leaves its closed entry.
  std::shared_ptr<Sub> newest() const noexcept {
    if (only_) return only_->guard.closed() ? nullptr : only_;
    if (!several_) return nullptr;
    for (auto it = several_->rbegin(); it != several_->rend(); ++it) {
      if (!(*it)->guard.closed()) return *it;
    }
    return nullptr;
  }

  // Tells each subscriber `arg` (call() above), in `order`; returns how many
  // ran or were handed to their executors.
  template <typename Report>
  std::size_t deliver(const typename Sub::Argument& arg, const char* what_ran,
                      const Report& report, Order order = Order::kRegistration) const noexcept {
    if (only_) return call(only_, arg, what_ran, report) ? 1 : 0;
    if (!several_) return 0;
    std::size_t ran = 0;
    auto tell = [&](const std::shared_ptr<Sub>& subscriber) {
      ran += call(subscriber, arg, what_ran, report) ? 1 : 0;
    };
    if (order == Order::kReverse) {
      std::for_each(several_->rbegin(), several_->rend(), tell);
    } else {
      std::for_each(several_->begin(), several_->end(), tell);
    }
    return ran;
  }

 private:
  // One subscriber without a list (by far the common case for an object:
  // one allocation touched), or several.
  std::shared_ptr<Sub> only_;
  std::shared_ptr<const List> several_;
};

// The one release: close the subscriber (no call starts), `unlink(const
// Sub*)` it from its list, wait for its calls on other threads. `unlink`
// returns false when the list is inherited (core/process.h): then nothing is
// unlinked, and nothing waited for, since the calls the guard counts were on
// the parent's threads. A subscriber that is its own registration (the
// Registry's object handlers) calls this from its release().
template <typename Sub, typename Unlink>
void unsubscribe(Sub& subscriber, Unlink&& unlink) noexcept {
  subscriber.guard.close();
  bool ours = true;
  try {
    ours = unlink(static_cast<const Sub*>(&subscriber));
  } catch (...) {
    // Only allocation can fail there (a KeyedLists copies the rest of a
    // key's list). The subscriber is closed already, so it never runs; its
    // entry, and its captures, stay until its key's list goes.
  }
  if (ours) subscriber.guard.wait_idle();
}

// A Handle whose release is unsubscribe(). `unlink` is kept by type inside
// the handle's one block and given the subscriber rather than holding a
// pointer of its own.
template <typename Sub, typename Unlink>
Handle subscription(std::shared_ptr<Sub> subscriber, Unlink unlink) {
  return Handle(
      [subscriber = std::move(subscriber), unlink = std::move(unlink)]() mutable noexcept {
        unsubscribe(*subscriber, unlink);
      });
}

}  // namespace ibev::detail

#endif  // IBEV_CORE_ROUTE_H_
