#include <ibev/cm/cm_event_type.h>

namespace ibev {

std::string describe_cm_event_code(int code) {
  const CmEventTypeInfo* info = find_cm_event_type(code);
  return info != nullptr ? std::string(info->enumerator) : "CM event code " + std::to_string(code);
}

std::optional<HealthCause> health_cause_of_cm_event(int code) {
  switch (code) {
    case RDMA_CM_EVENT_CONNECT_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_REJECTED:
    case RDMA_CM_EVENT_DISCONNECTED:
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
    case RDMA_CM_EVENT_TIMEWAIT_EXIT:
      return HealthCause{HealthSource::kCmEvent, code, 0, describe_cm_event_code(code)};
    default:
      return std::nullopt;
  }
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
