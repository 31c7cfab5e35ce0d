// Seams for tests only: hooks the dispatcher calls at points where ordering
// bugs lived, so that tests can act there deterministically. Not part of the
// API; null (and free) unless a test sets them.
#ifndef IBEV_DISPATCH_TEST_SEAMS_H_
#define IBEV_DISPATCH_TEST_SEAMS_H_

#include <infiniband/verbs.h>

namespace ibev::detail::test_seams {

// Called by the release of a CQ's completion watch right after it retired
// the CQ's channel (its last CQ), on the releasing thread, locks released:
// where a new watch of the same channel once found it half retired.
extern void (*after_channel_retired)(ibv_comp_channel* channel);

}  // namespace ibev::detail::test_seams

#endif  // IBEV_DISPATCH_TEST_SEAMS_H_
