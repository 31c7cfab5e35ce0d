#include "tests/capi/c_caller.h"

ibev_waiter *ibev_test_wait_for_kind(ibev_dispatcher *dispatcher, int kind, void *target,
                                     const struct ibev_filter *filter, int timeout_ms) {
  return ibev_wait_for(dispatcher, (enum ibev_element_kind)kind, target, filter, timeout_ms);
}
