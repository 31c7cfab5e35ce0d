// Owners for the C API's objects in tests: Owned<ibev_qp, ibev_qp_destroy>
// frees its object with its own C function when the test lets it go, so a
// failing check leaks nothing into the next case.
#ifndef IBEV_TESTS_CAPI_C_OWNED_H_
#define IBEV_TESTS_CAPI_C_OWNED_H_

#include <memory>

namespace ibev::testing {

template <auto free_it>
struct Freed {
  template <typename T>
  void operator()(T* object) const {
    free_it(object);
  }
};

template <typename T, auto free_it>
using Owned = std::unique_ptr<T, Freed<free_it>>;

}  // namespace ibev::testing

#endif  // IBEV_TESTS_CAPI_C_OWNED_H_
