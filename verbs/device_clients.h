// ibev::DeviceClients: the kernel's ib_client in userspace. Every RDMA device
// present, and each that appears later, is opened once on a Dispatcher and
// handed to every registered client's `add`; when a device goes away its
// clients hear `remove`, in reverse registration order, and then the device
// is closed, so that the kernel's delete (which waits for every process to
// close the device) completes.
//
//   ibev::DeviceClients clients(dispatcher);
//   ibev::Handle client = clients.register_client({
//       "transport",
//       [&](const std::shared_ptr<ibev::Device>& device) { /* make PD, CQs, QPs */ },
//       [&](const std::shared_ptr<ibev::Device>& device, ibev::DeviceLoss why) {
//         /* drop (or close()) what add made: the device closes when this returns */
//       }});
//
// Ordering and threads. `add` and `remove` run on the dispatching thread, one
// call at a time: a client registered when devices exist hears `add` for each
// from the next turn, then every device that appears; `remove` only for a
// device it heard `add` for, once. A removed device's listeners hear
// DEVICE_FATAL (verbs/device.h) before any client's remove. When every
// client's remove has returned, the device is close()d: everything made on
// it is destroyed, its handles are inert, and calls on its objects throw
// ENODEV. So, as in the kernel, remove is where a client stops using the
// device's objects (other threads included).
//
// Identity: a device re-added under the same name is a new Device (a new
// ibv_context) and a new `add`; the old Device stays closed.
//
// Lifetime. Unregistering a client (releasing its Handle) follows the rule of
// core/handle.h: from any thread it waits for a call of the client in
// progress; from inside its own add or remove it returns at once. Unlike the
// kernel's ib_unregister_client, it does not call remove: the client's
// objects are its own to drop. Destroying DeviceClients stops adding and
// removing (it waits as a release does) and lets go of its Devices, which
// close when the last holder does. The Dispatcher must outlive it.
// Thread-safety: every member may be called from any thread.
#ifndef IBEV_VERBS_DEVICE_CLIENTS_H_
#define IBEV_VERBS_DEVICE_CLIENTS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ibev/core/event.h>
#include <ibev/core/handle.h>
#include <ibev/dispatch/dispatcher.h>
#include <ibev/verbs/device.h>

namespace ibev {

struct DeviceClient {
  std::string name;  // names it in Failures
  std::function<void(const std::shared_ptr<Device>& device)> add;
  std::function<void(const std::shared_ptr<Device>& device, DeviceLoss loss)> remove;
};

class DeviceClients {
 public:
  // Starts watching devices (Dispatcher::watch_devices). Throws
  // std::invalid_argument when the dispatcher's device monitor is kOff, or
  // std::system_error when it cannot start.
  explicit DeviceClients(Dispatcher& dispatcher);
  ~DeviceClients();
  DeviceClients(const DeviceClients&) = delete;
  DeviceClients& operator=(const DeviceClients&) = delete;

  // ib_register_client. Throws std::invalid_argument when add or remove is
  // empty.
  Handle register_client(DeviceClient client);

  // The devices open now, in the order they were added.
  std::vector<std::shared_ptr<Device>> devices() const;

  struct State;  // device_clients.cc

 private:
  std::shared_ptr<State> state_;
  Handle watching_;
};

}  // namespace ibev

#endif  // IBEV_VERBS_DEVICE_CLIENTS_H_
