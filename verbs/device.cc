#include <ibev/verbs/device.h>

#include <unistd.h>

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
  if (!list && errno != ENOSYS) detail::throw_verb_error("ibv_get_device_list", errno);
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
  const std::string verb = "ibv_open_device(" + node + ")";
  detail::throw_verb_error(verb.c_str(), error);
}

}  // namespace

std::vector<std::string> Device::names() {
  int count = 0;
  const DeviceList list = device_list(count);
  std::vector<std::string> names;
  for (int i = 0; i < count; ++i) names.emplace_back(ibv_get_device_name(list.get()[i]));
  return names;
}

std::shared_ptr<Device> Device::open(Dispatcher& dispatcher, Registry& registry,
                                     std::string_view name) {
  int count = 0;
  const DeviceList list = device_list(count);
  for (int i = 0; i < count; ++i) {
    ibv_device* device = list.get()[i];
    const std::string device_name = ibv_get_device_name(device);
    if (!name.empty() && name != device_name) continue;
    ibv_context* context = ibv_open_device(device);
    if (context == nullptr) throw_open_error(device, errno);
    return std::make_shared<Device>(Token{}, dispatcher, registry, context,
                                    device_name);
  }
  detail::throw_verb_error(name.empty() ? "ibv_get_device_list (no RDMA device)"
                                        : "ibv_open_device (no such device)",
                           ENODEV);
}

Device::Device(Token, Dispatcher& dispatcher, Registry& registry,
               ibv_context* context, std::string name)
    : dispatcher_(dispatcher),
      registry_(registry),
      context_(context),
      name_(std::move(name)),
      watch_(dispatcher.watch(context)) {}

Device::~Device() = default;

Attachment Device::on_event(EventFilter filter, Handler handler) {
  return registry_.listen(context(), std::move(handler), filter);
}

ibv_port_attr Device::query_port(std::uint8_t port) const {
  ibv_port_attr attr{};
  if (const int rc = ibv_query_port(context(), port, &attr); rc != 0) {
    detail::throw_verb_error("ibv_query_port", rc);
  }
  return attr;
}

ibv_gid Device::query_gid(std::uint8_t port, int index) const {
  ibv_gid gid{};
  if (ibv_query_gid(context(), port, index, &gid) != 0) {
    detail::throw_verb_error("ibv_query_gid", errno);
  }
  return gid;
}

}  // namespace ibev
