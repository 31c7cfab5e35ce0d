// The classification of every rdma_cm event type, as core/event_type.h is for
// async events: the one place that says what an rdma_cm_event names and what
// it carries, so that no code in ibev guesses.
//
// An rdma_cm_event names an id (`id`); for CONNECT_REQUEST that id is new, made
// by librdmacm for the incoming connection, and the listener (`listen_id`) is
// who hears it, as in the kernel, where a listener's children report to the
// listener's event_handler. DEVICE_REMOVAL and ADDR_CHANGE reach every id on
// the device or address: their meaning is device- or address-wide. What else
// an event carries lives in the union `param` and in `status`, by type.
//
// Codes this table does not know (a newer librdmacm's ADDRINFO_RESOLVED, say)
// are kept and delivered to the id they name, with Severity::kUnknown.
#ifndef IBEV_CM_CM_EVENT_TYPE_H_
#define IBEV_CM_CM_EVENT_TYPE_H_

#include <rdma/rdma_cma.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <ibev/core/event_type.h>
#include <ibev/health/health.h>

namespace ibev {

// Who hears an event, and what it is about.
enum class CmScope : std::uint8_t {
  kId,        // the id it names, about that id
  kListener,  // the listener; the id it names is a new one (CONNECT_REQUEST)
  kDevice,    // the id it names, about the id's whole device
  kAddress,   // the id it names, about the id's bound address
};

// What an event carries besides its type.
enum class CmPayload : std::uint8_t {
  kNothing,
  kStatus,      // status: a negative errno
  kConnection,  // param.conn: the peer's connection parameters, private data
  kRejection,   // status: the CM's reject reason (positive); param.conn's private data
  kDatagram,    // param.ud: address handle attributes, QP number, Q_Key
};

struct CmEventTypeInfo {
  rdma_cm_event_type type;
  std::string_view enumerator;  // exactly as rdma_event_str() spells it
  CmScope scope;
  CmPayload payload;
  Severity severity;
};

inline constexpr std::array<CmEventTypeInfo, 16> kCmEventTypes{{
    {RDMA_CM_EVENT_ADDR_RESOLVED, "RDMA_CM_EVENT_ADDR_RESOLVED", CmScope::kId, CmPayload::kNothing,
     Severity::kInformational},
    {RDMA_CM_EVENT_ADDR_ERROR, "RDMA_CM_EVENT_ADDR_ERROR", CmScope::kId, CmPayload::kStatus,
     Severity::kError},
    {RDMA_CM_EVENT_ROUTE_RESOLVED, "RDMA_CM_EVENT_ROUTE_RESOLVED", CmScope::kId,
     CmPayload::kNothing, Severity::kInformational},
    {RDMA_CM_EVENT_ROUTE_ERROR, "RDMA_CM_EVENT_ROUTE_ERROR", CmScope::kId, CmPayload::kStatus,
     Severity::kError},
    {RDMA_CM_EVENT_CONNECT_REQUEST, "RDMA_CM_EVENT_CONNECT_REQUEST", CmScope::kListener,
     CmPayload::kConnection, Severity::kInformational},
    {RDMA_CM_EVENT_CONNECT_RESPONSE, "RDMA_CM_EVENT_CONNECT_RESPONSE", CmScope::kId,
     CmPayload::kConnection, Severity::kInformational},
    {RDMA_CM_EVENT_CONNECT_ERROR, "RDMA_CM_EVENT_CONNECT_ERROR", CmScope::kId, CmPayload::kStatus,
     Severity::kError},
    {RDMA_CM_EVENT_UNREACHABLE, "RDMA_CM_EVENT_UNREACHABLE", CmScope::kId, CmPayload::kStatus,
     Severity::kError},
    {RDMA_CM_EVENT_REJECTED, "RDMA_CM_EVENT_REJECTED", CmScope::kId, CmPayload::kRejection,
     Severity::kError},
    {RDMA_CM_EVENT_ESTABLISHED, "RDMA_CM_EVENT_ESTABLISHED", CmScope::kId, CmPayload::kConnection,
     Severity::kInformational},
    {RDMA_CM_EVENT_DISCONNECTED, "RDMA_CM_EVENT_DISCONNECTED", CmScope::kId, CmPayload::kNothing,
     Severity::kInformational},
    {RDMA_CM_EVENT_DEVICE_REMOVAL, "RDMA_CM_EVENT_DEVICE_REMOVAL", CmScope::kDevice,
     CmPayload::kNothing, Severity::kFatal},
    {RDMA_CM_EVENT_MULTICAST_JOIN, "RDMA_CM_EVENT_MULTICAST_JOIN", CmScope::kId,
     CmPayload::kDatagram, Severity::kInformational},
    {RDMA_CM_EVENT_MULTICAST_ERROR, "RDMA_CM_EVENT_MULTICAST_ERROR", CmScope::kId,
     CmPayload::kStatus, Severity::kError},
    {RDMA_CM_EVENT_ADDR_CHANGE, "RDMA_CM_EVENT_ADDR_CHANGE", CmScope::kAddress, CmPayload::kNothing,
     Severity::kInformational},
    {RDMA_CM_EVENT_TIMEWAIT_EXIT, "RDMA_CM_EVENT_TIMEWAIT_EXIT", CmScope::kId, CmPayload::kNothing,
     Severity::kInformational},
}};

namespace detail {
constexpr bool cm_table_is_indexed_by_code() {
  for (std::size_t i = 0; i < kCmEventTypes.size(); ++i) {
    if (static_cast<std::size_t>(kCmEventTypes[i].type) != i) return false;
  }
  return true;
}
}  // namespace detail
static_assert(detail::cm_table_is_indexed_by_code(), "kCmEventTypes[i] must describe event code i");

// The entry for `code`, or nullptr for a code this build does not know.
constexpr const CmEventTypeInfo* find_cm_event_type(int code) noexcept {
  if (code < 0 || static_cast<std::size_t>(code) >= kCmEventTypes.size()) return nullptr;
  return &kCmEventTypes[static_cast<std::size_t>(code)];
}

// For messages: the enumerator, or "CM event code 16" for one not known.
std::string describe_cm_event_code(int code);

// A CM event that means its connection carries no traffic, as a cause for
// its ConnectionHealth (health/health.h; source kCmEvent): CONNECT_ERROR,
// UNREACHABLE, REJECTED, DISCONNECTED, DEVICE_REMOVAL, TIMEWAIT_EXIT. Any
// other code, unknown ones included, gives nothing.
std::optional<HealthCause> health_cause_of_cm_event(int code);

// "id", "listener", "device", "address".
std::string_view to_string(CmScope scope) noexcept;
// "nothing", "status", "connection", "rejection", "datagram".
std::string_view to_string(CmPayload payload) noexcept;

}  // namespace ibev

#endif  // IBEV_CM_CM_EVENT_TYPE_H_
