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
std::uint64_t next_generation() noexcept;

struct DeviceState {
  AtomicEventCounts& counts_for(int code) noexcept { return counts[bucket_of(code)]; }

  // This state's number, never 0 nor reused: the device in the keys of
  // objects named by number (NumberKey), so that a device opened later at a
  // forgotten one's address never reaches the old one's handlers.
  const std::uint64_t generation = next_generation();

  BroadcastList<EventSubscriber> listeners;
  // ibev's own (Registry::listen_last): after the listeners and the counts.
  BroadcastList<EventSubscriber> last;
  std::array<AtomicEventCounts, CounterSnapshot::kTrackedCodes + 1> counts;
  std::atomic<std::uint64_t> completion_handler_failures{0};
  std::atomic<std::uint64_t> failures{0};
};

}  // namespace ibev::detail

#endif  // IBEV_CORE_DEVICE_LISTENERS_H_
