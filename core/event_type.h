// The classification of every rdma-core async event type.
//
// An ibv_async_event carries a union `element` whose live member depends on the
// event type: a CQ, QP, SRQ or WQ pointer, a port number, or nothing at all.
// This table is the one place that says which, so that no code in ibev ever
// guesses. It is constexpr and indexed by the event's numeric code.
//
// Severity follows the kernel's meaning of each event: `kFatal` leaves the
// object (or the device) unusable, `kError` reports a failure the object can
// be recovered from or that moved a QP to the error state, `kInformational`
// reports a state change. Codes this table does not know (a newer kernel's)
// are `kUnknown`: ibev keeps and routes them, it does not guess their meaning.
#ifndef IBEV_CORE_EVENT_TYPE_H_
#define IBEV_CORE_EVENT_TYPE_H_

#include <infiniband/verbs.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>

namespace ibev {

// What an async event's `element` names.
enum class ElementKind : std::uint8_t { kCq, kQp, kSrq, kWq, kPort, kDevice };

// The member of ibv_async_event's `element` union that carries an element
// (rdma-core's union has these and no others), or none: a device event, or
// a kind that only ever arrives named by number (ObjectNumber).
enum class ElementMember : std::uint8_t { kCq, kQp, kSrq, kWq, kPortNum, kNone };

// One row per ElementKind, in the enum's order: the one place a kind is
// described. to_string(), the messages that name a kind, is_object(),
// Event::from_async()'s read of the union, the recording's "scope" and the C
// API's mirror all read it, so a new kind (a DCT, a DevX object) is its
// enumerator, its row, and the C API's enumerator (docs/design.md, "Adding an
// element kind").
struct ElementKindInfo {
  ElementKind kind;
  std::string_view name;         // "cq": to_string(), a recording's "scope"
  std::string_view description;  // "a CQ", in messages
  bool object;                   // names an object (by address or number)
  ElementMember member;          // where ibv_async_event carries it
};

inline constexpr std::array<ElementKindInfo, 6> kElementKinds{{
    {ElementKind::kCq, "cq", "a CQ", true, ElementMember::kCq},
    {ElementKind::kQp, "qp", "a QP", true, ElementMember::kQp},
    {ElementKind::kSrq, "srq", "an SRQ", true, ElementMember::kSrq},
    {ElementKind::kWq, "wq", "a WQ", true, ElementMember::kWq},
    {ElementKind::kPort, "port", "a port number", false, ElementMember::kPortNum},
    {ElementKind::kDevice, "device", "no element (the device)", false, ElementMember::kNone},
}};

namespace detail {
constexpr bool kinds_are_indexed_by_kind() {
  for (std::size_t i = 0; i < kElementKinds.size(); ++i) {
    if (static_cast<std::size_t>(kElementKinds[i].kind) != i) return false;
  }
  return true;
}
}  // namespace detail
static_assert(detail::kinds_are_indexed_by_kind(),
              "kElementKinds[i] must describe ElementKind i");

// The row of `kind`, or nullptr for a value outside the enum.
constexpr const ElementKindInfo* find_element_kind(ElementKind kind) noexcept {
  const auto index = static_cast<std::size_t>(kind);
  return index < kElementKinds.size() ? &kElementKinds[index] : nullptr;
}

// True for the kinds that name an rdma-core object (CQ, QP, SRQ, WQ).
constexpr bool is_object(ElementKind kind) noexcept {
  const ElementKindInfo* info = find_element_kind(kind);
  return info != nullptr && info->object;
}

enum class Severity : std::uint8_t { kFatal, kError, kInformational, kUnknown };

struct EventTypeInfo {
  ibv_event_type type;
  std::string_view enumerator;  // "IBV_EVENT_CQ_ERR"
  std::string_view name;        // exactly as ibv_event_type_str() spells it
  ElementKind element;
  Severity severity;
};

inline constexpr std::array<EventTypeInfo, 20> kEventTypes{{
    {IBV_EVENT_CQ_ERR, "IBV_EVENT_CQ_ERR", "CQ error", ElementKind::kCq,
     Severity::kFatal},
    {IBV_EVENT_QP_FATAL, "IBV_EVENT_QP_FATAL",
     "local work queue catastrophic error", ElementKind::kQp, Severity::kFatal},
    {IBV_EVENT_QP_REQ_ERR, "IBV_EVENT_QP_REQ_ERR",
     "invalid request local work queue error", ElementKind::kQp,
     Severity::kError},
    {IBV_EVENT_QP_ACCESS_ERR, "IBV_EVENT_QP_ACCESS_ERR",
     "local access violation work queue error", ElementKind::kQp,
     Severity::kError},
    {IBV_EVENT_COMM_EST, "IBV_EVENT_COMM_EST", "communication established",
     ElementKind::kQp, Severity::kInformational},
    {IBV_EVENT_SQ_DRAINED, "IBV_EVENT_SQ_DRAINED", "send queue drained",
     ElementKind::kQp, Severity::kInformational},
    {IBV_EVENT_PATH_MIG, "IBV_EVENT_PATH_MIG", "path migrated",
     ElementKind::kQp, Severity::kInformational},
    {IBV_EVENT_PATH_MIG_ERR, "IBV_EVENT_PATH_MIG_ERR",
     "path migration request error", ElementKind::kQp, Severity::kError},
    {IBV_EVENT_DEVICE_FATAL, "IBV_EVENT_DEVICE_FATAL",
     "local catastrophic error", ElementKind::kDevice, Severity::kFatal},
    {IBV_EVENT_PORT_ACTIVE, "IBV_EVENT_PORT_ACTIVE", "port active",
     ElementKind::kPort, Severity::kInformational},
    {IBV_EVENT_PORT_ERR, "IBV_EVENT_PORT_ERR", "port error",
     ElementKind::kPort, Severity::kError},
    {IBV_EVENT_LID_CHANGE, "IBV_EVENT_LID_CHANGE", "LID change",
     ElementKind::kPort, Severity::kInformational},
    {IBV_EVENT_PKEY_CHANGE, "IBV_EVENT_PKEY_CHANGE", "P_Key change",
     ElementKind::kPort, Severity::kInformational},
    {IBV_EVENT_SM_CHANGE, "IBV_EVENT_SM_CHANGE", "SM change",
     ElementKind::kPort, Severity::kInformational},
    {IBV_EVENT_SRQ_ERR, "IBV_EVENT_SRQ_ERR", "SRQ catastrophic error",
     ElementKind::kSrq, Severity::kFatal},
    {IBV_EVENT_SRQ_LIMIT_REACHED, "IBV_EVENT_SRQ_LIMIT_REACHED",
     "SRQ limit reached", ElementKind::kSrq, Severity::kInformational},
    {IBV_EVENT_QP_LAST_WQE_REACHED, "IBV_EVENT_QP_LAST_WQE_REACHED",
     "last WQE reached", ElementKind::kQp, Severity::kInformational},
    {IBV_EVENT_CLIENT_REREGISTER, "IBV_EVENT_CLIENT_REREGISTER",
     "client reregistration", ElementKind::kPort, Severity::kInformational},
    {IBV_EVENT_GID_CHANGE, "IBV_EVENT_GID_CHANGE", "GID table change",
     ElementKind::kPort, Severity::kInformational},
    {IBV_EVENT_WQ_FATAL, "IBV_EVENT_WQ_FATAL", "WQ fatal", ElementKind::kWq,
     Severity::kFatal},
}};

namespace detail {
constexpr bool table_is_indexed_by_code() {
  for (std::size_t i = 0; i < kEventTypes.size(); ++i) {
    if (static_cast<std::size_t>(kEventTypes[i].type) != i) return false;
  }
  return true;
}
}  // namespace detail
static_assert(detail::table_is_indexed_by_code(),
              "kEventTypes[i] must describe event code i");

// The entry for `code`, or nullptr for a code this build does not know.
constexpr const EventTypeInfo* find_event_type(int code) noexcept {
  if (code < 0 || static_cast<std::size_t>(code) >= kEventTypes.size()) {
    return nullptr;
  }
  return &kEventTypes[static_cast<std::size_t>(code)];
}

// What an event of `code` names: its row's element, or kDevice for a code this
// build does not know (ibev keeps such events as device-scope).
constexpr ElementKind element_of(int code) noexcept {
  const EventTypeInfo* info = find_event_type(code);
  return info != nullptr ? info->element : ElementKind::kDevice;
}

// For messages: the enumerator ("IBV_EVENT_PORT_ERR"), or "event code 20" for
// a code this build does not know.
std::string describe_event_code(int code);
// For reports and recordings: the enumerator, or "unknown(20)".
std::string enumerator_name(int code);

// Its row's name: "cq", "qp", "srq", "wq", "port", "device".
std::string_view to_string(ElementKind kind) noexcept;
// "fatal", "error", "informational", "unknown".
std::string_view to_string(Severity severity) noexcept;
std::ostream& operator<<(std::ostream& out, ElementKind kind);
std::ostream& operator<<(std::ostream& out, Severity severity);

}  // namespace ibev

#endif  // IBEV_CORE_EVENT_TYPE_H_
