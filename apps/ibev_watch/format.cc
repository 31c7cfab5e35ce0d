#include "apps/ibev_watch/format.h"

#include <cstdio>
#include <ctime>
#include <sstream>

namespace ibev::watch {
namespace {

std::string address(const void* object) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", object);
  return text;
}

}  // namespace

std::string enumerator_of(const Event& event) {
  return event.known() ? std::string(event.info()->enumerator)
                       : "unknown(" + std::to_string(event.code()) + ")";
}

std::string format_time(Clock::time_point time) {
  const auto since_epoch = time.time_since_epoch();
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(since_epoch);
  const auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(since_epoch - seconds);
  const std::time_t whole = seconds.count();
  std::tm utc{};
  gmtime_r(&whole, &utc);
  char text[64];
  std::snprintf(text, sizeof text, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ",
                utc.tm_year + 1900, utc.tm_mon + 1, utc.tm_mday, utc.tm_hour,
                utc.tm_min, utc.tm_sec, static_cast<long long>(micros.count()));
  return text;
}

std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string format_human(const Event& event, std::string_view device,
                         Clock::time_point time) {
  std::ostringstream out;
  out << format_time(time) << ' ' << device << ' ';
  if (const auto port = event.port()) {
    out << "port " << *port;
  } else if (const void* object = event.object()) {
    out << to_string(event.element_kind()) << ' ' << address(object);
  } else if (const auto number = event.object_number()) {
    out << to_string(event.element_kind()) << " #" << number->number;
  } else {
    out << "device";
  }
  out << ' ' << enumerator_of(event) << " (" << event.name() << ") "
      << to_string(event.severity());
  if (event.loss() != DeviceLoss::kNone) out << " [" << to_string(event.loss()) << "]";
  if (event.synthesized()) out << " [synthesized]";
  return out.str();
}

std::string format_json(const Event& event, std::string_view device,
                        Clock::time_point time) {
  std::ostringstream out;
  out << "{\"time\":" << json_string(format_time(time))
      << ",\"device\":" << json_string(device)
      << ",\"event\":" << json_string(enumerator_of(event))
      << ",\"code\":" << event.code()
      << ",\"scope\":" << json_string(to_string(event.element_kind()));
  if (const auto port = event.port()) {
    out << ",\"port\":" << *port;
  } else if (const void* object = event.object()) {
    out << ",\"object\":" << json_string(address(object));
  } else if (const auto number = event.object_number()) {
    out << ",\"number\":" << number->number;
  }
  out << ",\"severity\":" << json_string(to_string(event.severity()));
  if (event.loss() != DeviceLoss::kNone) out << ",\"loss\":" << json_string(to_string(event.loss()));
  if (event.synthesized()) out << ",\"synthesized\":true";
  out << '}';
  return out.str();
}

std::string format_change_human(std::string_view device, std::string_view node, bool added,
                                DeviceLoss loss, Clock::time_point time) {
  std::ostringstream out;
  out << format_time(time) << ' ' << device << " device " << (added ? "added" : "removed")
      << " (" << node;
  if (!added) out << ", " << to_string(loss);
  out << ')';
  return out.str();
}

std::string format_change_json(std::string_view device, std::string_view node, bool added,
                               DeviceLoss loss, Clock::time_point time) {
  std::ostringstream out;
  out << "{\"time\":" << json_string(format_time(time)) << ",\"device\":" << json_string(device)
      << ",\"change\":" << json_string(added ? "added" : "removed")
      << ",\"node\":" << json_string(node);
  if (!added) out << ",\"loss\":" << json_string(to_string(loss));
  out << '}';
  return out.str();
}

}  // namespace ibev::watch
