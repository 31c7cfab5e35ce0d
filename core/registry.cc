// The Registry keeps three kinds of subscriber list, all of the routing
// primitive (core/route.h, core/subscriber_lists.h): object handlers in
// KeyedLists, each device's listeners and the unclaimed observers in
// BroadcastLists. This file chooses the list an event's element names, and is
// the one place failures are counted and handed to the sink.
//
// Locking: KeyedLists' shard mutexes and the BroadcastLists' own are taken
// only around a lookup or an update; `devices_mutex` guards the map of
// DeviceStates and is taken before none of them. No lock is held while a
// handler runs, so handlers may subscribe, release and deliver.
#include <ibev/core/registry.h>

#include <exception>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

#include <ibev/core/device_listeners.h>
#include <ibev/core/subscriber_lists.h>
#include <ibev/core/thread_annotations.h>

namespace ibev {
namespace detail {

struct RegistryState {
  explicit RegistryState(FailureSink s) : sink(std::move(s)) {}

  std::shared_ptr<DeviceState> device(ibv_context* context) {
    {
      ReaderLock lock(devices_mutex);
      auto it = devices.find(context);
      if (it != devices.end()) return it->second;
    }
    WriterLock lock(devices_mutex);
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
    } else if (failure.verb == kCompletionHandler) {
      state.completion_handler_failures.fetch_add(1, std::memory_order_relaxed);
    }
  }

  const FailureSink sink;
  std::atomic<bool> sink_detached{false};
  KeyedLists<EventSubscriber> by_address;
  KeyedLists<EventSubscriber, NumberKey> by_number;  // on a device
  SharedMutex devices_mutex;
  std::unordered_map<ibv_context*, std::shared_ptr<DeviceState>> devices
      IBEV_GUARDED_BY(devices_mutex);
  BroadcastList<EventSubscriber> unclaimed;
};

// An object's handler: one subscriber under its address, its number on a
// device, or both (a QueuePair's: one handler, one state), and its own
// registration, so that its Handle is this block and nothing more. Its
// release unlinks it from both, if the Registry is still there.
class ObjectHandler final : public EventSubscriber, public Registration {
 public:
  ObjectHandler(std::weak_ptr<RegistryState> registry, ObjectKey address, NumberKey number,
                Handler handler, EventFilter filter, Executor executor)
      : EventSubscriber(std::move(handler), std::move(filter), std::move(executor)),
        registry_(std::move(registry)),
        address_(address),
        number_(number) {}

  void release() noexcept override {
    unsubscribe(static_cast<EventSubscriber&>(*this), [this](const EventSubscriber* self) {
      const auto state = registry_.lock();
      if (!state) return true;
      // Both or neither: the lists know the same process.
      bool ours = address_.empty() || state->by_address.unlink(address_, self);
      if (ours && !number_.empty()) ours = state->by_number.unlink(number_, self);
      return ours;
    });
  }

 private:
  const std::weak_ptr<RegistryState> registry_;
  const ObjectKey address_;
  const NumberKey number_;
};

namespace {

// Where a handler's failure goes: counted for the event's device and code,
// then to the sink; to stderr once the Registry is gone (a handler that ran
// late on its executor).
struct EventFailures {
  std::weak_ptr<RegistryState> registry;

  void operator()(Failure failure, const Event& event) const noexcept {
    failure.device = event.device();
    failure.object = event.object();
    failure.event_code = event.code();
    if (auto state = registry.lock()) {
      state->report(failure);
    } else {
      send_to({}, failure);
    }
  }
};

}  // namespace
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

std::string CounterSnapshot::bucket_name(int code) {
  if (code == kTrackedCodes) return "other";
  return enumerator_name(code);
}

// ------------------------------------------------------------------ Registry

namespace {

void require_handler(const char* verb, bool present) {
  if (!present) {
    throw std::invalid_argument(std::string(verb) + ": the handler is empty");
  }
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

void Registry::require_address(const char* verb, const void* object) {
  if (object == nullptr) {
    throw std::invalid_argument(std::string(verb) + ": the object is null");
  }
  if (!ObjectKey::representable(object)) {
    throw std::invalid_argument(std::string(verb) +
                                ": the object's address is not 8-aligned, as every rdma-core "
                                "object's is");
  }
}

void Registry::require_number(const char* verb, ibv_context* device, ObjectNumber object) {
  if (device == nullptr) {
    throw std::invalid_argument(std::string(verb) + ": the device is null");
  }
  if (!is_object(object.kind)) {
    throw std::invalid_argument(std::string(verb) + ": a " +
                                std::string(to_string(object.kind)) +
                                " is not an object with a number (CQ, QP, SRQ, WQ)");
  }
}

// Once every check passed: the device's state is made here if it was not.
detail::NumberKey Registry::number_key(ibv_context* device, ObjectNumber object) const {
  return detail::NumberKey{state_->device(device)->generation, object.kind, object.number};
}

Handle Registry::attach_object(const char* verb, const void* object, ElementKind kind,
                               EventFilter filter, Handler handler,
                               Executor executor) {
  require_address(verb, object);
  require_handler(verb, static_cast<bool>(handler));
  require_object_filter(verb, kind, filter);
  return attach_keys(ObjectKey{object, kind}, {}, std::move(filter), std::move(handler),
                     std::move(executor));
}

Handle Registry::attach(ibv_context* device, ObjectNumber object, EventFilter filter,
                        Handler handler, Executor executor) {
  const char* const verb = "Registry::attach(ibv_context*, ObjectNumber)";
  require_number(verb, device, object);
  require_handler(verb, static_cast<bool>(handler));
  require_object_filter(verb, object.kind, filter);
  return attach_keys({}, number_key(device, object), std::move(filter), std::move(handler),
                     std::move(executor));
}

Handle Registry::attach(ibv_context* device, ObjectNumber object, const void* address,
                        EventFilter filter, Handler handler, Executor executor) {
  const char* const verb = "Registry::attach(ibv_context*, ObjectNumber, address)";
  require_number(verb, device, object);
  require_address(verb, address);
  require_handler(verb, static_cast<bool>(handler));
  require_object_filter(verb, object.kind, filter);
  return attach_keys(ObjectKey{address, object.kind}, number_key(device, object),
                     std::move(filter), std::move(handler), std::move(executor));
}

Handle Registry::attach_keys(ObjectKey address, detail::NumberKey number, EventFilter filter,
                             Handler handler, Executor executor) {
  auto subscriber = std::make_shared<detail::ObjectHandler>(
      state_, address, number, std::move(handler), std::move(filter), std::move(executor));
  if (!address.empty()) state_->by_address.link(address, subscriber);
  if (!number.empty()) {
    try {
      state_->by_number.link(number, subscriber);
    } catch (...) {
      subscriber->release();  // out of the first table again
      throw;
    }
  }
  return Handle(std::move(subscriber));
}

void Registry::require_object_filter(const char* verb, ElementKind kind,
                                     const EventFilter& filter) {
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
}

Handle Registry::listen(ibv_context* device, Handler handler) {
  return listen(device, EventFilter{}, std::move(handler));
}

namespace {

void require_listener(const char* verb, ibv_context* device, const EventFilter& filter,
                      const Handler& handler) {
  if (device == nullptr) throw std::invalid_argument(std::string(verb) + ": the device is null");
  require_handler(verb, static_cast<bool>(handler));
  for (int code : filter.types()) {
    if (is_object(element_of(code))) {
      throw std::invalid_argument(
          std::string(verb) + ": " + describe_event_code(code) + " is a " +
          std::string(to_string(element_of(code))) +
          " event; it reaches only that object's handlers (attach one)");
    }
  }
}

}  // namespace

Handle Registry::listen(ibv_context* device, EventFilter filter, Handler handler,
                        Executor executor) {
  require_listener("Registry::listen", device, filter, handler);
  return state_->device(device)->listeners.add(std::make_shared<detail::EventSubscriber>(
      std::move(handler), std::move(filter), std::move(executor)));
}

Handle Registry::listen_last(ibv_context* device, EventFilter filter, Handler handler) {
  require_listener("Registry::listen_last", device, filter, handler);
  return state_->device(device)->last.add(
      std::make_shared<detail::EventSubscriber>(std::move(handler), std::move(filter)));
}

Handle Registry::on_unclaimed(Handler observer) {
  require_handler("Registry::on_unclaimed", static_cast<bool>(observer));
  return state_->unclaimed.add(std::make_shared<detail::EventSubscriber>(std::move(observer)));
}

Delivery Registry::resolve(const Event& event) const {
  if (event.device() == nullptr) {
    throw std::invalid_argument("Registry::resolve: the event names no device");
  }
  Delivery delivery(event);
  delivery.device_ = state_->device(event.device());
  if (!is_object(event.element_kind())) {
    delivery.who_ = delivery.device_->listeners.snapshot();
  } else if (const auto number = event.object_number()) {
    delivery.who_ = state_->by_number.snapshot(
        detail::NumberKey{delivery.device_->generation, number->kind, number->number});
  } else if (ObjectKey::representable(event.object())) {
    // (An address no rdma-core object can have, unaligned, has no handlers.)
    delivery.who_ = state_->by_address.snapshot({event.object(), event.element_kind()});
  }
  return delivery;
}

std::size_t Registry::deliver(const Delivery& delivery) {
  if (!delivery.device_) {
    throw std::invalid_argument("Registry::deliver: the Delivery was moved from");
  }
  const Event& event = delivery.event_;
  // A handler may destroy this Registry: from here on only `state` is used.
  const std::shared_ptr<detail::RegistryState> state = state_;
  const detail::EventFailures report{state};
  const std::size_t ran = delivery.who_.deliver(event, "event handler", report);
  auto& counts = delivery.device_->counts_for(event.code());
  if (ran > 0) {
    counts.delivered.fetch_add(1, std::memory_order_relaxed);
  } else {
    counts.unclaimed.fetch_add(1, std::memory_order_relaxed);
    // Unclaimed is known only now: the observers are those present now.
    state->unclaimed.snapshot().deliver(event, "unclaimed observer", report);
  }
  if (!is_object(event.element_kind())) {
    delivery.device_->last.snapshot().deliver(event, "event handler", report);
  }
  return ran;
}

void Registry::report(const Failure& failure) noexcept { state_->report(failure); }

void Registry::detach_failure_sink() noexcept { state_->sink_detached = true; }

// The listeners go with the last Delivery resolved before, which holds the
// state and still reaches who it named.
void Registry::forget(ibv_context* device) noexcept {
  std::shared_ptr<detail::DeviceState> state;  // destroyed unlocked
  detail::WriterLock lock(state_->devices_mutex);
  auto it = state_->devices.find(device);
  if (it == state_->devices.end()) return;
  state = std::move(it->second);
  state_->devices.erase(it);
}

CounterSnapshot Registry::counters(ibv_context* device) const {
  CounterSnapshot snapshot;
  std::shared_ptr<detail::DeviceState> state;
  {
    detail::ReaderLock lock(state_->devices_mutex);
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
