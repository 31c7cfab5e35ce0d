// The Registry composes object handlers (core/object_handlers.h) and device
// listeners (core/device_listeners.h); this file routes between them and is
// the one place failures are counted and handed to the sink.
//
// Locking: each shard of ObjectHandlers has its own mutex, taken only around
// a table lookup or update; `devices_mutex` guards the map of DeviceStates,
// whose listener signals lock themselves. No lock is held while a handler
// runs, so handlers may subscribe, release and deliver.
#include <ibev/core/registry.h>

#include <exception>
#include <mutex>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

#include <ibev/core/device_listeners.h>
#include <ibev/core/object_handlers.h>
#include <ibev/core/subscriber.h>

namespace ibev {
namespace detail {

struct RegistryState {
  explicit RegistryState(FailureSink s) : sink(std::move(s)) {}

  std::shared_ptr<DeviceState> device(ibv_context* context) {
    {
      std::shared_lock<std::shared_mutex> lock(devices_mutex);
      auto it = devices.find(context);
      if (it != devices.end()) return it->second;
    }
    std::unique_lock<std::shared_mutex> lock(devices_mutex);
    auto& state = devices[context];
    if (!state) state = std::make_shared<DeviceState>();
    return state;
  }

  void report(const Failure& failure) noexcept {
    // Counting allocates a device's counters the first time: if even that
    // fails, the failure is still said.
    static_cast<void>(exception_text([&] { count(failure); }));
    send_to(sink_detached.load() ? FailureSink{} : sink, failure);
  }

  void count(const Failure& failure) {
    if (failure.device == nullptr) return;
    DeviceState& state = *device(failure.device);
    state.failures.fetch_add(1, std::memory_order_relaxed);
    if (failure.kind != Failure::Kind::kHandlerThrew) return;
    if (failure.event_code) {
      state.counts_for(*failure.event_code)
          .handler_failures.fetch_add(1, std::memory_order_relaxed);
    } else {
      state.completion_handler_failures.fetch_add(1, std::memory_order_relaxed);
    }
  }

  const FailureSink sink;
  std::atomic<bool> sink_detached{false};
  ObjectHandlers objects;
  std::shared_mutex devices_mutex;
  std::unordered_map<ibv_context*, std::shared_ptr<DeviceState>> devices;
  boost::signals2::signal<bool(const Event&, const std::shared_ptr<RegistryState>&),
                          CountRan>
      unclaimed;
};

namespace {

// Runs the handler unless released; returns whether it ran.
bool call(Subscriber& subscriber, const Event& event,
          const std::shared_ptr<RegistryState>& registry) noexcept {
  if (!subscriber.guard.try_enter()) return false;
  if (auto threw = exception_text([&] { subscriber.handler(event); }); threw && registry) {
    Failure failure = Failure::handler_threw("event handler", std::move(*threw));
    failure.device = event.device();
    failure.object = event.object();
    failure.event_code = event.code();
    registry->report(failure);
  }
  subscriber.guard.leave();
  return true;
}

}  // namespace

bool notify(const std::shared_ptr<Subscriber>& subscriber, const Event& event,
            const std::shared_ptr<RegistryState>& registry) noexcept {
  if (!subscriber->filter.matches(event) || subscriber->guard.closed()) return false;
  if (!subscriber->executor) return call(*subscriber, event, registry);
  try {
    (*subscriber->executor)([subscriber, event,
                          weak = std::weak_ptr<RegistryState>(registry)]() noexcept {
      call(*subscriber, event, weak.lock());
    });
  } catch (const std::exception& e) {
    Failure failure = Failure::handler_threw(
        "executor", std::string("the executor refused the handler's task: ") + e.what());
    failure.device = event.device();
    failure.object = event.object();
    failure.event_code = event.code();
    registry->report(failure);
    return false;
  }
  return true;
}

}  // namespace detail

using detail::ObjectKey;

// ------------------------------------------------------------------ Delivery

Delivery::Delivery(const Event& event) noexcept : event_(event) {}
Delivery::Delivery(Delivery&&) noexcept = default;
Delivery& Delivery::operator=(Delivery&&) noexcept = default;
Delivery::~Delivery() = default;

// ----------------------------------------------------------- CounterSnapshot

EventCounts CounterSnapshot::for_code(int code) const noexcept {
  return counts_[detail::bucket_of(code)];
}

EventCounts CounterSnapshot::total() const noexcept {
  EventCounts sum;
  for (const EventCounts& c : counts_) {
    sum.delivered += c.delivered;
    sum.unclaimed += c.unclaimed;
    sum.handler_failures += c.handler_failures;
  }
  return sum;
}

// ------------------------------------------------------------------ Registry

namespace {

void require_handler(const char* verb, bool present) {
  if (!present) {
    throw std::invalid_argument(std::string(verb) + ": the handler is empty");
  }
}

// The release of one subscription: no new call starts, the subscription
// leaves its list (`unlink(subscriber)`), and calls in progress on other
// threads finish. `unlink` is kept by type inside the handle's one closure,
// and is given the subscriber rather than keeping a pointer of its own: an
// object handler is made per QP and CQ, and each such copy was bytes in a
// closure (bench/registry_bench's memory figure).
template <typename Unlink>
Handle subscription_handle(std::shared_ptr<detail::Subscriber> subscriber, Unlink unlink) {
  return Handle(
      [subscriber = std::move(subscriber), unlink = std::move(unlink)]() mutable noexcept {
        subscriber->guard.close();
        try {
          unlink(subscriber.get());
        } catch (...) {
          // Only allocation can fail there. The handler is closed already, so it
          // will not run; the stale entry goes with the next change of the list.
        }
        subscriber->guard.wait_idle();
      });
}

}  // namespace

Registry::Registry(FailureSink sink)
    : state_(std::make_shared<detail::RegistryState>(std::move(sink))) {}

Registry::~Registry() = default;

Handle Registry::attach(ibv_cq* cq, Handler handler) {
  return attach(cq, EventFilter{}, std::move(handler));
}
Handle Registry::attach(ibv_qp* qp, Handler handler) {
  return attach(qp, EventFilter{}, std::move(handler));
}
Handle Registry::attach(ibv_srq* srq, Handler handler) {
  return attach(srq, EventFilter{}, std::move(handler));
}
Handle Registry::attach(ibv_wq* wq, Handler handler) {
  return attach(wq, EventFilter{}, std::move(handler));
}

Handle Registry::attach(ibv_cq* cq, EventFilter filter, Handler handler,
                        Executor executor) {
  return attach_object("Registry::attach(ibv_cq*)", cq, ElementKind::kCq,
                       std::move(filter), std::move(handler), std::move(executor));
}
Handle Registry::attach(ibv_qp* qp, EventFilter filter, Handler handler,
                        Executor executor) {
  return attach_object("Registry::attach(ibv_qp*)", qp, ElementKind::kQp,
                       std::move(filter), std::move(handler), std::move(executor));
}
Handle Registry::attach(ibv_srq* srq, EventFilter filter, Handler handler,
                        Executor executor) {
  return attach_object("Registry::attach(ibv_srq*)", srq, ElementKind::kSrq,
                       std::move(filter), std::move(handler), std::move(executor));
}
Handle Registry::attach(ibv_wq* wq, EventFilter filter, Handler handler,
                        Executor executor) {
  return attach_object("Registry::attach(ibv_wq*)", wq, ElementKind::kWq,
                       std::move(filter), std::move(handler), std::move(executor));
}

Handle Registry::attach_object(const char* verb, const void* object, ElementKind kind,
                               EventFilter filter, Handler handler,
                               Executor executor) {
  if (object == nullptr) {
    throw std::invalid_argument(std::string(verb) + ": the object is null");
  }
  if (!ObjectKey::representable(object)) {
    throw std::invalid_argument(std::string(verb) +
                                ": the object's address is not 8-aligned, as every rdma-core "
                                "object's is");
  }
  require_handler(verb, static_cast<bool>(handler));
  if (filter.port()) {
    throw std::invalid_argument(
        std::string(verb) + ": a port filter means nothing to an object's " +
        "handler; object events carry no port");
  }
  for (int code : filter.types()) {
    if (element_of(code) != kind) {
      throw std::invalid_argument(
          std::string(verb) + ": " + describe_event_code(code) + " is a " +
          std::string(to_string(element_of(code))) +
          " event and never reaches a " + std::string(to_string(kind)) + " handler");
    }
  }
  const ObjectKey key{object, kind};
  auto subscriber = std::make_shared<detail::Subscriber>(
      std::move(handler), std::move(filter), std::move(executor));
  state_->objects.add(key, subscriber);
  return subscription_handle(std::move(subscriber),
                             [weak = std::weak_ptr<detail::RegistryState>(state_),
                              key](const detail::Subscriber* subscriber) {
                               if (auto state = weak.lock()) state->objects.remove(key, subscriber);
                             });
}

Handle Registry::listen(ibv_context* device, Handler handler) {
  return listen(device, EventFilter{}, std::move(handler));
}

Handle Registry::listen(ibv_context* device, EventFilter filter, Handler handler,
                        Executor executor) {
  if (device == nullptr) {
    throw std::invalid_argument("Registry::listen: the device is null");
  }
  require_handler("Registry::listen", static_cast<bool>(handler));
  for (int code : filter.types()) {
    if (is_object(element_of(code))) {
      throw std::invalid_argument(
          "Registry::listen: " + describe_event_code(code) + " is a " +
          std::string(to_string(element_of(code))) +
          " event; it reaches only that object's handlers (attach one)");
    }
  }
  auto subscriber = std::make_shared<detail::Subscriber>(
      std::move(handler), std::move(filter), std::move(executor));
  boost::signals2::connection connection = state_->device(device)->connect(subscriber);
  return subscription_handle(std::move(subscriber),
                             [connection](const detail::Subscriber*) mutable {
                               connection.disconnect();
                             });
}

Handle Registry::on_unclaimed(Handler observer) {
  require_handler("Registry::on_unclaimed", static_cast<bool>(observer));
  auto subscriber =
      std::make_shared<detail::Subscriber>(std::move(observer), EventFilter{}, Executor{});
  boost::signals2::connection connection = state_->unclaimed.connect(
      [subscriber](const Event& event,
                   const std::shared_ptr<detail::RegistryState>& registry) {
        return detail::notify(subscriber, event, registry);
      });
  return subscription_handle(std::move(subscriber),
                             [connection](const detail::Subscriber*) mutable {
                               connection.disconnect();
                             });
}

Delivery Registry::resolve(const Event& event) const {
  if (event.device() == nullptr) {
    throw std::invalid_argument("Registry::resolve: the event names no device");
  }
  Delivery delivery(event);
  delivery.device_ = state_->device(event.device());
  // An address no rdma-core object can have (unaligned) has no handlers.
  if (is_object(event.element_kind()) && ObjectKey::representable(event.object())) {
    detail::HandlerSet set = state_->objects.find({event.object(), event.element_kind()});
    delivery.only_ = std::move(set.only);
    delivery.several_ = std::move(set.several);
  } else if (!is_object(event.element_kind())) {
    delivery.listener_epoch_ = delivery.device_->current_epoch();
  }
  return delivery;
}

std::size_t Registry::deliver(const Delivery& delivery) {
  if (!delivery.device_) {
    throw std::invalid_argument("Registry::deliver: the Delivery was moved from");
  }
  const Event& event = delivery.event_;
  detail::DeviceState& device = *delivery.device_;
  // A handler may destroy this Registry: from here on only `state` is used.
  const std::shared_ptr<detail::RegistryState> state = state_;
  std::size_t ran = 0;
  if (delivery.only_) {
    ran = detail::notify(delivery.only_, event, state) ? 1 : 0;
  } else if (delivery.several_) {
    for (const auto& subscriber : *delivery.several_) {
      ran += detail::notify(subscriber, event, state) ? 1 : 0;
    }
  } else if (!is_object(event.element_kind())) {
    ran = device.notify(event, delivery.listener_epoch_, state);
  }
  auto& counts = device.counts_for(event.code());
  if (ran > 0) {
    counts.delivered.fetch_add(1, std::memory_order_relaxed);
  } else {
    counts.unclaimed.fetch_add(1, std::memory_order_relaxed);
    state->unclaimed(event, state);
  }
  return ran;
}

void Registry::report(const Failure& failure) noexcept { state_->report(failure); }

void Registry::detach_failure_sink() noexcept { state_->sink_detached = true; }

// The listeners go with the last Delivery resolved before, which holds the
// state and still reaches who it named.
void Registry::forget(ibv_context* device) noexcept {
  std::shared_ptr<detail::DeviceState> state;  // destroyed unlocked
  std::unique_lock<std::shared_mutex> lock(state_->devices_mutex);
  auto it = state_->devices.find(device);
  if (it == state_->devices.end()) return;
  state = std::move(it->second);
  state_->devices.erase(it);
}

CounterSnapshot Registry::counters(ibv_context* device) const {
  CounterSnapshot snapshot;
  std::shared_ptr<detail::DeviceState> state;
  {
    std::shared_lock<std::shared_mutex> lock(state_->devices_mutex);
    auto it = state_->devices.find(device);
    if (it == state_->devices.end()) return snapshot;
    state = it->second;
  }
  for (std::size_t i = 0; i < state->counts.size(); ++i) {
    snapshot.counts_[i] = {state->counts[i].delivered.load(std::memory_order_relaxed),
                           state->counts[i].unclaimed.load(std::memory_order_relaxed),
                           state->counts[i].handler_failures.load(std::memory_order_relaxed)};
  }
  snapshot.completion_handler_failures_ = state->completion_handler_failures.load();
  snapshot.failures_ = state->failures.load();
  return snapshot;
}

}  // namespace ibev
