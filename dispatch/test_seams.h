// Seams for tests only: hooks the dispatcher calls at points where ordering
// bugs lived, so that tests can act there deterministically. Not part of the
// API; null (and free) unless a test sets them.
#ifndef IBEV_DISPATCH_TEST_SEAMS_H_
#define IBEV_DISPATCH_TEST_SEAMS_H_

#include <infiniband/verbs.h>

#include <cstdint>

namespace ibev::detail::test_seams {

// Called by the release of a CQ's completion watch right after it retired
// the CQ's channel (its last CQ), on the releasing thread, locks released:
// where a new watch of the same channel once found it half retired.
extern void (*after_channel_retired)(ibv_comp_channel* channel);

// Called by a source that reads its fd itself (a device's async fd, a
// completion channel) before each read, on the dispatching thread, its serve
// begun: where a release on another thread could give the fd its blocking
// flags back under a read about to start.
extern void (*before_source_read)(int fd);

// Called in an adaptive CQ's turn right after its first drain (`drained`:
// completions the turn has taken so far), before its quiet clock starts, on the
// dispatching thread: a test holds the turn there while it makes completions
// land, or another source ready, without racing the poll budget.
extern void (*adaptive_turn_drained)(ibv_cq* cq, std::uint64_t drained);

// Called on the dispatching thread right after an adaptive CQ, quiet for its
// poll budget, was armed again: a test waits for it instead of sleeping.
extern void (*adaptive_cq_armed)(ibv_cq* cq);

// Called right before the reactor allocates the Handle of a source it is
// about to watch (an application's fd, a timer, a device's async fd), on
// the watching thread: a test throws std::bad_alloc there to check that a
// failed allocation leaves nothing watched and no fd open.
extern void (*before_handle_allocated)();

}  // namespace ibev::detail::test_seams

#endif  // IBEV_DISPATCH_TEST_SEAMS_H_
