#include <ibev/core/device_listeners.h>

namespace ibev::detail {

std::size_t bucket_of(int code) noexcept {
  return code >= 0 && code < CounterSnapshot::kTrackedCodes
             ? static_cast<std::size_t>(code)
             : static_cast<std::size_t>(CounterSnapshot::kTrackedCodes);
}

std::uint64_t next_generation() noexcept {
  static std::atomic<std::uint64_t> last{0};
  return last.fetch_add(1, std::memory_order_relaxed) + 1;
}

}  // namespace ibev::detail
