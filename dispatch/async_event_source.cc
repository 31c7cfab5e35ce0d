// A device's async events, from the fd being readable to the handlers:
// read (ibv_get_async_event) -> resolve in the Registry -> ack
// (ibv_ack_async_event) -> deliver. Resolving before the ack is the point:
// once acked, the object may be destroyed and its address reused, and the
// event must not reach the newcomer.
//
// The device's end comes here too, whichever way it is noticed: its uverbs
// node removed (device_tracker.cc), its fd failing, or the kernel's own
// DEVICE_FATAL. The source leaves the loop, and the device's listeners hear
// DEVICE_FATAL carrying the DeviceLoss; delivery goes through the watcher's
// AsyncDelivery, where the Device wrapper marks itself dead first and closes
// after (verbs/device.cc).
//
// Locking: none of its own; the reactor's table (reactor.cc) guards its
// joining and leaving, and each read of its fd; its CallGuard a loss noticed
// by the tracker.
#include <sys/epoll.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#include <ibev/dispatch/test_seams.h>

#include "device_tracker.h"
#include "reactor.h"
#include "sources.h"

namespace ibev::detail {
namespace {

class AsyncEventSource final : public Source {
 public:
  AsyncEventSource(Reactor& reactor, ibv_context* device, int original_flags,
                   AsyncDelivery deliver)
      : Source(device->async_fd, original_flags),
        reactor_(reactor),
        device_(device),
        deliver_(std::move(deliver)) {}

  // Set once, right after joining the reactor; dropped with the source.
  void tracked_by(Handle tracked) { tracked_ = std::move(tracked); }

  void serve(std::uint32_t revents) noexcept override {
    IBEV_ASSERT_DISPATCHING(reactor_);
    if ((revents & (EPOLLERR | EPOLLHUP)) != 0) {
      fd_failed((revents & EPOLLERR) ? "EPOLLERR" : "EPOLLHUP", 0);
      return;
    }
    for (unsigned i = 0; i < reactor_.options().batch; ++i) {
      if (test_seams::before_source_read != nullptr) test_seams::before_source_read(fd());
      ibv_async_event raw;
      int error = 0;
      {
        // Released meanwhile, its fd is blocking again: reading would wait
        // for good (the locking paragraph of reactor.cc).
        MutexLock lock(reactor_.mutex());
        if (guard().closed()) return;
        if (ibv_get_async_event(device_, &raw) != 0) error = errno;
      }
      if (error != 0) {
        if (error == EAGAIN || error == EWOULDBLOCK) return;
        if (error == EINTR) continue;
        fd_failed("ibv_get_async_event", error);
        return;
      }
      bump(reactor_.stats().async_events);
      std::optional<Delivery> delivery;
      try {
        delivery.emplace(reactor_.registry().resolve(Event::from_async(device_, raw)));
      } catch (const std::exception& e) {
        report_verb("Registry::resolve", errno_of(e), e.what());
      }
      ibv_ack_async_event(&raw);
      if (delivery) {
        const bool fatal = delivery->event().loss() == DeviceLoss::kFatal;
        if (fatal) reactor_.remove(id());  // the kernel's last word
        deliver(std::move(*delivery));
        if (fatal) return;
      }
      // Released from a handler: the device may be closed already.
      if (guard().closed()) return;
    }
  }

  // The tracker saw the device's uverbs node go: it is being removed.
  void removed() noexcept {
    if (const auto entered = guard().enter()) lose_device(DeviceLoss::kRemoved);
  }

 private:
  void report_verb(const char* verb, int error, std::string what) noexcept {
    Failure failure = Failure::verb_failed(verb, error, std::move(what));
    failure.device = device_;
    reactor_.report(failure);
  }

  // Something the kernel did not mean: a failure, then the loss.
  void fd_failed(const char* how, int error) noexcept {
    Failure failure = Failure::verb_failed(how, error,
                                           "the device's async fd failed; sending "
                                           "DEVICE_FATAL to its listeners");
    failure.kind = Failure::Kind::kDeviceLost;
    failure.device = device_;
    reactor_.report(failure);
    lose_device(DeviceLoss::kAsyncFdFailed);
  }

  // The device is gone: the source leaves the loop (not waited on: the
  // dispatching thread is the one serving it), and the listeners hear
  // DEVICE_FATAL, as they would from the kernel, marked synthesized.
  void lose_device(DeviceLoss loss) noexcept {
    IBEV_ASSERT_DISPATCHING(reactor_);
    reactor_.remove(id());
    bump(reactor_.stats().devices_lost);
    try {
      deliver(reactor_.registry().resolve(Event::device_lost(device_, loss)));
    } catch (const std::exception& e) {
      report_verb("Registry::resolve(DEVICE_FATAL)", errno_of(e), e.what());
    }
  }

  void deliver(Delivery delivery) noexcept {
    if (!deliver_) {
      reactor_.registry().deliver(delivery);
      return;
    }
    reported_call("async delivery", [&] { deliver_(std::move(delivery)); },
                  [this](Failure failure) {
                    failure.device = device_;
                    reactor_.report(failure);
                  });
  }

  Reactor& reactor_;
  ibv_context* const device_;
  const AsyncDelivery deliver_;
  Handle tracked_;
};

}  // namespace

Handle watch_async_events(const std::shared_ptr<Reactor>& reactor, ibv_context* device,
                          AsyncDelivery deliver, DeviceTracker* tracker) {
  if (device == nullptr) {
    throw std::invalid_argument("Dispatcher::watch_async_events: the device is null");
  }
  // Allocated first: the source never joins without the Handle that takes
  // it out.
  auto pending = Reactor::prepare_handle(reactor);
  std::shared_ptr<AsyncEventSource> source;
  {
    MutexLock lock(reactor->mutex());
    if (reactor->find_fd_locked(device->async_fd)) {
      throw std::invalid_argument(
          "Dispatcher::watch_async_events: the device is watched already");
    }
    source = std::make_shared<AsyncEventSource>(
        *reactor, device, make_nonblocking(device->async_fd), std::move(deliver));
    reactor->add_locked(source);
  }
  Handle handle = std::move(pending).joined(source->id());
  if (tracker != nullptr && device->device != nullptr) {
    source->tracked_by(tracker->track(
        device->device->dev_name,
        [weak = std::weak_ptr<AsyncEventSource>(source)] {
          if (auto source = weak.lock()) source->removed();
        }));
  }
  return handle;
}

}  // namespace ibev::detail
