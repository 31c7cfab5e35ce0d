// What a CQ's completion handler gets, how it is served, and its figures.
//
// The completion mode is chosen when the CQ is watched, like the kernel's
// ib_poll_context at ib_alloc_cq: kEvent sleeps on the completion channel
// between bursts, kAdaptive keeps polling while completions come (NAPI's
// trade: no event round trip under load, some spinning per burst), kPolled is
// a CQ the application polls itself (no channel, no handler; verbs/ makes it
// without a completion channel).
#ifndef IBEV_DISPATCH_COMPLETIONS_H_
#define IBEV_DISPATCH_COMPLETIONS_H_

#include <infiniband/verbs.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>

#include <ibev/core/executor.h>
#include <ibev/core/stats.h>

namespace ibev {

// The work completions one ibv_poll_cq returned.
struct CompletionBatch {
  ibv_cq* cq;
  const ibv_wc* data;
  std::size_t size;
  const ibv_wc* begin() const noexcept { return data; }
  const ibv_wc* end() const noexcept { return data + size; }
};

using CompletionHandler = std::function<void(const CompletionBatch&)>;

enum class CompletionMode { kEvent, kAdaptive, kPolled };

struct CompletionOptions {
  CompletionMode mode = CompletionMode::kEvent;
  // Ack completion events with one ibv_ack_cq_events per this many.
  unsigned ack_batch = 32;
  // Work completions taken per ibv_poll_cq (1..256).
  unsigned poll_batch = 16;
  // Arm for solicited completions only.
  bool solicited_only = false;
  // kAdaptive: after an event, keep polling the CQ until it has been empty
  // for this long, then arm and drain once more before sleeping. A turn of
  // polling lasts at most this long too (and at most `budget` completions),
  // and while the CQ is empty it yields as soon as another source is ready
  // (looked at every 64 empty polls): it is then polled again on the next
  // turn, still unarmed. 1 us .. 1 s.
  std::chrono::microseconds poll_budget{50};
  // Work completions this CQ may take per turn, like the kernel's
  // IB_POLL_BUDGET_IRQ: a CQ under sustained inflow then delays other CQs,
  // async events and stop() by one turn at most. A CQ that used its budget is
  // served again next turn before the dispatcher sleeps. At least 1.
  unsigned budget = 256;
  // Where the handler runs (core/executor.h); empty: the dispatching thread.
  // On an executor the handler gets a copy of each batch.
  Executor executor;
};

// events: channel events taken for this CQ; ack_calls: ibv_ack_cq_events
// calls made for it; empty_events: events whose drain found nothing;
// completions: work completions handed to the handler (with an executor:
// queued for it); markers: those taken instead by Dispatcher::take_completion
// (a drain's markers), never handed to the handler; polled: work
// completions found by adaptive polling (markers included); yields: turns that ended on a bound (the budget, or
// giving way to another ready source while spinning on an empty CQ).
#define IBEV_COMPLETION_STATS(X) \
  X(events) X(ack_calls) X(empty_events) X(completions) X(markers) X(polled) X(yields)
IBEV_DECLARE_STATS(CompletionStats, IBEV_COMPLETION_STATS);

}  // namespace ibev

#endif  // IBEV_DISPATCH_COMPLETIONS_H_
