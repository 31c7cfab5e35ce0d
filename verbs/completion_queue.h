// ibev::CompletionChannel and ibev::CompletionQueue.
//
// CompletionQueue::create() mirrors the kernel's ib_create_cq(device,
// comp_handler, event_handler, context, attr): the CQ's async events (CQ_ERR)
// go to `on_event`, its work completions to `on_completion`, both on the
// dispatching thread. With a completion handler the CQ gets a completion
// channel (its own, or one shared through Options::channel), is armed before
// create() returns, and is drained by the Dispatcher (arm-then-drain, acks
// amortised; see dispatch/dispatcher.h). Without one, the caller polls it.
//
// Destruction (the last shared_ptr going, from any thread or from inside one
// of its own handlers) stops completion delivery and acks every completion
// event still outstanding, detaches the event handler (waiting for a running
// handler unless on its thread), then destroys the CQ: ibv_destroy_cq never
// blocks on ibev. A CQ keeps its Device and channel alive.
#ifndef IBEV_VERBS_COMPLETION_QUEUE_H_
#define IBEV_VERBS_COMPLETION_QUEUE_H_

#include <infiniband/verbs.h>

#include <memory>

#include <ibev/core/registry.h>
#include <ibev/dispatch/dispatcher.h>
#include <ibev/verbs/device.h>
#include <ibev/verbs/ownership.h>

namespace ibev {

namespace detail {
inline constexpr char kDestroyCompChannel[] = "ibv_destroy_comp_channel";
inline constexpr char kDestroyCq[] = "ibv_destroy_cq";
}  // namespace detail

class CompletionChannel {
 public:
  // Throws std::invalid_argument (null device) or std::system_error
  // (ibv_create_comp_channel).
  static std::shared_ptr<CompletionChannel> create(std::shared_ptr<Device> device);
  ~CompletionChannel();

  ibv_comp_channel* get() const noexcept { return channel_.get(); }
  const std::shared_ptr<Device>& device() const noexcept { return device_; }

 private:
  struct Token {};

 public:
  CompletionChannel(Token, std::shared_ptr<Device> device, ibv_comp_channel* channel);

 private:
  std::shared_ptr<Device> device_;
  detail::Owned<ibv_comp_channel, ibv_destroy_comp_channel,
                detail::kDestroyCompChannel>
      channel_;
};

struct CompletionQueueOptions {
  int cqe = 64;  // at least this many entries
  // The channel to use; null: a channel of the CQ's own (with a handler).
  std::shared_ptr<CompletionChannel> channel;
  CompletionOptions completion;  // ack batch, poll batch, solicited only
  int comp_vector = 0;
};

class CompletionQueue {
 public:
  using Options = CompletionQueueOptions;

  // Throws std::invalid_argument (null device, cqe < 1, a channel of another
  // device) or std::system_error (the failing verb and its errno).
  static std::shared_ptr<CompletionQueue> create(std::shared_ptr<Device> device,
                                                 CompletionHandler on_completion,
                                                 Handler on_event,
                                                 Options options = {});
  ~CompletionQueue();
  CompletionQueue(const CompletionQueue&) = delete;
  CompletionQueue& operator=(const CompletionQueue&) = delete;

  ibv_cq* get() const noexcept { return cq_.get(); }
  const std::shared_ptr<Device>& device() const noexcept { return device_; }
  // Zero for a CQ without a completion handler.
  CompletionStats completion_stats() const noexcept { return completions_.stats(); }

 private:
  struct Token {};

 public:
  CompletionQueue(Token, std::shared_ptr<Device> device,
                  std::shared_ptr<CompletionChannel> channel, ibv_cq* cq);

 private:
  // Destroyed bottom-up: completions first, the device last.
  std::shared_ptr<Device> device_;
  std::shared_ptr<CompletionChannel> channel_;
  detail::Owned<ibv_cq, ibv_destroy_cq, detail::kDestroyCq> cq_;
  Attachment events_;
  CompletionWatch completions_;
};

}  // namespace ibev

#endif  // IBEV_VERBS_COMPLETION_QUEUE_H_
