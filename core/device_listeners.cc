#include <ibev/core/device_listeners.h>

namespace ibev::detail {

std::size_t bucket_of(int code) noexcept {
  return code >= 0 && code < CounterSnapshot::kTrackedCodes
             ? static_cast<std::size_t>(code)
             : static_cast<std::size_t>(CounterSnapshot::kTrackedCodes);
}

}  // namespace ibev::detail
