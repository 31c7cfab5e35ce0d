#include <ibev/verbs/completion_queue.h>

#include <cerrno>
#include <memory>
#include <stdexcept>
#include <utility>

namespace ibev {

std::shared_ptr<CompletionChannel> CompletionChannel::create(
    std::shared_ptr<Device> device) {
  if (!device) {
    throw std::invalid_argument("CompletionChannel::create: the device is null");
  }
  ibv_comp_channel* channel =
      ibv_create_comp_channel(device->require_open("ibv_create_comp_channel"));
  if (channel == nullptr) throw_system_error("ibv_create_comp_channel", errno);
  auto made = std::make_shared<CompletionChannel>(Token{}, device, channel);
  device->track(made);
  return made;
}

CompletionChannel::CompletionChannel(Token, std::shared_ptr<Device> device,
                                     ibv_comp_channel* channel)
    : device_(std::move(device)),
      channel_(channel, device_->context(), &device_->registry()) {}

CompletionChannel::~CompletionChannel() = default;

void CompletionChannel::close() noexcept { channel_.close(); }

std::shared_ptr<CompletionQueue> CompletionQueue::create(
    std::shared_ptr<Device> device, CompletionHandler on_completion,
    Handler on_event, Options options) {
  const char* verb = "CompletionQueue::create";
  if (!device) throw std::invalid_argument(std::string(verb) + ": the device is null");
  if (options.cqe < 1) {
    throw std::invalid_argument(std::string(verb) + ": cqe must be at least 1");
  }
  const CompletionMode mode = options.completion.mode;
  const bool polled = mode == CompletionMode::kPolled;
  if (polled && on_completion) {
    throw std::invalid_argument(std::string(verb) +
                                ": a kPolled CQ takes no completion handler");
  }
  if (!polled && !on_completion) {
    throw std::invalid_argument(std::string(verb) +
                                ": kEvent and kAdaptive need a completion handler "
                                "(kPolled: the caller polls)");
  }
  if (options.channel && (polled || options.channel->device() != device)) {
    throw std::invalid_argument(std::string(verb) +
                                ": the channel belongs to another device, or the CQ "
                                "is kPolled");
  }
  std::shared_ptr<CompletionChannel> shared_channel = std::move(options.channel);
  std::unique_ptr<ibv_comp_channel, int (*)(ibv_comp_channel*)> own_channel(
      nullptr, ibv_destroy_comp_channel);
  if (!polled && !shared_channel) {
    own_channel.reset(ibv_create_comp_channel(device->require_open("ibv_create_comp_channel")));
    if (!own_channel) throw_system_error("ibv_create_comp_channel", errno);
  }
  ibv_comp_channel* channel = shared_channel ? shared_channel->get() : own_channel.get();
  Dispatcher* served_by =
      polled ? nullptr : (options.dispatcher ? options.dispatcher : &device->dispatcher());

  ibv_cq* cq = ibv_create_cq(device->require_open("ibv_create_cq"), options.cqe, nullptr, channel,
                             options.comp_vector);
  if (cq == nullptr) throw_system_error("ibv_create_cq", errno);
  auto queue = std::make_shared<CompletionQueue>(Token{}, device, std::move(shared_channel),
                                                 own_channel.release(), cq, mode, served_by);
  // Handlers before anything can happen on the CQ: nothing is attached to it
  // yet, so no completion can precede the arming.
  if (on_event) queue->cq_.serve_with(device->registry().attach(cq, std::move(on_event)));
  if (served_by != nullptr) {
    queue->cq_.serve_with(served_by->watch_completions(cq, std::move(options.completion),
                                                       std::move(on_completion)));
  }
  device->track(queue);
  return queue;
}

std::shared_ptr<CompletionQueue> CompletionQueue::create_polled(
    std::shared_ptr<Device> device, Handler on_event, Options options) {
  options.completion.mode = CompletionMode::kPolled;
  return create(std::move(device), nullptr, std::move(on_event), std::move(options));
}

CompletionQueue::CompletionQueue(Token, std::shared_ptr<Device> device,
                                 std::shared_ptr<CompletionChannel> shared_channel,
                                 ibv_comp_channel* own_channel, ibv_cq* cq, CompletionMode mode,
                                 Dispatcher* served_by)
    : device_(std::move(device)),
      shared_channel_(std::move(shared_channel)),
      mode_(mode),
      served_by_(served_by != nullptr ? served_by->weak_ref() : std::weak_ptr<Dispatcher>{}),
      own_channel_(own_channel, device_->context(), &device_->registry()),
      cq_(cq, device_->context(), &device_->registry()) {}

CompletionQueue::~CompletionQueue() = default;

void CompletionQueue::close() noexcept {
  cq_.close();  // its watch first, which gives the channel's fd its flags back
  own_channel_.close();
}

CompletionStats CompletionQueue::completion_stats() const {
  const std::shared_ptr<Dispatcher> served_by = served_by_.lock();
  if (!served_by || cq_.get() == nullptr) return {};
  return served_by->completion_stats(cq_.get());
}

}  // namespace ibev
