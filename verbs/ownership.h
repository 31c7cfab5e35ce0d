// Internal to verbs/: unique_ptr deleters for rdma-core objects, and the
// errors every wrapper throws.
//
// A destroy verb failing in a destructor cannot throw; it is written to
// stderr with the verb's name and errno, never dropped silently.
#ifndef IBEV_VERBS_OWNERSHIP_H_
#define IBEV_VERBS_OWNERSHIP_H_

#include <memory>

namespace ibev::detail {

// Throws std::system_error(error, generic_category(), verb).
[[noreturn]] void throw_verb_error(const char* verb, int error);

void report_destroy_failure(const char* verb, int error) noexcept;

template <typename T, int (*Destroy)(T*), const char* Verb>
struct Destroyer {
  void operator()(T* object) const noexcept {
    if (object == nullptr) return;
    if (const int rc = Destroy(object); rc != 0) report_destroy_failure(Verb, rc);
  }
};

template <typename T, int (*Destroy)(T*), const char* Verb>
using Owned = std::unique_ptr<T, Destroyer<T, Destroy, Verb>>;

}  // namespace ibev::detail

#endif  // IBEV_VERBS_OWNERSHIP_H_
