// ibev::Device: an open RDMA device (ibv_context) whose async events a
// Dispatcher reads and a Registry routes.
//
// Made by Device::open() and held by shared_ptr: every object made on the
// device (protection domains, CQs, ...) keeps it alive, so handles can be
// dropped in any order. Destruction stops the watch of its async fd (waiting
// for the dispatcher to finish with it, unless on the dispatcher thread) and
// then closes the context.
//
// Thread-safety: all members may be called from any thread. Handlers given to
// on_event() run on the dispatching thread. The Dispatcher and the Registry
// must outlive the Device.
#ifndef IBEV_VERBS_DEVICE_H_
#define IBEV_VERBS_DEVICE_H_

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <ibev/core/event_filter.h>
#include <ibev/core/registry.h>
#include <ibev/dispatch/dispatcher.h>
#include <ibev/dispatch/watch.h>
#include <ibev/verbs/ownership.h>

namespace ibev {

namespace detail {
inline constexpr char kCloseDevice[] = "ibv_close_device";
}  // namespace detail

class Device {
 public:
  // Opens the device called `name`, or the first one when `name` is empty,
  // and has `dispatcher` watch its async events. Throws std::system_error
  // (ENODEV when there is no such device, EACCES when this process may not
  // open its /dev/infiniband/uverbsN node, or the failing verb's errno).
  static std::shared_ptr<Device> open(Dispatcher& dispatcher, Registry& registry,
                                      std::string_view name = {});

  // The names of the RDMA devices present; empty when the kernel has no RDMA
  // subsystem. Throws std::system_error when the list cannot be read.
  static std::vector<std::string> names();

  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  ibv_context* context() const noexcept { return context_.get(); }
  const std::string& name() const noexcept { return name_; }
  Dispatcher& dispatcher() const noexcept { return dispatcher_; }
  Registry& registry() const noexcept { return registry_; }

  // A device-wide listener (ib_register_event_handler): port and device
  // events that `filter` takes.
  [[nodiscard]] Attachment on_event(EventFilter filter, Handler handler);

  ibv_port_attr query_port(std::uint8_t port) const;
  ibv_gid query_gid(std::uint8_t port, int index) const;

 private:
  struct Token {};

 public:
  Device(Token, Dispatcher& dispatcher, Registry& registry, ibv_context* context,
         std::string name);

 private:
  Dispatcher& dispatcher_;
  Registry& registry_;
  detail::Owned<ibv_context, ibv_close_device, detail::kCloseDevice> context_;
  std::string name_;
  Watch watch_;  // after context_: stops before the context closes
};

}  // namespace ibev

#endif  // IBEV_VERBS_DEVICE_H_
