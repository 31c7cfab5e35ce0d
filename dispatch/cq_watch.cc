// Watching a CQ, and its teardown: Dispatcher::watch_completions puts a CQ
// on its channel's source (adding the channel to the reactor with its first
// CQ), and a watch's release takes it off, acking the events read for it and
// retiring the channel with its last CQ. Also the look-ups by CQ
// (take_completion, completion_stats). The types, and how they are locked,
// are in completion_source.h; one completion's path in completion_source.cc.
#include <infiniband/verbs.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#include <ibev/core/process.h>
#include "completion_source.h"
#include "reactor.h"
#include "sources.h"
#include <ibev/dispatch/test_seams.h>

namespace ibev::detail {

// --- Watching a CQ, and its teardown ---

namespace {

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
