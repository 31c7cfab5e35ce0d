#include <ibev/verbs/ownership.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <system_error>

namespace ibev::detail {

void throw_verb_error(const char* verb, int error) {
  // rdma-core sometimes returns a negative errno, or fails without setting it.
  if (error < 0) error = -error;
  if (error == 0) error = EIO;
  throw std::system_error(error, std::generic_category(), verb);
}

void report_destroy_failure(const char* verb, int error) noexcept {
  if (error < 0) error = -error;
  std::fprintf(stderr, "ibev: %s failed in a destructor: %s (errno %d)\n", verb,
               std::strerror(error), error);
}

}  // namespace ibev::detail
