// Seams for tests only: hooks the verbs wrappers call at points where
// ordering bugs lived, so that tests can act there deterministically. Not
// part of the API; null (and free) unless a test sets them.
#ifndef IBEV_VERBS_TEST_SEAMS_H_
#define IBEV_VERBS_TEST_SEAMS_H_

#include <infiniband/verbs.h>

namespace ibev::detail::test_seams {

// Called by a drain between moving `qp` to ERR and posting its markers, on
// the draining thread: where a close() on another thread once destroyed the
// QP under the drain's post.
extern void (*before_drain_posts)(ibv_qp* qp);

// Called by Device::close() once it holds its close lock, before it closes
// what was made on the device, on the closing thread: where a second close()
// from a handler that the first waits for once deadlocked.
extern void (*device_closing)(ibv_context* context);

}  // namespace ibev::detail::test_seams

#endif  // IBEV_VERBS_TEST_SEAMS_H_
