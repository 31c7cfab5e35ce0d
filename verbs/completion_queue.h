// ibev::CompletionChannel and ibev::CompletionQueue.
//
// CompletionQueue::create() mirrors the kernel's ib_alloc_cq / ib_create_cq
// (device, comp_handler, event_handler, attr, poll context): the CQ's async
// events (CQ_ERR) go to `on_event`, its work completions to `on_completion`,
// both on the dispatching thread unless an executor is given. The completion
// mode is chosen here (Options::completion.mode, dispatch/completions.h):
// kEvent and kAdaptive need a completion handler and give the CQ a channel
// (its own, or one shared through Options::channel); the CQ is armed before
// create() returns and drained by a Dispatcher (the device's, or the one
// Options::dispatcher names: a per-thread CQ, as SPDK's poll groups keep).
// kPolled takes no completion handler and no channel: the caller polls.
//
// close() (or the last shared_ptr going, from any thread or from inside one
// of its own handlers) stops completion delivery and acks every completion
// event still outstanding, detaches the event handler (waiting for a running
// handler unless on its thread), then destroys the CQ: ibv_destroy_cq never
// blocks on ibev. A CQ keeps its Device and channel alive; a channel of its
// own is no CompletionChannel object, just the CQ's, destroyed right after
// it (one object fewer per CQ: softroce_bench's `memory` run).
#ifndef IBEV_VERBS_COMPLETION_QUEUE_H_
#define IBEV_VERBS_COMPLETION_QUEUE_H_

#include <infiniband/verbs.h>

#include <memory>

#include <ibev/core/registry.h>
#include <ibev/dispatch/completions.h>
#include <ibev/dispatch/dispatcher.h>
#include <ibev/verbs/device.h>
#include <ibev/verbs/ownership.h>

namespace ibev {

namespace detail {
inline constexpr char kDestroyCompChannel[] = "ibv_destroy_comp_channel";
inline constexpr char kDestroyCq[] = "ibv_destroy_cq";
}  // namespace detail

class CompletionChannel : public detail::Closeable {
 public:
  // Throws std::invalid_argument (null device) or std::system_error
  // (ibv_create_comp_channel).
  static std::shared_ptr<CompletionChannel> create(std::shared_ptr<Device> device);
  ~CompletionChannel() override;

  ibv_comp_channel* get() const noexcept { return channel_.get(); }
  const std::shared_ptr<Device>& device() const noexcept { return device_; }
  void close() noexcept override;

 private:
  struct Token {};

 public:
  CompletionChannel(Token, std::shared_ptr<Device> device, ibv_comp_channel* channel);

 private:
  std::shared_ptr<Device> device_;
  detail::Owned<ibv_comp_channel, ibv_destroy_comp_channel, detail::kDestroyCompChannel, 0>
      channel_;
};

struct CompletionQueueOptions {
  int cqe = 64;  // at least this many entries
  // The channel to use; null: a channel of the CQ's own (kEvent, kAdaptive).
  std::shared_ptr<CompletionChannel> channel;
  // The mode, batches, budget, executor.
  CompletionOptions completion;
  // The Dispatcher that serves the completions; null: the device's. The CQ
  // may outlive it, as a Device may (verbs/device.h).
  Dispatcher* dispatcher = nullptr;
  int comp_vector = 0;
};

class CompletionQueue : public detail::Closeable {
 public:
  using Options = CompletionQueueOptions;

  // Throws std::invalid_argument (null device, cqe < 1, a channel of another
  // device, a completion handler with kPolled or none without) or
  // std::system_error (the failing verb and its errno).
  static std::shared_ptr<CompletionQueue> create(std::shared_ptr<Device> device,
                                                 CompletionHandler on_completion,
                                                 Handler on_event,
                                                 Options options = {});
  // A kPolled CQ (the kernel's IB_POLL_DIRECT): no completion handler, no
  // channel; the caller polls get(). Options::completion.mode is set for it.
  static std::shared_ptr<CompletionQueue> create_polled(std::shared_ptr<Device> device,
                                                        Handler on_event,
                                                        Options options = {});
  ~CompletionQueue() override;
  CompletionQueue(const CompletionQueue&) = delete;
  CompletionQueue& operator=(const CompletionQueue&) = delete;

  // Null once closed.
  ibv_cq* get() const noexcept { return cq_.get(); }
  const std::shared_ptr<Device>& device() const noexcept { return device_; }
  CompletionMode mode() const noexcept { return mode_; }
  // The Dispatcher serving its completions; null for kPolled, or once that
  // Dispatcher is destroyed.
  Dispatcher* served_by() const noexcept { return served_by_.lock().get(); }
  // Zero for a kPolled CQ, or once closed.
  CompletionStats completion_stats() const;
  void close() noexcept override;

 private:
  struct Token {};

 public:
  // `own_channel`: the CQ's own channel, or null (shared or kPolled).
  CompletionQueue(Token, std::shared_ptr<Device> device,
                  std::shared_ptr<CompletionChannel> shared_channel, ibv_comp_channel* own_channel,
                  ibv_cq* cq, CompletionMode mode, Dispatcher* served_by);

 private:
  std::shared_ptr<Device> device_;
  std::shared_ptr<CompletionChannel> shared_channel_;
  const CompletionMode mode_;
  const std::weak_ptr<Dispatcher> served_by_;  // empty for kPolled
  // Before cq_: destroyed after it.
  detail::Owned<ibv_comp_channel, ibv_destroy_comp_channel, detail::kDestroyCompChannel, 0>
      own_channel_;
  // Its event handler and its completions' watch.
  detail::Owned<ibv_cq, ibv_destroy_cq, detail::kDestroyCq, 2> cq_;
};

}  // namespace ibev

#endif  // IBEV_VERBS_COMPLETION_QUEUE_H_
