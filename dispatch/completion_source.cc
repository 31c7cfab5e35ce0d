// Completion channels and their CQs, from the channel's fd being readable to
// the completion handler: read the channel event (ibv_get_cq_event) -> count
// it for an amortised ack -> drain the CQ into the handler -> re-arm
// (ibv_req_notify_cq) -> drain again. The path of one completion reads
// top-down: ChannelSource::serve, then CqEntry::serve_turn, then drain.
//
// The types it walks through, and how they are locked, are in
// completion_source.h; watching a CQ and its teardown in cq_watch.cc.
#include <sys/epoll.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <array>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>


#include <ibev/core/happens_before.h>
#include <ibev/core/process.h>
#include <ibev/core/route.h>
#include "completion_source.h"
#include "reactor.h"
#include "sources.h"
#include <ibev/dispatch/test_seams.h>

namespace ibev::detail {

void (*test_seams::after_channel_retired)(ibv_comp_channel*) = nullptr;
void (*test_seams::adaptive_turn_drained)(ibv_cq*, std::uint64_t) = nullptr;
void (*test_seams::adaptive_cq_armed)(ibv_cq*) = nullptr;

// --- One completion's path ---

// A CQ raises one event per arm, and is re-armed only after its event is
// read: so the channel holds at most one event per watched CQ, and reading
// more would only find EAGAIN, a system call on every wake-up of a
// latency-bound loop. With one CQ on the channel, drain it before reading
// its event: the handler's reply then costs no system call after the
// wake-up. Reading the event, counting it and re-arming follow, so the arm
// still precedes the last drain. (If that CQ was released meanwhile, the
// event read below is a stale one: acked there.)
void ChannelSource::serve(std::uint32_t) noexcept {
  IBEV_ASSERT_DISPATCHING(reactor_);
  unsigned events_to_read;
  std::shared_ptr<CqEntry> only_cq;
  {
    MutexLock lock(mutex);
    events_to_read = static_cast<unsigned>(std::min<std::size_t>(
        reactor_.options().batch, std::max<std::size_t>(cqs.size(), 1)));
    only_cq = cqs.only();
  }
  std::uint64_t drained_early = 0;
  if (only_cq) {
    if (const auto entered = only_cq->guard().enter()) {
      drained_early = only_cq->drain(only_cq->settings().budget);
    }
  }
  for (unsigned i = 0; i < events_to_read && !guard().closed(); ++i) {
    if (test_seams::before_source_read != nullptr) test_seams::before_source_read(fd());
    std::shared_ptr<CqEntry> entry = take_event();
    if (!entry) return;
    if (const auto entered = entry->guard().enter()) {
      entry->serve_turn(entry == only_cq ? std::exchange(drained_early, 0) : 0, true);
    }
  }
}

// Reads one channel event and counts it for its CQ's ack; null when there
// was none (or an error, reported), or when the channel left the loop. An
// event of a CQ no longer watched is acked here, so that destroying the CQ
// does not wait.
std::shared_ptr<CqEntry> ChannelSource::take_event() noexcept {
  MutexLock lock(mutex);
  // Its last CQ's release retires the channel under this lock, giving the
  // fd its blocking flags back: read after that, and this thread waits for
  // an event that may never come while the release waits for it. The event
  // left unread goes with the CQ's destruction.
  if (guard().closed()) return nullptr;
  for (;;) {
    ibv_cq* cq = nullptr;
    void* cq_context = nullptr;
    if (ibv_get_cq_event(channel_, &cq, &cq_context) != 0) {
      const int error = errno;
      if (error == EAGAIN || error == EWOULDBLOCK) {
        bump(reactor_.stats().empty_channel_reads);
      } else if (error != EINTR) {
        Failure failure = Failure::verb_failed("ibv_get_cq_event", error);
        failure.device = channel_->context;
        failure.object = channel_;
        reactor_.report(failure);
      }
      return nullptr;
    }
    bump(reactor_.stats().completion_events);
    std::shared_ptr<CqEntry> found = cqs.find(cq);
    if (!found) {
      ibv_ack_cq_events(cq, 1);
      bump(reactor_.stats().cq_ack_calls);
      continue;
    }
    CqEntry& entry = *found;
    bump(entry.stats().events);
    if (++entry.unacked >= entry.settings().ack_batch) {
      ibv_ack_cq_events(cq, entry.unacked);
      entry.unacked = 0;
      bump(entry.stats().ack_calls);
      bump(reactor_.stats().cq_ack_calls);
    }
    return found;
  }
}

// One turn of the CQ, after its channel event (`for_event`) or when it was
// deferred: drain, re-arm, drain again. The first drain runs the handler
// before the re-arm's system call, so a reply goes out one verb sooner than
// with arm-then-drain; the drain after the re-arm takes whatever landed
// before it, and a completion landing after it raises a new event, even if
// this drain takes it (that event then finds the CQ empty: counted, not an
// error). In adaptive mode, keep polling between the first drain and the
// re-arm while completions come, until the CQ has been quiet for the poll
// budget.
//
// The turn is bounded: at most `budget` completions, and adaptive polling
// at most one poll budget long, and no longer than it takes to see that
// another source is ready while the CQ is empty. A turn that ends on its bound leaves the
// CQ unarmed and deferred, so the reactor serves every other ready source
// and comes back without sleeping (the kernel's cq.c requeues its poll
// work the same way). `drained`: completions taken for this event already.
void CqEntry::serve_turn(std::uint64_t drained, bool for_event) noexcept {
  IBEV_ASSERT_DISPATCHING(reactor_);
  const std::uint64_t budget = settings_.budget;
  const auto poll_budget = settings_.poll_budget;
  const bool adaptive = settings_.adaptive;
  drained += drain(budget - std::min(drained, budget));
  if (adaptive && test_seams::adaptive_turn_drained != nullptr) {
    test_seams::adaptive_turn_drained(cq_, drained);
  }
  if (adaptive && (for_event || drained > 0)) {
    quiet_since_ = std::chrono::steady_clock::now();
  }
  if (drained >= budget) return yield();
  if (adaptive) {
    // Reading the clock costs more than an empty poll: look every 64 polls.
    const auto turn_start = std::chrono::steady_clock::now();
    for (unsigned empty = 0; watched(); ++empty) {
      if (const std::uint64_t more = drain(budget - drained); more > 0) {
        drained += more;
        bump(stats_.polled, more);
        quiet_since_ = std::chrono::steady_clock::now();
        if (drained >= budget || quiet_since_ - turn_start >= poll_budget) {
          return yield();
        }
        empty = 0;
      } else if (empty % 64 == 63) {
        const auto now = std::chrono::steady_clock::now();
        if (now - quiet_since_ >= poll_budget) break;  // quiet: arm and sleep
        // Spinning on an empty CQ while another source is ready would
        // hold it for up to a poll budget: give way, and spin on next turn
        // (the quiet clock goes on).
        if (now - turn_start >= poll_budget || reactor_.work_waiting()) return yield();
      }
    }
  }
  if (watched()) {
    if (const int rc = ibv_req_notify_cq(cq_, settings_.solicited_only ? 1 : 0); rc != 0) {
      report(Failure::verb_failed("ibv_req_notify_cq", rc));
    }
    if (adaptive && test_seams::adaptive_cq_armed != nullptr) test_seams::adaptive_cq_armed(cq_);
    drained += drain(budget - drained);
    if (drained >= budget) return yield();
  }
  if (drained == 0 && for_event) {
    bump(stats_.empty_events);
    bump(reactor_.stats().empty_completion_events);
  }
}

// Polls the CQ until it is empty, the watch is released or `limit`
// completions were taken, handing each batch to the handler; returns how
// many it took (== limit: the CQ may hold more).
std::uint64_t CqEntry::drain(std::uint64_t limit) noexcept {
  std::array<ibv_wc, 256> wcs;  // hand_over takes ibev's own out of it
  std::uint64_t drained = 0;
  while (drained < limit && watched()) {
    const auto want = std::min<std::uint64_t>(settings_.poll_batch, limit - drained);
    const int n = ibv_poll_cq(cq_, static_cast<int>(want), wcs.data());
    if (n < 0) {
      report(Failure::verb_failed("ibv_poll_cq", -n));
      break;
    }
    if (n == 0) break;
    drained += static_cast<std::uint64_t>(n);
    hand_over(wcs.data(), static_cast<std::size_t>(n));
  }
  return drained;
}

// The batch to the handler, less the completions ibev takes for itself,
// whose callbacks run right after it, on the same thread or task: after
// the handler has had every completion polled before them.
void CqEntry::hand_over(ibv_wc* wcs, std::size_t n) noexcept {
  std::vector<std::pair<std::shared_ptr<Taker>, ibv_wc>> taken;
  if (takers_armed_.load() != 0) n = take_ours(wcs, n, taken);
  bump(stats_.completions, n);
  bump(reactor_.stats().work_completions, n);
  if (!taken.empty()) bump(stats_.markers, taken.size());
  if (!settings_.executor) {
    if (n > 0) call_handler(CompletionBatch{cq_, wcs, n});
    for (const auto& [taker, wc] : taken) call_taker(taker, wc);
    return;
  }
  hand_to(
      *settings_.executor, guard_,
      [&] {
        return [self = self_.lock(), copy = std::vector<ibv_wc>(wcs, wcs + n),
                taken = std::move(taken)]() noexcept {
          if (!copy.empty()) {
            self->call_handler(CompletionBatch{self->cq_, copy.data(), copy.size()});
          }
          for (const auto& [taker, wc] : taken) self->call_taker(taker, wc);
        };
      },
      "a completion batch", [this](Failure failure) { report(std::move(failure)); });
}

void CqEntry::call_handler(const CompletionBatch& batch) noexcept {
  acquire_before_completion(cq_);  // what was written before the post
  reported_call(kCompletionHandler, [&] { handler_(batch); },
                [this](Failure failure) { report(std::move(failure)); });
}

void CqEntry::yield() noexcept {
  bump(stats_.yields);
  reactor_.defer([self = self_.lock()] {
    if (const auto entered = self->guard_.enter()) self->serve_turn(0, false);
  });
}

void CqEntry::report(Failure failure) noexcept {
  failure.device = cq_->context;
  failure.object = cq_;
  reactor_.report(failure);
}

// --- ibev's own completions: a drain's markers ---

// See Dispatcher::take_completion.
Handle CqEntry::take(std::uint32_t qp_num, std::uint64_t wr_id,
                     std::function<void(const ibv_wc&)> taken) {
  auto taker = std::make_shared<Taker>(std::move(taken), OneWorkRequest{qp_num, wr_id});
  std::call_once(takers_made_, [this] { takers_ = std::make_unique<Takers>(); });
  // The handle first: if making it throws, the taker waits for nothing (a
  // marker it would take, and a `taken` that would run, for a call that
  // threw); if waiting for it throws, the handle's release forgets it.
  Handle handle = subscription(taker, [weak = self_, process = OwningProcess{}](
                                          const Taker* taker) noexcept {
    if (process.inherited()) return false;  // the takers' lock may be held
    if (auto self = weak.lock()) self->forget(*taker);
    return true;
  });
  {
    MutexLock lock(takers_->mutex);
    takers_->waiting.push_back(std::move(taker));
    ++takers_armed_;
  }
  return handle;
}

// Moves the completions a Taker waits for out of `wcs` (each Taker takes
// one, once); returns how many are left, in their order.
std::size_t CqEntry::take_ours(ibv_wc* wcs, std::size_t n, Taken& taken) noexcept {
  // takers_ was made before takers_armed_ first counted one (seen above).
  MutexLock lock(takers_->mutex);
  std::vector<std::shared_ptr<Taker>>& waiting = takers_->waiting;
  std::size_t kept = 0;
  for (std::size_t i = 0; i < n; ++i) {
    auto it = std::find_if(waiting.begin(), waiting.end(),
                           [&](const auto& taker) { return taker->filter.matches(wcs[i]); });
    if (it == waiting.end()) {
      wcs[kept++] = wcs[i];
      continue;
    }
    try {
      taken.emplace_back(*it, wcs[i]);
    } catch (const std::bad_alloc&) {
      report(Failure::verb_failed("CqEntry::take_ours", ENOMEM, "a drain marker was lost"));
    }
    waiting.erase(it);
    --takers_armed_;
  }
  return kept;
}

// Only reached through a Handle that take() made: takers_ exists.
void CqEntry::forget(const Taker& taker) noexcept {
  MutexLock lock(takers_->mutex);
  std::vector<std::shared_ptr<Taker>>& waiting = takers_->waiting;
  auto it = std::find_if(waiting.begin(), waiting.end(),
                         [&](const auto& t) { return t.get() == &taker; });
  if (it == waiting.end()) return;
  waiting.erase(it);
  --takers_armed_;
}

void CqEntry::call_taker(const std::shared_ptr<Taker>& taker, const ibv_wc& wc) noexcept {
  call(taker, wc, "ibev's own completion",
       [this](Failure failure, const ibv_wc&) { report(std::move(failure)); });
}
}  // namespace ibev::detail
