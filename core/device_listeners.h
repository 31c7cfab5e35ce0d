// Internal to core/registry: one device's state, its listeners (the
// event_handler_list of ib_register_event_handler) and its counters.
#ifndef IBEV_CORE_DEVICE_LISTENERS_H_
#define IBEV_CORE_DEVICE_LISTENERS_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include <ibev/core/registry.h>
#include <ibev/core/subscriber_lists.h>

namespace ibev::detail {

struct AtomicEventCounts {
  std::atomic<std::uint64_t> delivered{0};
  std::atomic<std::uint64_t> unclaimed{0};
  std::atomic<std::uint64_t> handler_failures{0};
};

std::size_t bucket_of(int code) noexcept;

struct DeviceState {
  AtomicEventCounts& counts_for(int code) noexcept { return counts[bucket_of(code)]; }

  BroadcastList<EventSubscriber> listeners;
  std::array<AtomicEventCounts, CounterSnapshot::kTrackedCodes + 1> counts;
  std::atomic<std::uint64_t> completion_handler_failures{0};
  std::atomic<std::uint64_t> failures{0};
};

}  // namespace ibev::detail

#endif  // IBEV_CORE_DEVICE_LISTENERS_H_
