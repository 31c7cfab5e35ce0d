// Internal to verbs/: a QP's drain, as the kernel's ib_drain_qp
// (__ib_drain_sq, __ib_drain_rq) for userspace. start_drain registers what
// to wait for (each marker's completion, taken from its CQ before the
// application's handler sees it; QP_LAST_WQE_REACHED for a QP on an SRQ; a
// timer), moves the QP to ERR and posts the markers; the Drain answers
// `done` once, when all came, the time ran out, the device went, or close()
// cancelled it. Markers on kPolled CQs, which nothing serves, are polled by
// the caller after it let go of the QP (MarkerPoll).
//
// Nothing here waits on a thread but MarkerPoll::run, and that only for a
// kPolled CQ: it has no completion channel, so there is nothing to wait on
// but the CQ itself (polled with a short pause between empty polls, bounded
// by DrainOptions::timeout). The kernel does the same for its IB_POLL_DIRECT
// CQs: __ib_drain_sq calls ib_process_cq_direct between waits of HZ/10.
//
// Locking: a Drain's mutex (its progress) is a leaf, never held across
// `done`, a handle's release or a verb. queue_pair.cc says how close()
// orders itself with a drain.
#ifndef IBEV_VERBS_DRAIN_H_
#define IBEV_VERBS_DRAIN_H_

#include <infiniband/verbs.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <system_error>
#include <vector>

#include <ibev/dispatch/dispatcher.h>
#include <ibev/verbs/completion_queue.h>
#include <ibev/verbs/queue_pair.h>

namespace ibev::detail {

using DrainDone = std::function<void(const DrainReport&, std::error_code)>;

class Drain;  // one drain in progress (drain.cc)

// close() ended it: `done` runs now (with `error`); markers still to come
// are taken all the same, so none reaches the application.
void cancel(Drain& drain, std::error_code error) noexcept;

// A marker on a kPolled CQ, which drain polls for itself.
struct PolledMarker {
  ibv_cq* cq;
  std::uint64_t wr_id;
  bool is_send;
};

// Markers on kPolled CQs, which the drain polls for itself once its verbs
// are done: run by the caller after it let go of the QP, since `done` may
// drop the last reference to it. Holds those CQs while it polls.
struct MarkerPoll {
  std::shared_ptr<Drain> drain;  // null: nothing to poll
  std::vector<PolledMarker> markers;
  std::vector<std::shared_ptr<CompletionQueue>> cqs;
  std::uint32_t qp_num = 0;
  void run(const DrainOptions& options) noexcept;
};

// The kernel's __ib_drain_sq/__ib_drain_rq, for userspace: what to wait for
// is registered first (the markers' completions, LAST_WQE_REACHED, a
// timer), then the QP goes to ERR and the markers are posted; markers on
// kPolled CQs are left to the MarkerPoll it returns. `done` runs once.
// Throws (and `done` never runs) when it cannot start.
// `track`: told of the drain once it exists, before its verbs, so that a
// close() can end it; it throws to refuse (the QP is closing).
MarkerPoll start_drain(ibv_qp* qp, const QueuePairParents& parents, Dispatcher& events,
                       DrainedQueues queues, const DrainOptions& options, DrainDone done,
                       const std::function<void(const std::shared_ptr<Drain>&)>& track = {});

}  // namespace ibev::detail

#endif  // IBEV_VERBS_DRAIN_H_
