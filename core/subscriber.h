// Internal to core/registry: one subscription's handler, filter and executor,
// whether it is an object's handler or a device listener, and the one way it
// is called.
#ifndef IBEV_CORE_SUBSCRIBER_H_
#define IBEV_CORE_SUBSCRIBER_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include <ibev/core/call_guard.h>
#include <ibev/core/event.h>
#include <ibev/core/event_filter.h>
#include <ibev/core/executor.h>

namespace ibev {
using Handler = std::function<void(const Event&)>;
}  // namespace ibev

namespace ibev::detail {

struct RegistryState;

struct Subscriber {
  Subscriber(Handler h, EventFilter f, Executor e)
      : handler(std::move(h)),
        filter(std::move(f)),
        executor(e ? std::make_unique<const Executor>(std::move(e)) : nullptr) {}
  CallGuard guard;  // release waits on it (core/call_guard.h)
  const Handler handler;
  const EventFilter filter;
  // Null: the delivering thread. Held apart because few subscriptions name
  // one, and a Subscriber is made per QP and CQ.
  const std::unique_ptr<const Executor> executor;
  // Device listeners: the listener epoch it was connected in. A listener
  // hears an event only when it was connected before the event was resolved.
  std::uint64_t epoch = 0;
};

using SubscriberList = std::vector<std::shared_ptr<Subscriber>>;

// Calls the handler if `event` passes its filter and it is not released, on
// this thread or through its executor; a throw is reported to `registry`.
// Returns whether it ran (or was handed to the executor).
bool notify(const std::shared_ptr<Subscriber>& subscriber, const Event& event,
            const std::shared_ptr<RegistryState>& registry) noexcept;

}  // namespace ibev::detail

#endif  // IBEV_CORE_SUBSCRIBER_H_
