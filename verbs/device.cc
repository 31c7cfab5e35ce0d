#include <ibev/verbs/device.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <utility>

namespace ibev {
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
    const std::string device_name = ibv_get_device_name(device);
    if (!name.empty() && name != device_name) continue;
    ibv_context* context = ibv_open_device(device);
    if (context == nullptr) throw_open_error(device, errno);
    return std::make_shared<Device>(Token{}, dispatcher, context, device_name);
  }
  throw_system_error(name.empty() ? "ibv_get_device_list (no RDMA device)"
                                  : "ibv_open_device (no such device)",
                     ENODEV);
}

Device::Device(Token, Dispatcher& dispatcher, ibv_context* context, std::string name)
    : dispatcher_(dispatcher),
      context_(context, context, &dispatcher.registry()),
      name_(std::move(name)) {
  try {
    context_.serve_with(dispatcher.watch_async_events(context));
  } catch (...) {
    context_.close();
    throw;
  }
}

Device::~Device() = default;

// Out of line, as every call that can throw ibev's internal errors: their
// code stays in libibev (verbs/ownership.h).
ibv_context* Device::require_open(const char* verb) const { return context_.require(verb); }

void Device::track(std::weak_ptr<detail::Closeable> object) {
  std::lock_guard<std::mutex> lock(objects_mutex_);
  // Forget the objects gone already whenever the list doubles: amortised.
  if (objects_.size() >= 16 && (objects_.size() & (objects_.size() - 1)) == 0) {
    objects_.erase(std::remove_if(objects_.begin(), objects_.end(),
                                  [](const auto& weak) { return weak.expired(); }),
                   objects_.end());
  }
  objects_.push_back(std::move(object));
}

void Device::close() noexcept {
  std::lock_guard<std::mutex> closing(close_mutex_);
  std::vector<std::weak_ptr<detail::Closeable>> objects;
  {
    std::lock_guard<std::mutex> lock(objects_mutex_);
    objects.swap(objects_);
  }
  for (auto it = objects.rbegin(); it != objects.rend(); ++it) {
    if (auto object = it->lock()) object->close();
  }
  context_.close();
}

Handle Device::on_event(EventFilter filter, Handler handler, Executor executor) {
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
