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
  switch (kind) {
    case ElementKind::kCq:
      return "a CQ";
    case ElementKind::kQp:
      return "a QP";
    case ElementKind::kSrq:
      return "an SRQ";
    case ElementKind::kWq:
      return "a WQ";
    case ElementKind::kPort:
      return "a port number";
    case ElementKind::kDevice:
      return "no element (the device)";
  }
  return "an invalid element";
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

}  // namespace

ElementKind kind_of(const Element& element) noexcept { return std::visit(KindOf{}, element); }

Event Event::from_async(ibv_context* device,
                        const ibv_async_event& raw) noexcept {
  const int code = code_of(raw);
  const EventTypeInfo* info = find_event_type(code);
  if (info == nullptr) return Event(device, code, opaque_bits(raw), false);
  switch (info->element) {
    case ElementKind::kCq:
      return Event(device, code, raw.element.cq, false);
    case ElementKind::kQp:
      return Event(device, code, raw.element.qp, false);
    case ElementKind::kSrq:
      return Event(device, code, raw.element.srq, false);
    case ElementKind::kWq:
      return Event(device, code, raw.element.wq, false);
    case ElementKind::kPort:
      return Event(device, code, Port{raw.element.port_num}, false);
    case ElementKind::kDevice:
      break;
  }
  const DeviceLoss loss = code == IBV_EVENT_DEVICE_FATAL ? DeviceLoss::kFatal : DeviceLoss::kNone;
  return Event(device, code, WholeDevice{}, false, loss);
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
  if (kind_of(element) != want) {
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
  return Event(device, code, element, true);
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
