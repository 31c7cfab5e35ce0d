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
// The end of a device. When the kernel removes it (`rdma link delete`, its
// netdev deleted, an unbind; noticed through Dispatcher::Options::
// device_monitor), reports DEVICE_FATAL, or its async fd fails, the Device is
// lost, on the dispatching thread, in this order: it is marked dead (loss()
// says why; making objects on it throws ENODEV), its listeners hear
// DEVICE_FATAL carrying the DeviceLoss, its owner's clients hear remove
// (verbs/device_clients.h), and then ibev close()s it. So the kernel's delete,
// which waits for every process to close the device, completes: listeners
// and clients' remove are where the application stops using the device's
// objects, as an ib_client's remove is in the kernel. Handles stay valid and
// inert; the objects' calls throw ENODEV.
//
// The kernel's cache-before-notify rule (ib_cache_event_task): on a port
// event, cached_port() is refreshed before any listener runs, so a listener
// of PORT_ACTIVE reads the port active.
//
// Thread-safety: all members may be called from any thread. Handlers given to
// on_event() run on the dispatching thread unless given an executor.
//
// Lifetime: the Device (and so whatever holds it: a memory region, a CQ) may
// outlive its Dispatcher. It keeps the Dispatcher's Registry alive (inert
// handles, failures to stderr); dropping or closing it then runs the destroy
// verbs only, and dispatcher() and on_event() throw ENODEV.
#ifndef IBEV_VERBS_DEVICE_H_
#define IBEV_VERBS_DEVICE_H_

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <ibev/core/event_filter.h>
#include <ibev/core/executor.h>
#include <ibev/core/handle.h>
#include <ibev/core/registry.h>
#include <ibev/core/thread_annotations.h>
#include <ibev/dispatch/dispatcher.h>
#include <ibev/verbs/ownership.h>

namespace ibev {

namespace detail {
inline constexpr char kCloseDevice[] = "ibv_close_device";
}  // namespace detail

// What the Device last read of a port: on opening, and on each port event
// before its listeners run.
struct CachedPort {
  ibv_port_attr attributes{};        // state, LID, active MTU, ...
  std::vector<ibv_gid_entry> gids;   // the valid entries of the GID table
};

class Device : public std::enable_shared_from_this<Device> {
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
  // The context, or std::system_error(ENODEV) naming `verb` once lost or
  // closed.
  ibv_context* require_open(const char* verb) const;
  const std::string& name() const noexcept { return name_; }
  // The uverbs node the kernel announces it by ("uverbs0"). A device
  // re-added under the same name is another Device: names are not identity.
  const std::string& node() const noexcept { return node_; }
  // kNone while the device is there; why it is gone after.
  DeviceLoss loss() const noexcept { return loss_.load(); }
  // Throws std::system_error(ENODEV) once the Dispatcher is destroyed.
  Dispatcher& dispatcher() const;
  Registry& registry() const noexcept { return *registry_; }

  // A device-wide listener (ib_register_event_handler): port and device
  // events that `filter` takes. Throws std::system_error(ENODEV) once the
  // Dispatcher is destroyed (nothing would deliver to it) or the device closed.
  Handle on_event(EventFilter filter, Handler handler, Executor executor = {});

  ibv_port_attr query_port(std::uint8_t port) const;
  ibv_gid query_gid(std::uint8_t port, int index) const;
  // Ports count from 1 to port_count(). Throws std::out_of_range.
  CachedPort cached_port(std::uint8_t port) const;
  std::uint8_t port_count() const noexcept;

  // Closes everything made on the device, then the device. Idempotent.
  // Called from inside a handler (inline or on an executor) while another
  // close() is at work, it returns at once and leaves the rest to that one,
  // which may be waiting for this very handler (it waits for the handlers
  // of what it closes).
  void close() noexcept;

  // For the verbs/ wrappers: an object made on this device, for close().
  void track(std::weak_ptr<detail::Closeable> object);

 private:
  friend class DeviceClients;
  struct Token {};

  // Opens the device whose uverbs node is `node`; null when it is not there
  // (any more).
  static std::shared_ptr<Device> open_node(Dispatcher& dispatcher, const std::string& node);
  static std::shared_ptr<Device> open_device(Dispatcher& dispatcher, ibv_device* device);

 public:
  Device(Token, Dispatcher& dispatcher, ibv_context* context);

 private:
  void close_locked() noexcept IBEV_REQUIRES(close_mutex_);
  // Every async event of the device reaches its handlers through here.
  void deliver(Delivery delivery);
  void refresh_port(std::uint8_t port) noexcept;
  // The Dispatcher, or std::system_error(ENODEV) naming `verb` once destroyed.
  std::shared_ptr<Dispatcher> require_dispatcher(const char* verb) const;

  const std::weak_ptr<Dispatcher> dispatcher_;
  const std::shared_ptr<Registry> registry_;  // before context_: outlives it
  detail::Owned<ibv_context, ibv_close_device, detail::kCloseDevice> context_;
  const std::string name_;
  const std::string node_;
  std::atomic<DeviceLoss> loss_{DeviceLoss::kNone};
  mutable detail::Mutex ports_mutex_;
  std::vector<CachedPort> ports_ IBEV_GUARDED_BY(ports_mutex_);  // [0] is port 1
  detail::Mutex close_mutex_ IBEV_ACQUIRED_BEFORE(objects_mutex_);  // one close() at a time
  detail::Mutex objects_mutex_;
  // In creation order.
  std::vector<std::weak_ptr<detail::Closeable>> objects_ IBEV_GUARDED_BY(objects_mutex_);
};

}  // namespace ibev

#endif  // IBEV_VERBS_DEVICE_H_
