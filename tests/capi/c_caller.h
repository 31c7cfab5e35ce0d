// Calls into the C API made from C, for what C++ cannot express: a C caller
// may pass any int where an enum is asked for, while a C++ value of the enum
// type outside its range is undefined behaviour, which UBSan reports (at -O0)
// before the library sees it.
#ifndef IBEV_TESTS_CAPI_C_CALLER_H_
#define IBEV_TESTS_CAPI_C_CALLER_H_

#include <ibev/ibev_c.h>

#ifdef __cplusplus
extern "C" {
#endif

// ibev_wait_for with `kind` converted to enum ibev_element_kind in C.
ibev_waiter *ibev_test_wait_for_kind(ibev_dispatcher *dispatcher, int kind, void *target,
                                     const struct ibev_filter *filter, int timeout_ms);

#ifdef __cplusplus
}
#endif

#endif  // IBEV_TESTS_CAPI_C_CALLER_H_
