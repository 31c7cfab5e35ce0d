// ibev::Device: an open RDMA device (ibv_context) whose async events a
// Dispatcher serves and routes through its Registry.
//
// Made by Device::open() and held by shared_ptr: every object made on the
// device (protection domains, CQs, ...) keeps it alive, so handles can be
// dropped in any order. Destruction, or close(), stops serving its async fd
// (waiting for the dispatcher to finish with it, unless on the dispatching
// thread) and then closes the context.
//
// close() tears down everything made on the device first, newest first (QPs
// before their CQs and SRQ, memory regions before their domain): each
// object's close() (verbs/ownership.h). That is what an application does
// after DEVICE_FATAL, from the handler if it likes, without hunting every
// shared_ptr; the objects stay valid C++ objects whose get() is null, and
// calls that need the rdma-core object throw std::system_error(ENODEV). Other
// threads must have stopped using the objects (posting, polling) first.
//
// Thread-safety: all members may be called from any thread. Handlers given to
// on_event() run on the dispatching thread unless given an executor. The
// Dispatcher must outlive the Device (see dispatch/dispatcher.h).
#ifndef IBEV_VERBS_DEVICE_H_
#define IBEV_VERBS_DEVICE_H_

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <ibev/core/event_filter.h>
#include <ibev/core/executor.h>
#include <ibev/core/handle.h>
#include <ibev/core/registry.h>
#include <ibev/dispatch/dispatcher.h>
#include <ibev/verbs/ownership.h>

namespace ibev {

namespace detail {
inline constexpr char kCloseDevice[] = "ibv_close_device";
}  // namespace detail

class Device {
 public:
  // Opens the device called `name`, or the first one when `name` is empty,
  // and has `dispatcher` serve its async events. Throws std::system_error
  // (ENODEV when there is no such device, EACCES when this process may not
  // open its /dev/infiniband/uverbsN node, or the failing verb's errno).
  static std::shared_ptr<Device> open(Dispatcher& dispatcher, std::string_view name = {});

  // The names of the RDMA devices present; empty when the kernel has no RDMA
  // subsystem. Throws std::system_error when the list cannot be read.
  static std::vector<std::string> names();

  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  // Null once closed.
  ibv_context* context() const noexcept { return context_.get(); }
  // The context, or std::system_error(ENODEV) naming `verb` once closed.
  ibv_context* require_open(const char* verb) const;
  const std::string& name() const noexcept { return name_; }
  Dispatcher& dispatcher() const noexcept { return dispatcher_; }
  Registry& registry() const noexcept { return dispatcher_.registry(); }

  // A device-wide listener (ib_register_event_handler): port and device
  // events that `filter` takes.
  Handle on_event(EventFilter filter, Handler handler, Executor executor = {});

  ibv_port_attr query_port(std::uint8_t port) const;
  ibv_gid query_gid(std::uint8_t port, int index) const;

  // Closes everything made on the device, then the device. Idempotent.
  void close() noexcept;

  // For the verbs/ wrappers: an object made on this device, for close().
  void track(std::weak_ptr<detail::Closeable> object);

 private:
  struct Token {};

 public:
  Device(Token, Dispatcher& dispatcher, ibv_context* context, std::string name);

 private:
  Dispatcher& dispatcher_;
  detail::Owned<ibv_context, ibv_close_device, detail::kCloseDevice> context_;
  std::string name_;
  std::mutex close_mutex_;  // one close() at a time
  std::mutex objects_mutex_;
  std::vector<std::weak_ptr<detail::Closeable>> objects_;  // in creation order
};

}  // namespace ibev

#endif  // IBEV_VERBS_DEVICE_H_
