#include <ibev/core/registry.h>

#include <atomic>
#include <boost/signals2/signal.hpp>
#include <exception>
#include <mutex>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

#include <ibev/core/call_guard.h>

namespace ibev {
namespace detail {
namespace {

struct AtomicCounts {
  std::atomic<std::uint64_t> delivered{0};
  std::atomic<std::uint64_t> unclaimed{0};
  std::atomic<std::uint64_t> handler_failures{0};
};

std::size_t bucket_of(int code) noexcept {
  return code >= 0 && code < CounterSnapshot::kTrackedCodes
             ? static_cast<std::size_t>(code)
             : static_cast<std::size_t>(CounterSnapshot::kTrackedCodes);
}

// Signals2 combiner: how many slots actually ran their handler.
struct CountRan {
  using result_type = std::size_t;
  template <typename Iterator>
  std::size_t operator()(Iterator first, Iterator last) const {
    std::size_t ran = 0;
    for (; first != last; ++first) ran += *first ? 1 : 0;
    return ran;
  }
};

}  // namespace

class Reporter;

struct ObjectSlot {
  ObjectSlot(Handler h, EventFilter f) : handler(std::move(h)), filter(f) {}
  CallGuard guard;
  Handler handler;
  EventFilter filter;
};

using SlotList = std::vector<std::shared_ptr<ObjectSlot>>;

struct DeviceState {
  // The device's event_handler_list. A listener hears an event only when it
  // was connected before the event was resolved: `epoch` numbers listeners.
  boost::signals2::signal<bool(const Event&, std::uint64_t, Reporter&),
                          CountRan>
      listeners;
  std::atomic<std::uint64_t> epoch{0};
  std::array<AtomicCounts, CounterSnapshot::kTrackedCodes + 1> counts;

  AtomicCounts& counts_for(int code) noexcept { return counts[bucket_of(code)]; }
};

struct RegistryState {
  // Objects are spread over shards so that routing from many threads and
  // attaching from many others rarely meet on one mutex.
  struct Shard {
    std::mutex mutex;
    ObjectTable<HandlerSet> objects;
  };
  static constexpr std::size_t kShards = 64;

  Shard& shard_for(const ObjectKey& key) noexcept {
    const auto bits = reinterpret_cast<std::uintptr_t>(key.address) >> 4;
    return shards[(bits * 0x9E3779B97F4A7C15ull) >> 58];
  }

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

  void remove_object(const ObjectKey& key, const CallGuard* guard) {
    Shard& shard = shard_for(key);
    std::lock_guard<std::mutex> lock(shard.mutex);
    HandlerSet* set = shard.objects.find(key);
    if (set == nullptr) return;
    if (set->only) {
      if (&set->only->guard == guard) shard.objects.erase(key);
      return;
    }
    SlotList rest;
    for (const auto& slot : *set->several) {
      if (&slot->guard != guard) rest.push_back(slot);
    }
    if (rest.size() == 1) {
      *set = HandlerSet{rest.front(), nullptr};
    } else {
      set->several = std::make_shared<const SlotList>(std::move(rest));
    }
  }

  static_assert((kShards & (kShards - 1)) == 0 && kShards == 64,
                "shard_for() takes the top 6 bits of the hash");
  std::array<Shard, kShards> shards;

  std::shared_mutex devices_mutex;
  std::unordered_map<ibv_context*, std::shared_ptr<DeviceState>> devices;

  boost::signals2::signal<bool(const Event&, Reporter&), CountRan> unclaimed;
  boost::signals2::signal<void(const Event&, std::string_view, DeviceState&)>
      failures;
};

// Counts a handler's exception and tells the failure observers.
class Reporter {
 public:
  Reporter(RegistryState& registry, DeviceState& device) noexcept
      : registry_(registry), device_(device) {}

  void handler_failed(const Event& event, std::string_view what) noexcept {
    device_.counts_for(event.code()).handler_failures.fetch_add(
        1, std::memory_order_relaxed);
    try {
      registry_.failures(event, what, device_);
    } catch (...) {
      // Observers are called guarded; only the signal's own allocation can
      // throw here, and the failure is already counted.
    }
  }

 private:
  RegistryState& registry_;
  DeviceState& device_;
};

namespace {

// Runs `call` unless the guard is closed; returns whether it ran. An exception
// is handed to `on_throw` with its text, never propagated.
template <typename Call, typename OnThrow>
bool run_guarded(CallGuard& guard, Call&& call, OnThrow&& on_throw) noexcept {
  if (!guard.try_enter()) return false;
  try {
    call();
  } catch (const std::exception& e) {
    on_throw(std::string_view(e.what()));
  } catch (...) {
    on_throw(std::string_view("an exception not derived from std::exception"));
  }
  guard.leave();
  return true;
}

template <typename Fn>
struct GuardedSlot {
  explicit GuardedSlot(Fn f) : fn(std::move(f)) {}
  CallGuard guard;
  Fn fn;
};

struct ListenerSlot {
  ListenerSlot(Handler h, EventFilter f) : handler(std::move(h)), filter(f) {}
  CallGuard guard;
  Handler handler;
  EventFilter filter;
  std::uint64_t epoch = 0;
};

}  // namespace
}  // namespace detail

using detail::CallGuard;
using detail::ObjectKey;

// ---------------------------------------------------------------- Attachment

Attachment::Attachment() noexcept = default;

Attachment::Attachment(std::shared_ptr<CallGuard> guard,
                       std::weak_ptr<detail::RegistryState> registry,
                       ObjectKey key,
                       boost::signals2::connection connection) noexcept
    : guard_(std::move(guard)),
      registry_(std::move(registry)),
      key_(key),
      connection_(connection) {}

Attachment::Attachment(Attachment&& other) noexcept
    : guard_(std::move(other.guard_)),
      registry_(std::move(other.registry_)),
      key_(std::exchange(other.key_, {nullptr, ElementKind::kDevice})),
      connection_(std::move(other.connection_)) {}

Attachment& Attachment::operator=(Attachment&& other) noexcept {
  if (this != &other) {
    release();
    guard_ = std::move(other.guard_);
    registry_ = std::move(other.registry_);
    key_ = std::exchange(other.key_, {nullptr, ElementKind::kDevice});
    connection_ = std::move(other.connection_);
  }
  return *this;
}

Attachment::~Attachment() { release(); }

bool Attachment::attached() const noexcept {
  return guard_ != nullptr && !guard_->closed();
}

void Attachment::release() noexcept {
  if (!guard_) return;
  guard_->close();
  connection_.disconnect();
  if (key_.address != nullptr) {
    if (auto registry = registry_.lock()) {
      try {
        registry->remove_object(key_, guard_.get());
      } catch (...) {
        // Only allocation can fail here. The handler is closed already, so it
        // will not run; the stale entry goes with the next attach or release.
      }
    }
  }
  guard_->wait_idle();
  guard_.reset();
  registry_.reset();
  key_ = {nullptr, ElementKind::kDevice};
}

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

}  // namespace

Registry::Registry() : state_(std::make_shared<detail::RegistryState>()) {}

Registry::~Registry() = default;

Attachment Registry::attach(ibv_cq* cq, Handler handler, EventFilter filter) {
  return attach_object("Registry::attach(ibv_cq*)", {cq, ElementKind::kCq},
                       std::move(handler), filter);
}

Attachment Registry::attach(ibv_qp* qp, Handler handler, EventFilter filter) {
  return attach_object("Registry::attach(ibv_qp*)", {qp, ElementKind::kQp},
                       std::move(handler), filter);
}

Attachment Registry::attach(ibv_srq* srq, Handler handler,
                            EventFilter filter) {
  return attach_object("Registry::attach(ibv_srq*)", {srq, ElementKind::kSrq},
                       std::move(handler), filter);
}

Attachment Registry::attach(ibv_wq* wq, Handler handler, EventFilter filter) {
  return attach_object("Registry::attach(ibv_wq*)", {wq, ElementKind::kWq},
                       std::move(handler), filter);
}

Attachment Registry::attach_object(const char* verb, ObjectKey key,
                                   Handler handler, EventFilter filter) {
  if (key.address == nullptr) {
    throw std::invalid_argument(std::string(verb) + ": the object is null");
  }
  require_handler(verb, static_cast<bool>(handler));
  if (filter.port()) {
    throw std::invalid_argument(
        std::string(verb) + ": a port filter means nothing to an object's " +
        "handler; object events carry no port");
  }
  for (int code : filter.types()) {
    if (element_of(code) != key.kind) {
      throw std::invalid_argument(
          std::string(verb) + ": " + describe_event_code(code) + " is a " +
          std::string(to_string(element_of(code))) +
          " event and never reaches a " + std::string(to_string(key.kind)) +
          " handler");
    }
  }

  auto slot = std::make_shared<detail::ObjectSlot>(std::move(handler), filter);
  auto& shard = state_->shard_for(key);
  {
    std::lock_guard<std::mutex> lock(shard.mutex);
    detail::HandlerSet& set = shard.objects[key];
    if (!set.only && !set.several) {
      set.only = slot;
    } else {
      detail::SlotList next;
      if (set.only) {
        next.push_back(std::move(set.only));
      } else {
        next = *set.several;
      }
      next.push_back(slot);
      set.several = std::make_shared<const detail::SlotList>(std::move(next));
    }
  }
  return Attachment(std::shared_ptr<CallGuard>(slot, &slot->guard), state_,
                    key, {});
}

Attachment Registry::listen(ibv_context* device, Handler handler,
                            EventFilter filter) {
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

  std::shared_ptr<detail::DeviceState> state = state_->device(device);
  auto slot = std::make_shared<detail::ListenerSlot>(std::move(handler), filter);
  slot->epoch = state->epoch.fetch_add(1) + 1;
  auto connection = state->listeners.connect(
      [slot](const Event& event, std::uint64_t resolved_epoch,
             detail::Reporter& reporter) {
        if (slot->epoch > resolved_epoch || !slot->filter.matches(event)) {
          return false;
        }
        return detail::run_guarded(
            slot->guard, [&] { slot->handler(event); },
            [&](std::string_view what) { reporter.handler_failed(event, what); });
      });
  return Attachment(std::shared_ptr<CallGuard>(slot, &slot->guard), state_,
                    {nullptr, ElementKind::kDevice}, connection);
}

Attachment Registry::on_unclaimed(Handler observer) {
  require_handler("Registry::on_unclaimed", static_cast<bool>(observer));
  auto slot =
      std::make_shared<detail::GuardedSlot<Handler>>(std::move(observer));
  auto connection = state_->unclaimed.connect(
      [slot](const Event& event, detail::Reporter& reporter) {
        return detail::run_guarded(
            slot->guard, [&] { slot->fn(event); },
            [&](std::string_view what) { reporter.handler_failed(event, what); });
      });
  return Attachment(std::shared_ptr<CallGuard>(slot, &slot->guard), state_,
                    {nullptr, ElementKind::kDevice}, connection);
}

Attachment Registry::on_handler_failure(FailureHandler observer) {
  require_handler("Registry::on_handler_failure", static_cast<bool>(observer));
  auto slot = std::make_shared<detail::GuardedSlot<FailureHandler>>(
      std::move(observer));
  auto connection = state_->failures.connect(
      [slot](const Event& event, std::string_view what,
             detail::DeviceState& device) {
        // A failure observer that throws is counted, not reported again:
        // reporting it would call the same observer.
        detail::run_guarded(
            slot->guard, [&] { slot->fn(event, what); },
            [&](std::string_view) {
              device.counts_for(event.code()).handler_failures.fetch_add(
                  1, std::memory_order_relaxed);
            });
      });
  return Attachment(std::shared_ptr<CallGuard>(slot, &slot->guard), state_,
                    {nullptr, ElementKind::kDevice}, connection);
}

Delivery Registry::resolve(const Event& event) const {
  if (event.device() == nullptr) {
    throw std::invalid_argument("Registry::resolve: the event names no device");
  }
  Delivery delivery(event);
  delivery.device_ = state_->device(event.device());
  if (is_object(event.element_kind())) {
    const ObjectKey key{event.object(), event.element_kind()};
    auto& shard = state_->shard_for(key);
    std::lock_guard<std::mutex> lock(shard.mutex);
    if (const detail::HandlerSet* set = shard.objects.find(key)) {
      delivery.object_handlers_ = *set;
    }
  } else {
    delivery.listener_epoch_ = delivery.device_->epoch.load();
  }
  return delivery;
}

std::size_t Registry::deliver(const Delivery& delivery) {
  if (!delivery.device_) {
    throw std::invalid_argument(
        "Registry::deliver: the Delivery was moved from");
  }
  const Event& event = delivery.event_;
  detail::DeviceState& device = *delivery.device_;
  detail::Reporter reporter(*state_, device);

  auto run = [&](detail::ObjectSlot& slot) -> std::size_t {
    if (!slot.filter.matches(event)) return 0;
    return detail::run_guarded(
        slot.guard, [&] { slot.handler(event); },
        [&](std::string_view what) { reporter.handler_failed(event, what); });
  };

  std::size_t ran = 0;
  const detail::HandlerSet& handlers = delivery.object_handlers_;
  if (handlers.only) {
    ran = run(*handlers.only);
  } else if (handlers.several) {
    for (const auto& slot : *handlers.several) ran += run(*slot);
  } else if (!is_object(event.element_kind())) {
    ran = device.listeners(event, delivery.listener_epoch_, reporter);
  }

  auto& counts = device.counts_for(event.code());
  if (ran > 0) {
    counts.delivered.fetch_add(1, std::memory_order_relaxed);
  } else {
    counts.unclaimed.fetch_add(1, std::memory_order_relaxed);
    state_->unclaimed(event, reporter);
  }
  return ran;
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
    snapshot.counts_[i] = {
        state->counts[i].delivered.load(std::memory_order_relaxed),
        state->counts[i].unclaimed.load(std::memory_order_relaxed),
        state->counts[i].handler_failures.load(std::memory_order_relaxed)};
  }
  return snapshot;
}

}  // namespace ibev
