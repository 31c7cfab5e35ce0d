// Internal to dispatch/: the types behind a watched CQ. A completion
// channel in the reactor (ChannelSource), the CQs watched on it (ChannelCqs),
// and each CQ's entry (CqEntry), which is its watch's registration. One
// completion's path through them, and ibev's own completions (drain
// markers), are in completion_source.cc; watching a CQ and its teardown in
// cq_watch.cc.
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
#ifndef IBEV_DISPATCH_COMPLETION_SOURCE_H_
#define IBEV_DISPATCH_COMPLETION_SOURCE_H_

#include <infiniband/verbs.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <ibev/core/process.h>
#include <ibev/core/route.h>
#include "reactor.h"
#include "sources.h"

namespace ibev::detail {

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
// the registration its watch's Handle holds: release() (cq_watch.cc) takes
// it off its channel.
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

  // Inline into drain() (completion_source.cc, its one caller): on the hot
  // path, and no longer a function of this file's alone for GCC to inline
  // by itself.
  [[gnu::always_inline]] inline void hand_over(ibv_wc* wcs, std::size_t n) noexcept;
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
  // Inline into serve(), its one caller, as hand_over() into drain().
  [[gnu::always_inline]] inline std::shared_ptr<CqEntry> take_event() noexcept;

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

}  // namespace ibev::detail

#endif  // IBEV_DISPATCH_COMPLETION_SOURCE_H_
