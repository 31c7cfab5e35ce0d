#include <ibev/core/device_listeners.h>

#include <utility>

namespace ibev::detail {

std::size_t bucket_of(int code) noexcept {
  return code >= 0 && code < CounterSnapshot::kTrackedCodes
             ? static_cast<std::size_t>(code)
             : static_cast<std::size_t>(CounterSnapshot::kTrackedCodes);
}

boost::signals2::connection DeviceState::connect(std::shared_ptr<Subscriber> listener) {
  listener->epoch = epoch.fetch_add(1) + 1;
  return listeners.connect(
      [listener = std::move(listener)](const Event& event, std::uint64_t resolved_epoch,
                                       const std::shared_ptr<RegistryState>& registry) {
        if (listener->epoch > resolved_epoch) return false;
        return detail::notify(listener, event, registry);
      });
}

}  // namespace ibev::detail
