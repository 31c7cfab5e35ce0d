#include <ibev/core/event_type.h>

#include <ostream>

namespace ibev {

std::string describe_event_code(int code) {
  const EventTypeInfo* info = find_event_type(code);
  return info != nullptr ? std::string(info->enumerator)
                         : "event code " + std::to_string(code);
}

std::string enumerator_name(int code) {
  const EventTypeInfo* info = find_event_type(code);
  return info != nullptr ? std::string(info->enumerator) : "unknown(" + std::to_string(code) + ")";
}

std::string_view to_string(ElementKind kind) noexcept {
  const ElementKindInfo* info = find_element_kind(kind);
  return info != nullptr ? info->name : "invalid";
}

std::string_view to_string(Severity severity) noexcept {
  switch (severity) {
    case Severity::kFatal:
      return "fatal";
    case Severity::kError:
      return "error";
    case Severity::kInformational:
      return "informational";
    case Severity::kUnknown:
      return "unknown";
  }
  return "invalid";
}

std::ostream& operator<<(std::ostream& out, ElementKind kind) {
  return out << to_string(kind);
}

std::ostream& operator<<(std::ostream& out, Severity severity) {
  return out << to_string(severity);
}

}  // namespace ibev
