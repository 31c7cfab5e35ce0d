#include "apps/ibev_watch/format.h"

#include <sstream>

#include <ibev/formats/recording.h>

namespace ibev::watch {

std::string format_human(const Event& event, std::string_view device, Clock::time_point time) {
  std::ostringstream out;
  out << iso8601_utc(time) << ' ' << device << ' ';
  if (const auto port = event.port()) {
    out << "port " << *port;
  } else if (const void* object = event.object()) {
    out << to_string(event.element_kind()) << ' ' << object_address(object);
  } else if (const auto number = event.object_number()) {
    out << to_string(event.element_kind()) << " #" << number->number;
  } else {
    out << "device";
  }
  out << ' ' << enumerator_name(event.code()) << " (" << event.name() << ") "
      << to_string(event.severity());
  if (event.loss() != DeviceLoss::kNone) out << " [" << to_string(event.loss()) << "]";
  if (event.synthesized()) out << " [synthesized]";
  return out.str();
}

std::string format_change_human(std::string_view device, std::string_view node, bool added,
                                DeviceLoss loss, Clock::time_point time) {
  std::ostringstream out;
  out << iso8601_utc(time) << ' ' << device << " device " << (added ? "added" : "removed") << " ("
      << node;
  if (!added) out << ", " << to_string(loss);
  out << ')';
  return out.str();
}

}  // namespace ibev::watch
