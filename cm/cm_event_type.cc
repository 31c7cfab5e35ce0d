#include <ibev/cm/cm_event_type.h>

namespace ibev {

std::string describe_cm_event_code(int code) {
  const CmEventTypeInfo* info = find_cm_event_type(code);
  return info != nullptr ? std::string(info->enumerator) : "CM event code " + std::to_string(code);
}

std::string_view to_string(CmScope scope) noexcept {
  switch (scope) {
    case CmScope::kId:
      return "id";
    case CmScope::kListener:
      return "listener";
    case CmScope::kDevice:
      return "device";
    case CmScope::kAddress:
      return "address";
  }
  return "invalid";
}

std::string_view to_string(CmPayload payload) noexcept {
  switch (payload) {
    case CmPayload::kNothing:
      return "nothing";
    case CmPayload::kStatus:
      return "status";
    case CmPayload::kConnection:
      return "connection";
    case CmPayload::kRejection:
      return "rejection";
    case CmPayload::kDatagram:
      return "datagram";
  }
  return "invalid";
}

}  // namespace ibev
