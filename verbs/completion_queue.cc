#include <ibev/verbs/completion_queue.h>

#include <cerrno>
#include <stdexcept>
#include <utility>

namespace ibev {

std::shared_ptr<CompletionChannel> CompletionChannel::create(
    std::shared_ptr<Device> device) {
  if (!device) {
    throw std::invalid_argument("CompletionChannel::create: the device is null");
  }
  ibv_comp_channel* channel = ibv_create_comp_channel(device->context());
  if (channel == nullptr) detail::throw_verb_error("ibv_create_comp_channel", errno);
  return std::make_shared<CompletionChannel>(Token{}, std::move(device), channel);
}

CompletionChannel::CompletionChannel(Token, std::shared_ptr<Device> device,
                                     ibv_comp_channel* channel)
    : device_(std::move(device)), channel_(channel) {}

CompletionChannel::~CompletionChannel() = default;

std::shared_ptr<CompletionQueue> CompletionQueue::create(
    std::shared_ptr<Device> device, CompletionHandler on_completion,
    Handler on_event, Options options) {
  if (!device) {
    throw std::invalid_argument("CompletionQueue::create: the device is null");
  }
  if (options.cqe < 1) {
    throw std::invalid_argument("CompletionQueue::create: cqe must be at least 1");
  }
  if (options.channel && options.channel->device() != device) {
    throw std::invalid_argument(
        "CompletionQueue::create: the channel belongs to another device");
  }
  std::shared_ptr<CompletionChannel> channel = std::move(options.channel);
  if (on_completion && !channel) channel = CompletionChannel::create(device);

  ibv_cq* cq = ibv_create_cq(device->context(), options.cqe, nullptr,
                             on_completion ? channel->get() : nullptr,
                             options.comp_vector);
  if (cq == nullptr) detail::throw_verb_error("ibv_create_cq", errno);
  auto queue = std::make_shared<CompletionQueue>(Token{}, device,
                                                 on_completion ? channel : nullptr, cq);
  // Handlers before anything can happen on the CQ: nothing is attached to it
  // yet, so no completion can precede the arming.
  if (on_event) queue->events_ = device->registry().attach(cq, std::move(on_event));
  if (on_completion) {
    queue->completions_ = device->dispatcher().watch_completions(
        channel->get(), cq, std::move(on_completion), options.completion);
  }
  return queue;
}

CompletionQueue::CompletionQueue(Token, std::shared_ptr<Device> device,
                                 std::shared_ptr<CompletionChannel> channel,
                                 ibv_cq* cq)
    : device_(std::move(device)), channel_(std::move(channel)), cq_(cq) {}

CompletionQueue::~CompletionQueue() {
  // Explicit, though member order does the same: this is the destroy rule.
  completions_.release();  // acks what is outstanding; waits for a drain
  events_.release();       // waits for a running handler (not its own)
  cq_.reset();
}

}  // namespace ibev
