#include <ibev/core/event_filter.h>

#include <stdexcept>
#include <string>

namespace ibev {

EventFilter::EventFilter(std::initializer_list<ibv_event_type> types)
    : all_types_(false) {
  if (types.size() == 0) {
    throw std::invalid_argument(
        "EventFilter: an empty set of event types would match nothing");
  }
  for (ibv_event_type type : types) {
    const int code = static_cast<int>(type);
    if (find_event_type(code) == nullptr) {
      throw std::invalid_argument("EventFilter: " + std::to_string(code) +
                                  " is not an ibv_event_type");
    }
    types_ |= std::uint32_t{1} << code;
  }
}

EventFilter& EventFilter::on_port(int port) {
  if (port < 1) {
    throw std::invalid_argument(
        "EventFilter::on_port: port numbers start at 1, got " +
        std::to_string(port));
  }
  port_ = port;
  return *this;
}

bool EventFilter::has_type(int code) const noexcept {
  if (all_types_) return true;
  return find_event_type(code) != nullptr &&
         (types_ & (std::uint32_t{1} << code)) != 0;
}

bool EventFilter::matches(const Event& event) const noexcept {
  if (!has_type(event.code())) return false;
  if (!port_) return true;
  const std::optional<int> port = event.port();
  return !port || *port == *port_;
}

}  // namespace ibev
