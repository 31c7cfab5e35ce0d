// A device's async events, from the fd being readable to the handlers:
// read (ibv_get_async_event) -> resolve in the Registry -> ack
// (ibv_ack_async_event) -> deliver. Resolving before the ack is the point:
// once acked, the object may be destroyed and its address reused, and the
// event must not reach the newcomer. A failed fd means the device is gone.
//
// Locking: none of its own; the reactor's tables (reactor.cc) guard its
// joining and leaving.
#include <sys/epoll.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#include "reactor.h"
#include "sources.h"

namespace ibev::detail {
namespace {

class AsyncEventSource final : public Source {
 public:
  AsyncEventSource(Reactor& reactor, ibv_context* device, int original_flags)
      : Source(device->async_fd, original_flags), reactor_(reactor), device_(device) {}

  void serve(std::uint32_t revents) noexcept override {
    if ((revents & (EPOLLERR | EPOLLHUP)) != 0) {
      lose_device((revents & EPOLLERR) ? "EPOLLERR" : "EPOLLHUP", 0);
      return;
    }
    for (unsigned i = 0; i < reactor_.options().batch; ++i) {
      ibv_async_event raw;
      if (ibv_get_async_event(device_, &raw) != 0) {
        const int error = errno;
        if (error == EAGAIN || error == EWOULDBLOCK) return;
        if (error == EINTR) continue;
        lose_device("ibv_get_async_event", error);
        return;
      }
      bump(reactor_.stats().async_events);
      std::optional<Delivery> delivery;
      try {
        delivery.emplace(reactor_.registry().resolve(Event::from_async(device_, raw)));
      } catch (const std::exception& e) {
        report_verb("Registry::resolve", ENOMEM, e.what());
      }
      ibv_ack_async_event(&raw);
      if (delivery) reactor_.registry().deliver(*delivery);
      // Released from a handler: the device may be closed already.
      if (guard().closed()) return;
    }
  }

 private:
  void report_verb(const char* verb, int error, std::string what) noexcept {
    Failure failure = Failure::verb_failed(verb, error, std::move(what));
    failure.device = device_;
    reactor_.report(failure);
  }

  // The fd failed: the device is gone. Its listeners hear DEVICE_FATAL, as
  // they would from the kernel, marked synthesized.
  void lose_device(const char* how, int error) noexcept {
    Failure failure = Failure::verb_failed(how, error,
                                           "the device's async fd failed; sending "
                                           "DEVICE_FATAL to its listeners");
    failure.kind = Failure::Kind::kDeviceLost;
    failure.device = device_;
    reactor_.report(failure);
    reactor_.remove(id());  // not waited on: this is the one serving it
    bump(reactor_.stats().devices_lost);
    try {
      reactor_.registry().deliver(reactor_.registry().resolve(
          Event::synthesize(device_, IBV_EVENT_DEVICE_FATAL, WholeDevice{})));
    } catch (const std::exception& e) {
      report_verb("Registry::deliver(DEVICE_FATAL)", ENOMEM, e.what());
    }
  }

  Reactor& reactor_;
  ibv_context* const device_;
};

}  // namespace

Handle watch_async_events(const std::shared_ptr<Reactor>& reactor, ibv_context* device) {
  if (device == nullptr) {
    throw std::invalid_argument("Dispatcher::watch_async_events: the device is null");
  }
  std::uint64_t id;
  {
    std::lock_guard<std::mutex> lock(reactor->mutex());
    if (reactor->find_fd_locked(device->async_fd)) {
      throw std::invalid_argument(
          "Dispatcher::watch_async_events: the device is watched already");
    }
    auto source = std::make_shared<AsyncEventSource>(*reactor, device,
                                                     make_nonblocking(device->async_fd));
    reactor->add_locked(source);
    id = source->id();
  }
  return Reactor::handle_for(reactor, id);
}

}  // namespace ibev::detail
