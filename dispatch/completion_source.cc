// Completion channels and their CQs, from the channel's fd being readable to
// the completion handler: read the channel event (ibv_get_cq_event) -> count
// it for an amortised ack -> drain the CQ into the handler -> re-arm
// (ibv_req_notify_cq) -> drain again. The path of one completion reads
// top-down: ChannelSource::serve, then CqEntry::serve_turn, then drain.
//
// Locking: a channel's `mutex` guards its CQs and their unacked counts, and
// each read of its fd (its retirement takes it too); it is taken inside the
// reactor's table's mutex, never around it, and never while a handler runs.
// Each CQ's CallGuard is held while it is drained, so a release waits for a
// drain in progress (unless made from inside it).
//
// Memory: most CQs have a channel of their own, so the channel's source and
// the CQ that brought it in are one allocation (ChannelWithFirstCq), and the
// channel holds that CQ inline; a CQ joining a shared channel later is an
// allocation of its own (JoinedCq), which keeps its channel. A CQ's entry is
// its watch's registration (core/handle.h): the Handle is the entry, with no
// block of its own. What a CQ costs is what softroce_bench's `memory` run
// measures, and what a round robin over 1000s of CQs finds cold.
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
#include "reactor.h"
#include "sources.h"
#include <ibev/dispatch/test_seams.h>

namespace ibev::detail {

void (*test_seams::after_channel_retired)(ibv_comp_channel*) = nullptr;
void (*test_seams::adaptive_turn_drained)(ibv_cq*, std::uint64_t) = nullptr;
void (*test_seams::adaptive_cq_armed)(ibv_cq*) = nullptr;

namespace {

IBEV_DECLARE_ATOMIC_STATS(AtomicCompletionStats, CompletionStats, IBEV_COMPLETION_STATS);

class ChannelSource;

// CompletionOptions as an entry keeps them (validate() checked them): every
// CQ has one, and few name an executor.
struct CqSettings {
  explicit CqSettings(CompletionOptions options)
      : poll_budget(options.poll_budget),
        ack_batch(options.ack_batch),
        budget(options.budget),
        poll_batch(static_cast<std::uint16_t>(options.poll_batch)),
        adaptive(options.mode == CompletionMode::kAdaptive),
        solicited_only(options.solicited_only),
        executor(options.executor
                     ? std::make_unique<const Executor>(std::move(options.executor))
                     : nullptr) {}

  const std::chrono::microseconds poll_budget;
  const unsigned ack_batch;
  const unsigned budget;
  const std::uint16_t poll_batch;  // 1..256
  const bool adaptive;
  const bool solicited_only;
  const std::unique_ptr<const Executor> executor;  // null: the dispatching thread
};

// One watched CQ: its handler and options, its ack count, its turns. It is
// the registration its watch's Handle holds: release() (below
// watch_completions) takes it off its channel.
class CqEntry final : public Registration {
 public:
  CqEntry(Reactor& reactor, ChannelSource& channel, ibv_cq* cq, CompletionHandler handler,
          CompletionOptions options)
      : reactor_(reactor),
        channel_(channel),
        cq_(cq),
        handler_(std::move(handler)),
        settings_(std::move(options)) {}

  // The shared_ptr that owns it (which may alias a larger allocation), for
  // the work it hands on (an executor's task, a deferred turn, a release).
  void adopt(const std::shared_ptr<CqEntry>& self) noexcept { self_ = self; }

  ibv_cq* cq() const noexcept { return cq_; }
  const CqSettings& settings() const noexcept { return settings_; }
  CallGuard& guard() noexcept { return guard_; }
  AtomicCompletionStats& stats() noexcept { return stats_; }
  unsigned unacked = 0;  // under the channel's mutex

  // Still to be served: neither its watch released nor its Dispatcher
  // destroyed (a handler may destroy it; the turn then ends at once, without
  // calling the handler again, polling or re-arming).
  bool watched() const noexcept { return !guard_.closed() && !reactor_.orphaned.load(); }

  // One turn of the CQ (below); `drained`: completions taken for this event
  // already.
  void serve_turn(std::uint64_t drained, bool for_event) noexcept;
  // Polls into the handler, at most `limit`; returns how many it took.
  std::uint64_t drain(std::uint64_t limit) noexcept;
  // See Dispatcher::take_completion.
  Handle take(std::uint32_t qp_num, std::uint64_t wr_id,
              std::function<void(const ibv_wc&)> taken);

  void release() noexcept override;

 private:
  // The completion a Taker waits for: one work request of one QP.
  struct OneWorkRequest {
    std::uint32_t qp_num = 0;
    std::uint64_t wr_id = 0;
    bool matches(const ibv_wc& wc) const noexcept {
      return wc.qp_num == qp_num && wc.wr_id == wr_id;
    }
  };
  // A subscription of the routing primitive (core/route.h): its guarded
  // call and its release are the primitive's. It has no executor of its
  // own: the entry's runs its batch, takers included.
  using Taker = Subscriber<ibv_wc, OneWorkRequest>;
  // Made on first use: few CQs ever have a drain marker, every CQ has an entry.
  struct Takers {
    Mutex mutex;
    std::vector<std::shared_ptr<Taker>> waiting IBEV_GUARDED_BY(mutex);
  };
  using Taken = std::vector<std::pair<std::shared_ptr<Taker>, ibv_wc>>;

  void hand_over(ibv_wc* wcs, std::size_t n) noexcept;
  void call_handler(const CompletionBatch& batch) noexcept;
  void yield() noexcept;
  void report(Failure failure) noexcept;
  std::size_t take_ours(ibv_wc* wcs, std::size_t n, Taken& taken) noexcept;
  void forget(const Taker& taker) noexcept;
  void call_taker(const std::shared_ptr<Taker>& taker, const ibv_wc& wc) noexcept;

  std::weak_ptr<CqEntry> self_;
  // Serves it: valid while it is served, which the reactor's life bounds.
  Reactor& reactor_;
  // Its channel: in its own block (ChannelWithFirstCq), or held by it
  // (JoinedCq), so it outlives the entry.
  ChannelSource& channel_;
  ibv_cq* const cq_;
  const CompletionHandler handler_;
  const CqSettings settings_;
  CallGuard guard_;  // held while draining, here or on the executor
  AtomicCompletionStats stats_;
  // Completions ibev waits for itself (take_completion), by QP and wr_id.
  std::once_flag takers_made_;
  std::unique_ptr<Takers> takers_;
  std::atomic<std::size_t> takers_armed_{0};  // how many wait, read unlocked
  // Adaptive mode: since when the CQ has given nothing, kept across turns so
  // that a turn boundary does not restart the quiet period. Dispatching
  // thread only.
  std::chrono::steady_clock::time_point quiet_since_{};
};

// The CQs watched on one channel. Usually one (every CQ gets a channel of
// its own unless it shares one), held inline: no allocation. Several are
// kept sorted by address in a vector, found in log n; joining and leaving
// move the entries after it, which is what a channel shared by thousands of
// CQs pays at set-up. (A hash map paid a node and a 13-bucket array per
// channel, ~190 bytes a CQ: softroce_bench's `memory` run.)
class ChannelCqs {
 public:
  std::size_t size() const noexcept { return several_ ? several_->size() : (one_ ? 1 : 0); }
  bool empty() const noexcept { return size() == 0; }
  // The CQ when there is just one; null otherwise.
  const std::shared_ptr<CqEntry>& only() const noexcept { return one_; }
  // Null when `cq` is not watched here.
  std::shared_ptr<CqEntry> find(ibv_cq* cq) const {
    if (one_) return one_->cq() == cq ? one_ : nullptr;
    if (!several_) return nullptr;
    const auto it = lower_bound(cq);
    return it != several_->end() && it->first == cq ? it->second : nullptr;
  }
  // False when `cq` is watched here already.
  bool insert(ibv_cq* cq, std::shared_ptr<CqEntry> entry) {
    if (empty()) {
      one_ = std::move(entry);
      return true;
    }
    if (find(cq)) return false;
    if (one_) {
      auto several = std::make_unique<std::vector<Entry>>();
      several->reserve(2);
      several->emplace_back(one_->cq(), std::move(one_));
      several_ = std::move(several);
    }
    several_->emplace(lower_bound(cq), cq, std::move(entry));
    return true;
  }
  void erase(ibv_cq* cq) noexcept {
    if (one_) {
      if (one_->cq() == cq) one_.reset();
      return;
    }
    if (!several_) return;
    const auto it = lower_bound(cq);
    if (it == several_->end() || it->first != cq) return;
    several_->erase(it);
    if (several_->size() == 1) {
      one_ = std::move(several_->front().second);
      several_.reset();
    }
  }

 private:
  using Entry = std::pair<ibv_cq*, std::shared_ptr<CqEntry>>;

  // several_ is not null.
  std::vector<Entry>::iterator lower_bound(ibv_cq* cq) const noexcept {
    return std::lower_bound(
        several_->begin(), several_->end(), cq,
        [](const Entry& entry, ibv_cq* key) { return std::less<ibv_cq*>{}(entry.first, key); });
  }

  std::shared_ptr<CqEntry> one_;                  // set only when several_ is null
  std::unique_ptr<std::vector<Entry>> several_;  // two or more
};

// One completion channel in the reactor: its fd, the CQs watched on it.
class ChannelSource final : public Source {
 public:
  ChannelSource(const std::shared_ptr<Reactor>& reactor, ibv_comp_channel* channel,
                int original_flags)
      : Source(channel->fd, original_flags),
        reactor_(*reactor),
        owner_(reactor),
        process_(reactor->process()),
        channel_(channel) {}

  void serve(std::uint32_t revents) noexcept override;

  // A CQ's watch released: see CqEntry::release. Unchecked by the analysis:
  // it takes the table's lock only while the Dispatcher lives, which the
  // analysis cannot follow.
  void leave(CqEntry& entry) noexcept IBEV_NO_THREAD_SAFETY_ANALYSIS;

  // Taken around ibv_get_cq_event and the ack count, and by a release, so
  // that a release sees every event read for its CQ and acks it.
  Mutex mutex;
  ChannelCqs cqs IBEV_GUARDED_BY(mutex);

 private:
  std::shared_ptr<CqEntry> take_event() noexcept;

  Reactor& reactor_;                  // while it serves
  const std::weak_ptr<Reactor> owner_;  // for a release, which may come later
  const OwningProcess process_;
  ibv_comp_channel* const channel_;
};

// A channel and the CQ that brought it in, made together: most channels
// serve just that CQ. The channel's hold on it (its ChannelCqs) aliases this
// allocation, and ends when the CQ's watch is released.
struct ChannelWithFirstCq {
  ChannelWithFirstCq(const std::shared_ptr<Reactor>& reactor, ibv_comp_channel* channel,
                     int original_flags, ibv_cq* cq, CompletionHandler handler,
                     CompletionOptions options)
      : source(reactor, channel, original_flags),
        first(*reactor, source, cq, std::move(handler), std::move(options)) {}
  ChannelSource source;
  CqEntry first;
};

// A CQ joining a channel that serves others already: it keeps the channel,
// which may leave the reactor (the Dispatcher gone) before the CQ's watch is
// released, and which the release still takes the CQ off.
struct JoinedCq {
  JoinedCq(Reactor& reactor, std::shared_ptr<ChannelSource> channel, ibv_cq* cq,
           CompletionHandler handler, CompletionOptions options)
      : source(std::move(channel)),
        entry(reactor, *source, cq, std::move(handler), std::move(options)) {}
  const std::shared_ptr<ChannelSource> source;
  CqEntry entry;
};

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
  {
    MutexLock lock(takers_->mutex);
    takers_->waiting.push_back(taker);
    ++takers_armed_;
  }
  return subscription(std::move(taker), [weak = self_, process = OwningProcess{}](
                                             const Taker* taker) noexcept {
    if (process.inherited()) return false;  // the takers' lock may be held
    if (auto self = weak.lock()) self->forget(*taker);
    return true;
  });
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

// --- Watching a CQ, and its teardown ---

void validate(ibv_cq* cq, const CompletionOptions& options,
              const CompletionHandler& handler) {
  const std::string verb = "Dispatcher::watch_completions";
  if (cq == nullptr) throw std::invalid_argument(verb + ": the CQ is null");
  if (cq->channel == nullptr) {
    throw std::invalid_argument(verb + ": the CQ has no completion channel");
  }
  if (options.mode == CompletionMode::kPolled) {
    throw std::invalid_argument(
        verb + ": a kPolled CQ is polled by the application, not watched");
  }
  if (!handler) throw std::invalid_argument(verb + ": the handler is empty");
  if (options.ack_batch == 0 || options.poll_batch == 0 || options.poll_batch > 256 ||
      options.budget == 0) {
    throw std::invalid_argument(verb +
                                ": ack_batch and budget must be >= 1, poll_batch 1..256");
  }
  if (options.mode == CompletionMode::kAdaptive &&
      (options.poll_budget.count() < 1 || options.poll_budget > std::chrono::seconds(1))) {
    throw std::invalid_argument(verb + ": poll_budget must be 1 us .. 1 s");
  }
}

// The channel source serving `cq`'s channel, if any. The reactor's table
// knows no kinds (source.h), and a channel shared by several CQs is found
// there by its fd: this cast, and the one in watch_completions, are the only
// places a source's kind is asked, and each is checked (another kind of
// source on a channel's fd is the caller's error, or none).
std::shared_ptr<ChannelSource> channel_of(Reactor& reactor, ibv_cq* cq) {
  MutexLock lock(reactor.mutex());
  return std::dynamic_pointer_cast<ChannelSource>(
      reactor.find_fd_locked(cq->channel->fd));
}

}  // namespace

Handle watch_completions(const std::shared_ptr<Reactor>& reactor, ibv_cq* cq,
                         CompletionOptions options, CompletionHandler handler) {
  validate(cq, options, handler);
  ibv_comp_channel* channel = cq->channel;
  const bool solicited_only = options.solicited_only;
  std::shared_ptr<ChannelSource> source;
  std::shared_ptr<CqEntry> entry;
  {
    MutexLock lock(reactor->mutex());
    std::shared_ptr<Source> existing = reactor->find_fd_locked(channel->fd);
    source = std::dynamic_pointer_cast<ChannelSource>(existing);
    if (existing && !source) {
      throw std::invalid_argument(
          "Dispatcher::watch_completions: the channel's fd is watched as another source");
    }
    if (source) {
      auto joined =
          std::make_shared<JoinedCq>(*reactor, source, cq, std::move(handler), std::move(options));
      entry = std::shared_ptr<CqEntry>(joined, &joined->entry);
    } else {
      auto both =
          std::make_shared<ChannelWithFirstCq>(reactor, channel, make_nonblocking(channel->fd), cq,
                                               std::move(handler), std::move(options));
      source = std::shared_ptr<ChannelSource>(both, &both->source);
      entry = std::shared_ptr<CqEntry>(both, &both->first);
    }
    entry->adopt(entry);
    MutexLock channel_lock(source->mutex);
    if (!source->cqs.insert(cq, entry)) {
      throw std::invalid_argument("Dispatcher::watch_completions: the CQ is watched already");
    }
    if (!existing) {
      try {
        reactor->add_locked(source);
      } catch (...) {
        source->cqs.erase(cq);  // the channel's hold on its first CQ
        throw;
      }
    }
  }

  Handle handle(std::move(entry));

  // Armed before the caller can make any completion arrive.
  if (const int rc = ibv_req_notify_cq(cq, solicited_only ? 1 : 0); rc != 0) {
    handle.release();
    throw_system_error("ibv_req_notify_cq", rc);
  }
  return handle;
}

// A CQ's watch released: no turn of it starts again; it leaves its channel,
// whose events read for it are acked (so that ibv_destroy_cq does not wait),
// whether or not the Dispatcher still exists (gone, its thread is joined
// and nothing else counts); with its channel's last CQ the channel leaves
// the reactor. Then it waits for a turn in progress (unless this is it).
void CqEntry::release() noexcept { channel_.leave(*this); }

void ChannelSource::leave(CqEntry& entry) noexcept {
  if (process_.inherited()) return;  // a forked child's copy: inert
  entry.guard().close();
  const std::shared_ptr<Reactor> reactor = owner_.lock();
  // Every event read for this CQ was counted in `unacked`.
  const auto ack_leftovers = [&entry] {
    if (entry.unacked == 0) return false;
    ibv_ack_cq_events(entry.cq(), entry.unacked);
    entry.unacked = 0;
    bump(entry.stats().ack_calls);
    return true;
  };
  std::shared_ptr<Source> retired;
  bool closed_behind_our_back = false;
  {
    std::unique_lock<Mutex> lock;
    if (reactor) lock = std::unique_lock<Mutex>(reactor->mutex());
    // Leaving the channel also ends the channel's hold on its first CQ,
    // which shares the channel's allocation: this runs whether or not the
    // Dispatcher is still there.
    MutexLock channel_lock(mutex);
    cqs.erase(entry.cq());
    if (ack_leftovers() && reactor) bump(reactor->stats().cq_ack_calls);
    // The last CQ of the channel: stop watching the channel, so that it can
    // be destroyed. A CQ watched on it later adds it again.
    if (reactor && cqs.empty()) {
      retired = reactor->take_locked(id());
      if (retired && !reactor->retire_locked(*retired)) closed_behind_our_back = true;
    }
  }
  if (closed_behind_our_back) reactor->report_closed_fd(*retired);
  if (retired && test_seams::after_channel_retired != nullptr) {
    test_seams::after_channel_retired(entry.cq()->channel);
  }
  entry.guard().wait_idle();
  if (retired) retired->guard().wait_idle();
}

Handle take_completion(Reactor& reactor, ibv_cq* cq, std::uint32_t qp_num, std::uint64_t wr_id,
                       std::function<void(const ibv_wc&)> taken) {
  const std::string verb = "Dispatcher::take_completion";
  if (cq == nullptr || cq->channel == nullptr) {
    throw std::invalid_argument(verb + ": the CQ is null or has no channel");
  }
  if (!taken) throw std::invalid_argument(verb + ": the callback is empty");
  std::shared_ptr<ChannelSource> source = channel_of(reactor, cq);
  std::shared_ptr<CqEntry> entry;
  if (source) {
    MutexLock lock(source->mutex);
    entry = source->cqs.find(cq);
  }
  if (!entry) throw std::invalid_argument(verb + ": the CQ is not watched by this Dispatcher");
  return entry->take(qp_num, wr_id, std::move(taken));
}

CompletionStats completion_stats(Reactor& reactor, ibv_cq* cq) {
  if (cq == nullptr || cq->channel == nullptr) return {};
  std::shared_ptr<ChannelSource> source = channel_of(reactor, cq);
  if (!source) return {};
  MutexLock lock(source->mutex);
  const std::shared_ptr<CqEntry> entry = source->cqs.find(cq);
  return entry ? entry->stats().load() : CompletionStats{};
}

}  // namespace ibev::detail
