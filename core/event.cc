#include <ibev/core/event.h>

#include <cstring>
#include <stdexcept>
#include <string>

namespace ibev {
namespace {

// ibv_async_event::event_type is a C enum; a newer kernel can put a value in
// it that ibv_event_type has no enumerator for. Copying the bits avoids
// loading an out-of-range enum value.
int code_of(const ibv_async_event& raw) noexcept {
  static_assert(sizeof(raw.event_type) == sizeof(int));
  int code;
  std::memcpy(&code, &raw.event_type, sizeof code);
  return code;
}

// The element's bits as an integer, for codes with no known member.
OpaqueElement opaque_bits(const ibv_async_event& raw) noexcept {
  OpaqueElement opaque{0};
  static_assert(sizeof(raw.element) <= sizeof(opaque.bits));
  std::memcpy(&opaque.bits, &raw.element, sizeof(raw.element));
  return opaque;
}

std::string element_description(ElementKind kind) {
  const ElementKindInfo* info = find_element_kind(kind);
  return std::string(info != nullptr ? info->description : "an invalid element");
}

// The CQ/QP/SRQ/WQ address an element names, or nullptr for the others.
const void* object_address(const Element& element) noexcept {
  return std::visit(
      [](auto value) -> const void* {
        if constexpr (std::is_pointer_v<decltype(value)>) {
          return value;
        } else {
          return nullptr;
        }
      },
      element);
}

}  // namespace

namespace {

// One overload per alternative of Element: one added without its kind here
// does not compile.
struct KindOf {
  ElementKind operator()(ibv_cq*) const noexcept { return ElementKind::kCq; }
  ElementKind operator()(ibv_qp*) const noexcept { return ElementKind::kQp; }
  ElementKind operator()(ibv_srq*) const noexcept { return ElementKind::kSrq; }
  ElementKind operator()(ibv_wq*) const noexcept { return ElementKind::kWq; }
  ElementKind operator()(Port) const noexcept { return ElementKind::kPort; }
  ElementKind operator()(WholeDevice) const noexcept { return ElementKind::kDevice; }
  ElementKind operator()(OpaqueElement) const noexcept { return ElementKind::kDevice; }
};

// The union member an Element stands for: each of its alternatives is one
// member of ibv_async_event's `element` (or none of them).
struct MemberOf {
  ElementMember operator()(ibv_cq*) const noexcept { return ElementMember::kCq; }
  ElementMember operator()(ibv_qp*) const noexcept { return ElementMember::kQp; }
  ElementMember operator()(ibv_srq*) const noexcept { return ElementMember::kSrq; }
  ElementMember operator()(ibv_wq*) const noexcept { return ElementMember::kWq; }
  ElementMember operator()(Port) const noexcept { return ElementMember::kPortNum; }
  ElementMember operator()(WholeDevice) const noexcept { return ElementMember::kNone; }
  ElementMember operator()(OpaqueElement) const noexcept { return ElementMember::kNone; }
};

// The member an element of `kind` arrives in (kNone for an invalid kind).
ElementMember member_of(ElementKind kind) noexcept {
  const ElementKindInfo* info = find_element_kind(kind);
  return info != nullptr ? info->member : ElementMember::kNone;
}

}  // namespace

ElementKind kind_of(const Element& element) noexcept { return std::visit(KindOf{}, element); }

Event Event::from_async(ibv_context* device,
                        const ibv_async_event& raw) noexcept {
  const int code = code_of(raw);
  const EventTypeInfo* info = find_event_type(code);
  if (info == nullptr) return Event(device, code, opaque_bits(raw), false);
  // Read through the member the kind's row names (kElementKinds), and of
  // the row's kind, which a kind sharing a member (a DCT is an ibv_qp) keeps.
  Event event = [&] {
    switch (member_of(info->element)) {
      case ElementMember::kCq:
        return Event(device, code, raw.element.cq, false);
      case ElementMember::kQp:
        return Event(device, code, raw.element.qp, false);
      case ElementMember::kSrq:
        return Event(device, code, raw.element.srq, false);
      case ElementMember::kWq:
        return Event(device, code, raw.element.wq, false);
      case ElementMember::kPortNum:
        return Event(device, code, Port{raw.element.port_num}, false);
      case ElementMember::kNone:
        break;
    }
    const DeviceLoss loss =
        code == IBV_EVENT_DEVICE_FATAL ? DeviceLoss::kFatal : DeviceLoss::kNone;
    return Event(device, code, WholeDevice{}, false, loss);
  }();
  event.kind_ = info->element;
  return event;
}

Event Event::device_lost(ibv_context* device, DeviceLoss loss) noexcept {
  return Event(device, IBV_EVENT_DEVICE_FATAL, WholeDevice{}, true, loss);
}

std::string_view to_string(DeviceLoss loss) noexcept {
  switch (loss) {
    case DeviceLoss::kNone:
      return "none";
    case DeviceLoss::kRemoved:
      return "removed";
    case DeviceLoss::kFatal:
      return "fatal";
    case DeviceLoss::kAsyncFdFailed:
      return "async fd failed";
  }
  return "unknown";
}

Event Event::synthesize(ibv_context* device, int code, Element element) {
  const EventTypeInfo* info = find_event_type(code);
  const ElementKind want = info != nullptr ? info->element : ElementKind::kDevice;
  const std::string what = describe_event_code(code);
  if (std::visit(MemberOf{}, element) != member_of(want)) {
    throw std::invalid_argument("Event::synthesize: " + what + " carries " +
                                element_description(want) + ", not " +
                                element_description(kind_of(element)));
  }
  if (is_object(want) && object_address(element) == nullptr) {
    throw std::invalid_argument("Event::synthesize: " + what +
                                " needs a non-null object");
  }
  if (const Port* port = std::get_if<Port>(&element); port && port->number < 1) {
    throw std::invalid_argument("Event::synthesize: " + what +
                                ": port numbers start at 1, got " +
                                std::to_string(port->number));
  }
  if (info != nullptr && std::holds_alternative<OpaqueElement>(element)) {
    throw std::invalid_argument("Event::synthesize: " + what +
                                " is a known code; give WholeDevice");
  }
  Event event(device, code, element, true);
  event.kind_ = want;
  return event;
}

Event Event::synthesize(ibv_context* device, int code, ObjectNumber object) {
  const EventTypeInfo* info = find_event_type(code);
  const std::string what = describe_event_code(code);
  if (!is_object(object.kind)) {
    throw std::invalid_argument("Event::synthesize: an ObjectNumber names a CQ, QP, SRQ or WQ, "
                                "not " + element_description(object.kind));
  }
  if (info == nullptr || info->element != object.kind) {
    throw std::invalid_argument("Event::synthesize: " + what + " carries " +
                                element_description(info != nullptr ? info->element
                                                                    : ElementKind::kDevice) +
                                ", not " + element_description(object.kind));
  }
  Event event(device, code, OpaqueElement{object.number}, true);
  event.kind_ = object.kind;
  event.numbered_ = true;
  return event;
}

std::string_view Event::name() const noexcept {
  const EventTypeInfo* i = info();
  if (i != nullptr) return i->name;
  // A code this build does not classify may still be one the libibverbs in
  // use names (rdma-core 62 names 20 "Device link speed change"); it says
  // "unknown" for the rest, and its strings are static. Only codes within
  // ibv_event_type's range of values (0..31) may be converted to it.
  if (code_ < 0 || code_ > 31) return "unknown";
  return ibv_event_type_str(static_cast<ibv_event_type>(code_));
}

Severity Event::severity() const noexcept {
  const EventTypeInfo* i = info();
  return i != nullptr ? i->severity : Severity::kUnknown;
}

std::optional<int> Event::port() const noexcept {
  if (const Port* p = std::get_if<Port>(&element_)) return p->number;
  return std::nullopt;
}

const void* Event::object() const noexcept {
  return object_address(element_);
}

}  // namespace ibev
