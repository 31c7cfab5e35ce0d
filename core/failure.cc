#include <ibev/core/failure.h>

#include <cerrno>
#include <cstdio>
#include <new>
#include <stdexcept>
#include <sstream>
#include <utility>

namespace ibev {

std::string_view to_string(Failure::Kind kind) noexcept {
  switch (kind) {
    case Failure::Kind::kHandlerThrew: return "handler threw";
    case Failure::Kind::kVerbFailed: return "verb failed";
    case Failure::Kind::kDeviceLost: return "device lost";
    case Failure::Kind::kDestroyFailed: return "destroy failed";
    case Failure::Kind::kUndispatched: return "events undispatched";
    case Failure::Kind::kStalled: return "dispatch stalled";
    case Failure::Kind::kConnectionFailed: return "connection failed";
  }
  return "failure";
}

Failure Failure::handler_threw(std::string what_ran, std::string what) {
  Failure failure;
  failure.kind = Kind::kHandlerThrew;
  failure.verb = std::move(what_ran);
  failure.what = std::move(what);
  return failure;
}

Failure Failure::verb_failed(std::string verb, int error, std::string what) {
  Failure failure;
  failure.kind = Kind::kVerbFailed;
  failure.verb = std::move(verb);
  failure.error = std::error_code(error < 0 ? -error : error, std::generic_category());
  failure.what = std::move(what);
  return failure;
}

std::string describe(const Failure& failure) {
  std::ostringstream out;
  out << to_string(failure.kind);
  if (!failure.verb.empty()) out << ": " << failure.verb;
  if (failure.object != nullptr) out << " (" << failure.object << ')';
  if (failure.device != nullptr) out << " on device " << failure.device;
  if (failure.event_code) out << ", event " << *failure.event_code;
  if (failure.error) {
    out << ": " << failure.error.message() << " (errno " << failure.error.value()
        << ')';
  }
  if (!failure.what.empty()) out << ": " << failure.what;
  return out.str();
}

void send_to(const FailureSink& sink, const Failure& failure) noexcept {
  if (sink) {
    const auto threw = exception_text([&] { sink(failure); });
    if (!threw) return;
    std::fprintf(stderr, "ibev: the failure sink threw (%s) on: ", threw->c_str());
  }
  try {
    std::fprintf(stderr, "ibev: %s\n", describe(failure).c_str());
  } catch (...) {
  }
}

int errno_of(const std::exception& e) noexcept {
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) return ENOMEM;
  if (const auto* system = dynamic_cast<const std::system_error*>(&e)) {
    const std::error_code& code = system->code();
    const bool an_errno =
        code.category() == std::generic_category() || code.category() == std::system_category();
    return an_errno && code.value() != 0 ? code.value() : EIO;
  }
  if (dynamic_cast<const std::logic_error*>(&e) != nullptr) return EINVAL;
  return EIO;
}

void throw_system_error(const char* verb, int error) {
  if (error < 0) error = -error;
  if (error == 0) error = EIO;
  throw std::system_error(error, std::generic_category(), verb);
}

void throw_system_error(const std::string& verb, int error) {
  throw_system_error(verb.c_str(), error);
}

}  // namespace ibev
