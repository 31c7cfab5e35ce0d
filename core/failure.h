// ibev::Failure: the one record of something that went wrong where no caller
// can catch it: a handler that threw, a verb that failed inside the event
// loop, a device whose async fd died, a destroy verb that failed in a
// destructor, events left undispatched, a dispatching thread held too long,
// a connection whose recovery gave up.
//
// Every such failure in ibev is one Failure, delivered to one sink: the
// FailureSink of the Registry (a Dispatcher's Options::on_failure), which
// also counts it per device and event code (Registry::counters). The sink runs
// on the thread where the failure happened (the dispatching thread, an
// executor's thread, a destroying thread, the Dispatcher's watchdog); it must
// not throw (what it throws is written to stderr and dropped) and should not
// block. With no sink set, failures are written to stderr, one line each.
//
// Errors a caller can catch are thrown instead, always as std::system_error
// carrying the errno and the name of the failing call (throw_system_error).
#ifndef IBEV_CORE_FAILURE_H_
#define IBEV_CORE_FAILURE_H_

#include <infiniband/verbs.h>

#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

namespace ibev {

struct Failure {
  enum class Kind {
    kHandlerThrew,   // an event, completion or fd handler threw: `what`
    kVerbFailed,     // a verb in the loop failed: `verb`, `error`
    kDeviceLost,     // a device's async fd failed; DEVICE_FATAL was sent
    kDestroyFailed,  // a destroy verb failed where nothing can throw
    kUndispatched,   // events waited for a dispatch that did not come
    kStalled,        // one turn held the dispatching thread too long
    kConnectionFailed,  // a connection's recovery gave up: `what` says why
  };

  // The common shapes; the caller adds device, object and event code.
  static Failure handler_threw(std::string what_ran, std::string what);
  static Failure verb_failed(std::string verb, int error, std::string what = {});

  Kind kind = Kind::kVerbFailed;
  std::string verb;          // the failing call, or what ran ("CQ handler")
  std::error_code error;     // errno, when a system call or verb failed
  ibv_context* device = nullptr;
  const void* object = nullptr;      // the CQ, QP, SRQ, WQ, channel or fd's source
  std::optional<int> event_code;     // the event being delivered, if any
  std::string what;                  // the exception's text, or details
};

std::string_view to_string(Failure::Kind kind) noexcept;

// The `verb` of a CQ's completion handler that threw: counted apart
// (CounterSnapshot::completion_handler_failures).
inline constexpr std::string_view kCompletionHandler = "completion handler";
// One line: "handler threw: CQ handler (CQ 0x...): <what>".
std::string describe(const Failure& failure);

using FailureSink = std::function<void(const Failure&)>;

// Hands `failure` to `sink`; with no sink, or one that throws, writes it to
// stderr. Never throws.
void send_to(const FailureSink& sink, const Failure& failure) noexcept;

// Runs `call` (a handler, a task); returns the text of what it threw, or
// nullopt when it returned. The one place ibev catches what application code
// throws.
template <typename Call>
std::optional<std::string> exception_text(Call&& call) noexcept {
  try {
    call();
    return std::nullopt;
  } catch (const std::exception& e) {
    return std::string(e.what());
  } catch (...) {
    return std::string("an exception not derived from std::exception");
  }
}

// Runs `call` as exception_text does; what it threw becomes a kHandlerThrew
// Failure naming `what_ran`, handed to `report` (void(Failure), noexcept),
// which adds what it knows (the device, the object). Returns whether `call`
// returned. The handlers of subscriptions and sources run through here
// inside their CallGuard, entered by the caller (core/route.h's
// guarded_call, or the reactor's enter of a source); posted tasks, a
// WorkerThread's and a drain's `done` run through here with no guard.
template <typename Call, typename Report>
bool reported_call(std::string_view what_ran, Call&& call, const Report& report) noexcept {
  auto threw = exception_text(std::forward<Call>(call));
  if (!threw) return true;
  report(Failure::handler_threw(std::string(what_ran), std::move(*threw)));
  return false;
}

// The errno an exception stands for, for a Failure's `error`: ENOMEM for
// std::bad_alloc, the code of a std::system_error, EINVAL for a
// std::logic_error (std::invalid_argument among them), EIO for the rest.
int errno_of(const std::exception& e) noexcept;

// Throws std::system_error(error, generic_category(), verb). rdma-core
// sometimes returns a negative errno, or fails without setting errno: those
// become the positive value and EIO.
[[noreturn]] void throw_system_error(const char* verb, int error);
[[noreturn]] void throw_system_error(const std::string& verb, int error);

}  // namespace ibev

#endif  // IBEV_CORE_FAILURE_H_
