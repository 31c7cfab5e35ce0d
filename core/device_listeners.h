// Internal to core/registry: one device's listeners (its event_handler_list)
// and its counters.
//
// The list is a Boost.Signals2 signal: slots are called in connection order,
// connecting and disconnecting are safe while it is being called, and a
// call works on the list as it was when the call started. What Signals2 does
// not give is the resolve-time snapshot (a Delivery is called later than it
// is resolved): each listener is numbered by an epoch when it connects, a
// Delivery records the epoch at resolve, and a listener newer than that
// skips it. A counting combiner tells how many listeners ran.
#ifndef IBEV_CORE_DEVICE_LISTENERS_H_
#define IBEV_CORE_DEVICE_LISTENERS_H_

#include <array>
#include <atomic>
#include <boost/signals2/signal.hpp>
#include <cstddef>
#include <cstdint>
#include <memory>

#include <ibev/core/registry.h>
#include <ibev/core/subscriber.h>

namespace ibev::detail {

struct AtomicEventCounts {
  std::atomic<std::uint64_t> delivered{0};
  std::atomic<std::uint64_t> unclaimed{0};
  std::atomic<std::uint64_t> handler_failures{0};
};

std::size_t bucket_of(int code) noexcept;

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

struct DeviceState {
  using Listeners = boost::signals2::signal<
      bool(const Event&, std::uint64_t, const std::shared_ptr<RegistryState>&),
      CountRan>;

  // Connects `listener` after every listener connected before it.
  boost::signals2::connection connect(std::shared_ptr<Subscriber> listener);
  // The epoch a Delivery resolved now records.
  std::uint64_t current_epoch() const noexcept { return epoch.load(); }
  // Runs the listeners connected up to `resolved_epoch`; returns how many ran.
  std::size_t notify(const Event& event, std::uint64_t resolved_epoch,
                     const std::shared_ptr<RegistryState>& registry) {
    return listeners(event, resolved_epoch, registry);
  }

  AtomicEventCounts& counts_for(int code) noexcept { return counts[bucket_of(code)]; }

  Listeners listeners;
  std::atomic<std::uint64_t> epoch{0};
  std::array<AtomicEventCounts, CounterSnapshot::kTrackedCodes + 1> counts;
  std::atomic<std::uint64_t> completion_handler_failures{0};
  std::atomic<std::uint64_t> failures{0};
};

}  // namespace ibev::detail

#endif  // IBEV_CORE_DEVICE_LISTENERS_H_
