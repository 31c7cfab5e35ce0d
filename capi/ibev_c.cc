// The C API's boundary (capi/ibev_c_internal.h has its rooms): the one
// translation of what C++ throws into an errno value and ibev_last_error()'s
// text, and the events' way into C: ibev_event, the C handler as a C++ one,
// the C filter, and the C enums that mirror the C++ ones.
#include <ibev/ibev_c.h>

#include <cstddef>
#include <iterator>
#include <string>

#include <ibev/core/event.h>
#include <ibev/core/event_filter.h>
#include <ibev/core/failure.h>
#include <ibev/dispatch/dispatcher.h>
#include <ibev/dispatch/event_wait.h>
#include <ibev/verbs/completion_queue.h>
#include "ibev_c_internal.h"

namespace ibev {
namespace detail {
namespace capi {
namespace {

thread_local std::string last_error;

}  // namespace

int failed(const char* api, const char* what, int error) noexcept {
  try {
    last_error = std::string(api) + ": " + what;
  } catch (...) {
    last_error.clear();  // no memory for the text; the errno still says it
  }
  errno = error;
  return error;
}

ibev_event to_c(const ibev::Event& event) noexcept {
  ibev_event c{};
  c.device = event.device();
  c.code = event.code();
  c.name = event.name().data();  // always a static, NUL-terminated string
  c.element_kind = static_cast<ibev_element_kind>(event.element_kind());
  c.severity = static_cast<ibev_severity>(event.severity());
  c.cq = event.cq();
  c.qp = event.qp();
  c.srq = event.srq();
  c.wq = event.wq();
  c.port = event.port().value_or(0);
  if (const auto number = event.object_number()) {
    c.numbered = 1;
    c.object_number = number->number;
  }
  c.synthesized = event.synthesized() ? 1 : 0;
  c.loss = static_cast<ibev_device_loss>(event.loss());
  return c;
}

// The C enums mirror the C++ ones value for value: a cast between them is
// the conversion. ibev_element_kind row for row with ibev::kElementKinds
// (kCElementKinds, ibev_c_internal.h):
static_assert(std::size(kCElementKinds) == ibev::kElementKinds.size(),
              "ibev_element_kind has one enumerator per ibev::ElementKind");
constexpr bool c_element_kinds_mirror() {
  for (std::size_t i = 0; i < ibev::kElementKinds.size(); ++i) {
    if (static_cast<int>(kCElementKinds[i]) != static_cast<int>(ibev::kElementKinds[i].kind)) {
      return false;
    }
  }
  return true;
}
static_assert(c_element_kinds_mirror(), "ibev_element_kind mirrors ibev::ElementKind");

// The others, enumerator by enumerator.
#define IBEV_C_MIRRORS(c_value, cpp_value) \
  static_assert(static_cast<int>(c_value) == static_cast<int>(cpp_value), #c_value)
IBEV_C_MIRRORS(IBEV_SEVERITY_FATAL, ibev::Severity::kFatal);
IBEV_C_MIRRORS(IBEV_SEVERITY_ERROR, ibev::Severity::kError);
IBEV_C_MIRRORS(IBEV_SEVERITY_INFORMATIONAL, ibev::Severity::kInformational);
IBEV_C_MIRRORS(IBEV_SEVERITY_UNKNOWN, ibev::Severity::kUnknown);
IBEV_C_MIRRORS(IBEV_LOSS_NONE, ibev::DeviceLoss::kNone);
IBEV_C_MIRRORS(IBEV_LOSS_REMOVED, ibev::DeviceLoss::kRemoved);
IBEV_C_MIRRORS(IBEV_LOSS_FATAL, ibev::DeviceLoss::kFatal);
IBEV_C_MIRRORS(IBEV_LOSS_ASYNC_FD_FAILED, ibev::DeviceLoss::kAsyncFdFailed);
IBEV_C_MIRRORS(IBEV_FAILURE_HANDLER_THREW, ibev::Failure::Kind::kHandlerThrew);
IBEV_C_MIRRORS(IBEV_FAILURE_VERB_FAILED, ibev::Failure::Kind::kVerbFailed);
IBEV_C_MIRRORS(IBEV_FAILURE_DEVICE_LOST, ibev::Failure::Kind::kDeviceLost);
IBEV_C_MIRRORS(IBEV_FAILURE_DESTROY_FAILED, ibev::Failure::Kind::kDestroyFailed);
IBEV_C_MIRRORS(IBEV_FAILURE_UNDISPATCHED, ibev::Failure::Kind::kUndispatched);
IBEV_C_MIRRORS(IBEV_FAILURE_STALLED, ibev::Failure::Kind::kStalled);
IBEV_C_MIRRORS(IBEV_FAILURE_CONNECTION_FAILED, ibev::Failure::Kind::kConnectionFailed);
IBEV_C_MIRRORS(IBEV_DEVICE_MONITOR_AUTO, ibev::DeviceMonitor::kAuto);
IBEV_C_MIRRORS(IBEV_DEVICE_MONITOR_UEVENTS, ibev::DeviceMonitor::kUevents);
IBEV_C_MIRRORS(IBEV_DEVICE_MONITOR_INOTIFY, ibev::DeviceMonitor::kInotify);
IBEV_C_MIRRORS(IBEV_DEVICE_MONITOR_RESCAN, ibev::DeviceMonitor::kRescan);
IBEV_C_MIRRORS(IBEV_DEVICE_MONITOR_OFF, ibev::DeviceMonitor::kOff);
IBEV_C_MIRRORS(IBEV_CQ_EVENT, ibev::CompletionMode::kEvent);
IBEV_C_MIRRORS(IBEV_CQ_ADAPTIVE, ibev::CompletionMode::kAdaptive);
IBEV_C_MIRRORS(IBEV_CQ_POLLED, ibev::CompletionMode::kPolled);
IBEV_C_MIRRORS(IBEV_WAIT_EVENT, ibev::WaitResult::Outcome::kEvent);
IBEV_C_MIRRORS(IBEV_WAIT_TIMED_OUT, ibev::WaitResult::Outcome::kTimedOut);
IBEV_C_MIRRORS(IBEV_WAIT_DEVICE_LOST, ibev::WaitResult::Outcome::kDeviceLost);
#undef IBEV_C_MIRRORS

ibev::Handler event_handler(ibev_event_fn handler, void* context) {
  if (handler == nullptr) return {};
  return [handler, context](const ibev::Event& event) {
    const ibev_event c = to_c(event);
    handler(&c, context);
  };
}

ibev::EventFilter to_filter(const ibev_filter* filter) {
  if (filter == nullptr) return {};
  ibev::EventFilter result;
  if (filter->count > 0) {
    result = ibev::EventFilter::of_codes(filter->codes, filter->count);
  }
  if (filter->port != 0) result.on_port(filter->port);
  return result;
}

}  // namespace capi
}  // namespace detail
}  // namespace ibev

extern "C" {

const char* ibev_last_error(void) { return ibev::detail::capi::last_error.c_str(); }

}  // extern "C"
