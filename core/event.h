// ibev::Event: one async event, with its element read through the only member
// its type allows.
//
// rdma-core hands out `ibv_async_event`, whose `element` is a C union: reading
// `port_num` of a QP event truncates a pointer to an int, and reading `qp` of a
// port event turns port 1 into the address 0x1. Event stores the element in a
// std::variant chosen from the classification table (core/event_type.h), so the
// wrong member cannot be read: cq()/qp()/srq()/wq() return nullptr and port()
// returns nullopt unless the event really carries that element.
//
// Events of a code this build does not know are kept, never dropped: they are
// device-scope, and their element's raw bits are kept as an opaque integer.
//
// An object event may name its object by number instead (ObjectNumber: a QP
// or SRQ number on its device), as a source that has no ibv_* address for it
// does (mlx5 DevX objects, a peer's report); it reaches the handlers attached
// by that number (Registry::attach(ibv_context*, ObjectNumber, ...)).
//
// Event is a small, trivially copyable value; it owns nothing. Thread-safe as
// any value (const access from many threads).
#ifndef IBEV_CORE_EVENT_H_
#define IBEV_CORE_EVENT_H_

#include <infiniband/verbs.h>

#include <cstdint>
#include <optional>
#include <string_view>
#include <variant>

#include <ibev/core/event_type.h>

namespace ibev {

// A port number, as the kernel reports it (ports count from 1).
struct Port {
  int number;
  friend bool operator==(Port a, Port b) { return a.number == b.number; }
};

// An object named by its number on its device: a QP number (ibv_qp::qp_num),
// an SRQ number, a DevX object's id. `kind` is an object kind (kCq, kQp, kSrq,
// kWq).
struct ObjectNumber {
  ElementKind kind;
  std::uint32_t number;
  friend bool operator==(ObjectNumber a, ObjectNumber b) {
    return a.kind == b.kind && a.number == b.number;
  }
};

// DEVICE_FATAL names no element: the whole device is meant.
struct WholeDevice {
  friend bool operator==(WholeDevice, WholeDevice) { return true; }
};

// The element of an event whose code ibev does not know, kept bit for bit;
// and of an event that names its object by number (Event::object_number()
// tells the two apart), holding the number.
struct OpaqueElement {
  std::uint64_t bits;
  friend bool operator==(OpaqueElement a, OpaqueElement b) {
    return a.bits == b.bits;
  }
};

// Why a device is gone, as the DEVICE_FATAL that says so carries it. Only
// DEVICE_FATAL carries one, and only when the device really is gone: events
// injected with Dispatcher::inject() never do.
enum class DeviceLoss : std::uint8_t {
  kNone,           // not a loss
  kRemoved,        // the kernel removed it: its uverbs node went away (a
                   // `rdma link delete`, the netdev deleted, an unbind)
  kFatal,          // the kernel reported DEVICE_FATAL
  kAsyncFdFailed,  // its async fd failed (EPOLLERR, EPOLLHUP, a read error)
};
std::string_view to_string(DeviceLoss loss) noexcept;
// Every way a device is lost (kNone is not one).
inline constexpr DeviceLoss kDeviceLosses[] = {DeviceLoss::kRemoved, DeviceLoss::kFatal,
                                               DeviceLoss::kAsyncFdFailed};

using Element = std::variant<ibv_cq*, ibv_qp*, ibv_srq*, ibv_wq*, Port,
                             WholeDevice, OpaqueElement>;

// The kind of element `element` holds (kDevice for WholeDevice and Opaque).
// For an event's kind use Event::element_kind(): an event that names its
// object by number holds OpaqueElement, and is of its object's kind.
ElementKind kind_of(const Element& element) noexcept;

class Event {
 public:
  // Reads `raw.element` through the member its event type names. Never fails:
  // an unknown code becomes a device-scope event keeping the raw bits.
  static Event from_async(ibv_context* device,
                          const ibv_async_event& raw) noexcept;

  // An event that did not come from rdma-core (injection, or a device that
  // vanished). Throws std::invalid_argument when `element` is not what `code`
  // carries, or names a null object or a port below 1.
  static Event synthesize(ibv_context* device, int code, Element element);
  // An object event that names its object by number. Throws
  // std::invalid_argument when `code` is not an event of `object.kind`.
  static Event synthesize(ibv_context* device, int code, ObjectNumber object);
  // The DEVICE_FATAL ibev sends a device's listeners when it notices the
  // device is gone by other means than the kernel's own DEVICE_FATAL.
  static Event device_lost(ibv_context* device, DeviceLoss loss) noexcept;

  ibv_context* device() const noexcept { return device_; }
  int code() const noexcept { return code_; }
  // nullptr for a code this build does not know.
  const EventTypeInfo* info() const noexcept { return find_event_type(code_); }
  bool known() const noexcept { return info() != nullptr; }
  // As ibv_event_type_str() of the libibverbs in use spells it: for a code
  // this build does not classify, rdma-core's own name if it has one (20 is
  // "Device link speed change" from rdma-core 62), else "unknown".
  std::string_view name() const noexcept;
  Severity severity() const noexcept;
  ElementKind element_kind() const noexcept { return kind_; }
  // For an event that names its object by number: OpaqueElement{number}.
  const Element& element() const noexcept { return element_; }

  // Each returns the element only when the event carries one of that kind.
  ibv_cq* cq() const noexcept { return get<ibv_cq*>(); }
  ibv_qp* qp() const noexcept { return get<ibv_qp*>(); }
  ibv_srq* srq() const noexcept { return get<ibv_srq*>(); }
  ibv_wq* wq() const noexcept { return get<ibv_wq*>(); }
  std::optional<int> port() const noexcept;
  // The CQ, QP, SRQ or WQ address for an object event; nullptr otherwise
  // (and for an event that names its object by number).
  const void* object() const noexcept;
  // The object's number, for an event that names its object by number.
  std::optional<ObjectNumber> object_number() const noexcept {
    if (!numbered_) return std::nullopt;
    return ObjectNumber{kind_, static_cast<std::uint32_t>(std::get<OpaqueElement>(element_).bits)};
  }

  // True for events ibev made itself, which are never acked to rdma-core.
  bool synthesized() const noexcept { return synthesized_; }
  // Why the device is gone, for a DEVICE_FATAL that means it is (the
  // kernel's own: kFatal); kNone for every other event.
  DeviceLoss loss() const noexcept { return loss_; }

 private:
  Event(ibv_context* device, int code, Element element, bool synthesized,
        DeviceLoss loss = DeviceLoss::kNone)
      : device_(device),
        code_(code),
        element_(element),
        synthesized_(synthesized),
        loss_(loss),
        kind_(kind_of(element)) {}

  template <typename T>
  T get() const noexcept {
    const T* p = std::get_if<T>(&element_);
    return p != nullptr ? *p : nullptr;
  }

  ibv_context* device_;
  int code_;
  Element element_;
  bool synthesized_;
  DeviceLoss loss_;
  // After the members 0.7 had, which keep their offsets.
  ElementKind kind_;       // of element_, or of the numbered object
  bool numbered_ = false;  // element_ is OpaqueElement{the object's number}
};

}  // namespace ibev

#endif  // IBEV_CORE_EVENT_H_
