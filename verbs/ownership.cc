#include <ibev/verbs/ownership.h>

#include <string>

namespace ibev::detail {

void report_destroy_failure(Registry* registry, ibv_context* device, const char* verb,
                            int error, const void* object) noexcept {
  if (error < 0) error = -error;
  Failure failure = Failure::verb_failed(verb, error == 0 ? EIO : error,
                                         "in a destructor or close(); the object is given up");
  failure.kind = Failure::Kind::kDestroyFailed;
  failure.device = device;
  failure.object = object;
  if (registry != nullptr) {
    registry->report(failure);
  } else {
    send_to({}, failure);
  }
}

void throw_closed(const char* verb) {
  throw std::system_error(ENODEV, std::generic_category(),
                          std::string(verb) + ": the object was closed");
}

}  // namespace ibev::detail
