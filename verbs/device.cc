// Locking: `close_mutex_` makes one close() at a time and is taken first;
// under it, `objects_mutex_` only to swap the list of objects out, never
// across an object's close(). `ports_mutex_` is a leaf (the port cache).
// close() runs each object's close() under `close_mutex_`, and that waits
// for the object's handlers still running on other threads (an executor's).
// So a close() from inside a handler never waits for `close_mutex_`: if
// another close() holds it, that one may be waiting for this very handler,
// and it finishes the job. From the dispatching thread, and from a handler
// inline on it, the objects' releases do not wait for their own thread.
#include <ibev/verbs/device.h>

#include <ibev/core/call_guard.h>
#include <ibev/verbs/test_seams.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <stdexcept>
#include <system_error>
#include <string>
#include <utility>

namespace ibev {

void (*detail::test_seams::device_closing)(ibv_context*) = nullptr;

namespace {

using DeviceList = std::unique_ptr<ibv_device*, void (*)(ibv_device**)>;

// The device list; null with `count` 0 when the kernel has no RDMA subsystem
// (ENOSYS), which means no device rather than an error.
DeviceList device_list(int& count) {
  count = 0;
  DeviceList list(ibv_get_device_list(&count), ibv_free_device_list);
  if (!list && errno != ENOSYS) throw_system_error("ibv_get_device_list", errno);
  return list;
}

// ibv_open_device's errno is not always why: when the uverbs node cannot be
// opened, rdma-core retries through udev's /dev/char links and reports what
// that retry met (ENOENT where there is no udev). Permission is asked of the
// node itself, so that "not allowed" never reads as "not there".
[[noreturn]] void throw_open_error(ibv_device* device, int error) {
  const std::string node = std::string("/dev/infiniband/") + device->dev_name;
  if (::access(node.c_str(), R_OK | W_OK) != 0 && (errno == EACCES || errno == EPERM)) {
    error = errno;
  }
  throw_system_error("ibv_open_device(" + node + ")", error);
}

}  // namespace

std::vector<std::string> Device::names() {
  int count = 0;
  const DeviceList list = device_list(count);
  std::vector<std::string> names;
  for (int i = 0; i < count; ++i) names.emplace_back(ibv_get_device_name(list.get()[i]));
  return names;
}

std::shared_ptr<Device> Device::open(Dispatcher& dispatcher, std::string_view name) {
  int count = 0;
  const DeviceList list = device_list(count);
  for (int i = 0; i < count; ++i) {
    ibv_device* device = list.get()[i];
    if (!name.empty() && name != ibv_get_device_name(device)) continue;
    return open_device(dispatcher, device);
  }
  throw_system_error(name.empty() ? std::string("ibv_get_device_list (no RDMA device)")
                                  : "ibv_open_device (no device named '" + std::string(name) + "')",
                     ENODEV);
}

std::shared_ptr<Device> Device::open_node(Dispatcher& dispatcher, const std::string& node) {
  int count = 0;
  const DeviceList list = device_list(count);
  for (int i = 0; i < count; ++i) {
    ibv_device* device = list.get()[i];
    if (node == device->dev_name) return open_device(dispatcher, device);
  }
  return nullptr;
}

std::shared_ptr<Device> Device::open_device(Dispatcher& dispatcher, ibv_device* device) {
  ibv_context* context = ibv_open_device(device);
  if (context == nullptr) throw_open_error(device, errno);
  return std::make_shared<Device>(Token{}, dispatcher, context);
}

Device::Device(Token, Dispatcher& dispatcher, ibv_context* context)
    : dispatcher_(dispatcher.weak_ref()),
      registry_(dispatcher.shared_registry()),
      context_(context, context, registry_.get()),
      name_(ibv_get_device_name(context->device)),
      node_(context->device->dev_name) {
  try {
    ibv_device_attr attr{};
    if (const int rc = ibv_query_device(context, &attr); rc != 0) {
      throw_system_error("ibv_query_device", rc);
    }
    ports_.resize(attr.phys_port_cnt);
    for (std::uint8_t port = 1; port <= attr.phys_port_cnt; ++port) refresh_port(port);
    context_.serve_with(dispatcher.watch_async_events(
        context, [this](Delivery delivery) { deliver(std::move(delivery)); }));
  } catch (...) {
    context_.close();
    throw;
  }
}

// Nothing made on it is left (each holds the Device); close() also makes
// the Registry forget it.
Device::~Device() { close(); }

// The end of the device and the kernel's cache-before-notify rule, in the
// order the header promises. On the dispatching thread; `this` is alive (the
// Device's destructor waits for this source), but may be on its way out
// (nobody holds it): then it only delivers.
void Device::deliver(Delivery delivery) {
  const Event& event = delivery.event();
  if (const auto port = event.port()) refresh_port(static_cast<std::uint8_t>(*port));
  const DeviceLoss loss = event.loss();
  if (loss == DeviceLoss::kNone) {
    registry().deliver(delivery);
    return;
  }
  // Held: a listener (DeviceClients' own, last) may drop the last other
  // owner, and close() below must still find the Device.
  const std::shared_ptr<Device> self = weak_from_this().lock();
  loss_.store(loss);
  registry().deliver(delivery);
  if (!self) return;
  close();
}

void Device::refresh_port(std::uint8_t port) noexcept {
  ibv_context* context = context_.get();
  const std::uint8_t ports = port_count();
  if (context == nullptr || port < 1 || port > ports) return;
  CachedPort fresh;
  int error = ibv_query_port(context, port, &fresh.attributes);
  if (error == 0 && fresh.attributes.gid_tbl_len > 0) {
    try {
      // rdma-core reads every port's table at once; this port's entries are
      // kept.
      std::vector<ibv_gid_entry> table(static_cast<std::size_t>(fresh.attributes.gid_tbl_len) *
                                       ports);
      const ssize_t n = ibv_query_gid_table(context, table.data(), table.size(), 0);
      if (n < 0) {
        error = static_cast<int>(-n);
      } else {
        for (ssize_t i = 0; i < n; ++i) {
          if (table[static_cast<std::size_t>(i)].port_num == port) {
            fresh.gids.push_back(table[static_cast<std::size_t>(i)]);
          }
        }
      }
    } catch (const std::bad_alloc&) {
      error = ENOMEM;
    }
  }
  if (error != 0) {
    // A device being deleted answers ENODEV before it is lost: its end is
    // on its way, and the cache keeps what it last read.
    if (error != ENODEV) {
      Failure failure = Failure::verb_failed("ibv_query_port/ibv_query_gid_table", error,
                                             "refreshing the cached port " + std::to_string(port));
      failure.device = context;
      registry().report(failure);
    }
    return;
  }
  detail::MutexLock lock(ports_mutex_);
  ports_[port - 1] = std::move(fresh);
}

// The cache's size is set once, in the constructor; read under the lock all
// the same, which costs nothing beside the verbs that follow.
std::uint8_t Device::port_count() const noexcept {
  detail::MutexLock lock(ports_mutex_);
  return static_cast<std::uint8_t>(ports_.size());
}

CachedPort Device::cached_port(std::uint8_t port) const {
  detail::MutexLock lock(ports_mutex_);
  if (port < 1 || port > ports_.size()) {
    throw std::out_of_range("Device::cached_port: " + name_ + " has ports 1.." +
                            std::to_string(ports_.size()) + ", not " + std::to_string(port));
  }
  return ports_[port - 1];
}

// Out of line, as every call that can throw ibev's internal errors: their
// code stays in libibev (verbs/ownership.h).
ibv_context* Device::require_open(const char* verb) const {
  if (const DeviceLoss loss = loss_.load(); loss != DeviceLoss::kNone) {
    throw std::system_error(ENODEV, std::generic_category(),
                            std::string(verb) + ": " + name_ + " is gone (" +
                                std::string(to_string(loss)) + ")");
  }
  return context_.require(verb);
}

void Device::track(std::weak_ptr<detail::Closeable> object) {
  detail::MutexLock lock(objects_mutex_);
  // Forget the objects gone already whenever the list doubles: amortised.
  if (objects_.size() >= 16 && (objects_.size() & (objects_.size() - 1)) == 0) {
    objects_.erase(std::remove_if(objects_.begin(), objects_.end(),
                                  [](const auto& weak) { return weak.expired(); }),
                   objects_.end());
  }
  objects_.push_back(std::move(object));
}

void Device::close() noexcept {
  if (context_.inherited()) {
    // A forked child's copy: its objects and context are the parent's, and
    // locks held by the parent's threads at the fork stay held here.
    context_.close();
    return;
  }
  if (!close_mutex_.try_lock()) {
    // Another close() is at work. From inside a handler, it may be waiting
    // for this very call (an executor's: the handler's object's close waits
    // for it): it closes everything, this returns.
    if (detail::CallGuard::inside_any()) return;
    close_mutex_.lock();
  }
  close_locked();
  close_mutex_.unlock();
}

void Device::close_locked() noexcept {
  if (detail::test_seams::device_closing != nullptr) {
    detail::test_seams::device_closing(context_.get());
  }
  std::vector<std::weak_ptr<detail::Closeable>> objects;
  {
    detail::MutexLock lock(objects_mutex_);
    objects.swap(objects_);
  }
  for (auto it = objects.rbegin(); it != objects.rend(); ++it) {
    if (auto object = it->lock()) object->close();
  }
  // Forgotten while the context is still open: no device opened after can
  // have its address yet.
  if (ibv_context* context = context_.get()) registry().forget(context);
  context_.close();
}

std::shared_ptr<Dispatcher> Device::require_dispatcher(const char* verb) const {
  if (std::shared_ptr<Dispatcher> dispatcher = dispatcher_.lock()) return dispatcher;
  throw std::system_error(ENODEV, std::generic_category(),
                          std::string(verb) + ": " + name_ + "'s Dispatcher was destroyed");
}

Dispatcher& Device::dispatcher() const { return *require_dispatcher("Device::dispatcher"); }

Handle Device::on_event(EventFilter filter, Handler handler, Executor executor) {
  // The Registry outlives the Dispatcher (this Device holds it), but nobody
  // delivers to it any more: a listener added now could never run. Held
  // until the listener is in, so the Dispatcher cannot go in between.
  const std::shared_ptr<Dispatcher> delivering = require_dispatcher("Device::on_event");
  return registry().listen(require_open("Device::on_event"), std::move(filter),
                           std::move(handler), std::move(executor));
}

ibv_port_attr Device::query_port(std::uint8_t port) const {
  ibv_port_attr attr{};
  if (const int rc = ibv_query_port(require_open("ibv_query_port"), port, &attr); rc != 0) {
    throw_system_error("ibv_query_port", rc);
  }
  return attr;
}

ibv_gid Device::query_gid(std::uint8_t port, int index) const {
  ibv_gid gid{};
  if (ibv_query_gid(require_open("ibv_query_gid"), port, index, &gid) != 0) {
    throw_system_error("ibv_query_gid", errno);
  }
  return gid;
}

}  // namespace ibev
