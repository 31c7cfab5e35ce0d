// Device clients, top-down: a device appears (Dispatcher::watch_devices says
// kAdded with its uverbs node) -> it is opened, once, and listened to ->
// every client's add. A device goes: its Device is lost (verbs/device.cc)
// and its listeners hear the DEVICE_FATAL carrying the loss, as every
// listener does; DeviceClients' own comes after all of them and after the
// event is counted (Registry::listen_last) ->
// every client that heard add hears remove, newest client first -> the
// Device closes itself when its listeners have run.
//
// Locking: `mutex` guards the list of devices (and their listeners'
// handles), for devices() on any thread; adding and removing happen on the
// dispatching thread only, and no handle is released under `mutex` (a
// release waits for its listener, which takes it). Each client remembers
// which devices it heard add for, touched on the dispatching thread only,
// as the kernel's per-client data on each ib_device.
#include <ibev/verbs/device_clients.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <atomic>
#include <optional>
#include <set>
#include <stdexcept>
#include <system_error>
#include <utility>

#include <ibev/core/subscriber_lists.h>
#include <ibev/core/failure.h>
#include <ibev/core/thread_annotations.h>

namespace ibev {
namespace {

// Held by value: a subscriber's argument is copied into its executor's task.
struct ClientCall {
  bool add;  // else remove
  std::shared_ptr<Device> device;
  DeviceLoss loss;
};

using Client = detail::Subscriber<ClientCall>;

}  // namespace

struct DeviceClients::State : std::enable_shared_from_this<DeviceClients::State> {
  explicit State(Dispatcher& d) : dispatcher(d) {}

  void report(const Failure& failure) const noexcept { dispatcher.registry().report(failure); }

  // kAdded from the device monitor. The kernel announces the uverbs node a
  // moment before rdma-core lists the device (seen on Linux 6.12): a device
  // not listed yet is looked for again, every 20 ms for 2 s, while its
  // node is there.
  void added(const std::string& node, int attempt = 0) {
    IBEV_ASSERT_DISPATCHING(dispatcher);
    if (closed.load()) return;
    {
      detail::MutexLock lock(mutex);
      for (const Open& open : devices) {
        if (open.device->node() == node) return;  // heard twice (replay, rescan)
      }
    }
    std::shared_ptr<Device> device;
    Handle end;
    try {
      device = Device::open_node(dispatcher, node);
      if (device) end = hear_end(*device);
    } catch (const std::system_error& e) {
      Failure failure = Failure::verb_failed("ibv_open_device(" + node + ")", e.code().value(),
                                             std::string("a device that appeared: ") + e.what());
      report(failure);
      return;
    }
    if (!device) {
      look_again(node, attempt);
      return;
    }
    retries.erase(node);
    {
      detail::MutexLock lock(mutex);
      devices.push_back(Open{device, std::move(end)});
    }
    call_clients(detail::Order::kRegistration, ClientCall{true, device, DeviceLoss::kNone});
  }

  void look_again(const std::string& node, int attempt) {
    constexpr int kAttempts = 100;
    const bool still_there =
        ::access(("/sys/class/infiniband_verbs/" + node).c_str(), F_OK) == 0;
    if (still_there && attempt + 1 < kAttempts) {
      retries[node] = dispatcher.call_after(std::chrono::milliseconds(20),
                                            [weak = weak_from_this(), node, attempt] {
                                              if (auto self = weak.lock()) {
                                                self->added(node, attempt + 1);
                                              }
                                            });
      return;
    }
    retries.erase(node);
    if (still_there) {
      report(Failure::verb_failed(
          "ibv_get_device_list", ENODEV,
          node + " appeared, but rdma-core did not list it within 2 s: not opened"));
    }
  }

  // The device's end, as its listeners hear it (the loss a DEVICE_FATAL
  // carries), after every application listener has (Registry::listen_last).
  Handle hear_end(const Device& device) {
    return device.registry().listen_last(
        device.context(), EventFilter{IBV_EVENT_DEVICE_FATAL},
        [weak = weak_from_this(), context = device.context()](const Event& event) {
          if (event.loss() == DeviceLoss::kNone) return;  // an injected one: not an end
          if (auto self = weak.lock()) self->lost(context, event.loss());
        });
  }

  // Every client that heard add hears remove; the Device closes when this
  // returns. The device leaves the list (and this listener's own handle is
  // released, on its own thread: no wait) only after the clients: so a
  // ~DeviceClients that finds it there waits, releasing the handle, until
  // every remove has returned.
  void lost(ibv_context* context, DeviceLoss loss) {
    IBEV_ASSERT_DISPATCHING(dispatcher);
    std::shared_ptr<Device> device;
    {
      detail::MutexLock lock(mutex);
      const auto it = find(context);
      if (it == devices.end()) return;
      device = it->device;
    }
    if (!closed.load()) call_clients(detail::Order::kReverse, ClientCall{false, device, loss});
    Handle end;
    {
      detail::MutexLock lock(mutex);
      const auto it = find(context);
      if (it == devices.end()) return;  // ~DeviceClients took it: it releases it
      end = std::move(it->end);
      devices.erase(it);
    }
    end.release();
  }

  // A client registered now hears add for every device open.
  void catch_up() {
    for (const auto& device : snapshot()) {
      if (closed.load()) return;
      call_clients(detail::Order::kRegistration, ClientCall{true, device, DeviceLoss::kNone});
    }
  }

  void call_clients(detail::Order order, const ClientCall& call) {
    clients.snapshot().deliver(
        call, call.add ? "device client's add" : "device client's remove",
        [this](Failure failure, const ClientCall& call) {
          failure.device = call.device->context();
          report(failure);
        },
        order);
  }

  std::vector<std::shared_ptr<Device>> snapshot() const {
    std::vector<std::shared_ptr<Device>> open;
    detail::MutexLock lock(mutex);
    for (const Open& o : devices) open.push_back(o.device);
    return open;
  }

  struct Open {
    std::shared_ptr<Device> device;
    Handle end;  // its listener of the device's end
  };

  std::vector<Open>::iterator find(ibv_context* context) IBEV_REQUIRES(mutex) {
    return std::find_if(devices.begin(), devices.end(),
                        [&](const Open& open) { return open.device->context() == context; });
  }

  Dispatcher& dispatcher;
  std::atomic<bool> closed{false};
  std::map<std::string, Handle> retries;  // by node; dispatching thread only
  mutable detail::Mutex mutex;
  std::vector<Open> devices IBEV_GUARDED_BY(mutex);  // open, in order of appearance
  detail::BroadcastList<Client> clients;
};

DeviceClients::DeviceClients(Dispatcher& dispatcher)
    : state_(std::make_shared<State>(dispatcher)) {
  watching_ = dispatcher.watch_devices(
      [weak = std::weak_ptr<State>(state_)](DeviceChange change, const std::string& node) {
        // A removal reaches the clients as the device's listeners hear it
        // (hear_end), which the monitor tells before its watchers.
        if (change != DeviceChange::kAdded) return;
        if (auto state = weak.lock()) state->added(node);
      });
}

DeviceClients::~DeviceClients() {
  state_->closed = true;
  watching_.release();
  std::vector<State::Open> open;
  {
    detail::MutexLock lock(state_->mutex);
    open.swap(state_->devices);
  }
  // Each listener released (waiting for it if it runs on the dispatching
  // thread now), then each Device dropped: those nobody else holds close.
  for (State::Open& o : open) o.end.release();
}

Handle DeviceClients::register_client(DeviceClient client) {
  if (!client.add || !client.remove) {
    throw std::invalid_argument("DeviceClients::register_client: add and remove are required" +
                                (client.name.empty() ? std::string() : " (" + client.name + ")"));
  }
  auto heard_add = std::make_shared<std::set<const Device*>>();
  Handle handle = state_->clients.add(std::make_shared<Client>([client = std::move(client),
                                                               heard_add](const ClientCall& call) {
    std::optional<std::string> threw;
    if (call.add) {
      if (heard_add->count(call.device.get()) != 0) return;
      threw = exception_text([&] { client.add(call.device); });
      if (!threw) heard_add->insert(call.device.get());  // a failed add: no remove
    } else if (heard_add->erase(call.device.get()) != 0) {
      threw = exception_text([&] { client.remove(call.device, call.loss); });
    }
    if (threw) throw std::runtime_error(client.name + ": " + *threw);
  }));
  state_->dispatcher.post([weak = std::weak_ptr<State>(state_)] {
    if (auto state = weak.lock()) state->catch_up();
  });
  return handle;
}

std::vector<std::shared_ptr<Device>> DeviceClients::devices() const { return state_->snapshot(); }

}  // namespace ibev
