// The module's verbs room (python/bindings.h lists the rooms): Device and
// DeviceClients, and what is made on a device: ProtectionDomain,
// MemoryRegion, CompletionQueue (with WorkCompletion), SharedReceiveQueue,
// QueuePair (with RcEndpoint and DrainReport); write_metrics and Replay.
#include "objects.h"

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ibev/core/failure.h>
#include <ibev/verbs/completion_queue.h>
#include <ibev/verbs/device.h>
#include <ibev/verbs/device_clients.h>
#include <ibev/dispatch/replay.h>
#include <ibev/formats/recording.h>
#include <ibev/verbs/prometheus_counters.h>
#include <ibev/verbs/protection_domain.h>
#include <ibev/verbs/queue_pair.h>
#include <ibev/verbs/rc_endpoint.h>
#include <ibev/verbs/shared_receive_queue.h>

using namespace pybind11::literals;

namespace ibev::python {
namespace {

class PyDeviceClients {
 public:
  PyDeviceClients(std::shared_ptr<ClientsSlot> slot, py::object dispatcher)
      : dispatcher(std::move(dispatcher)), slot_(std::move(slot)) {}
  ~PyDeviceClients() { close(); }
  // Registers under the slot's lock: a close() on another thread waits.
  Handle register_client(DeviceClient client) const {
    std::lock_guard<std::mutex> lock(slot_->mutex);
    if (!slot_->clients) throw py::value_error("the DeviceClients are closed");
    return slot_->clients->register_client(std::move(client));
  }
  void close() {
    without_gil([&] { slot_->end(); });
  }
  py::object dispatcher;

 private:
  std::shared_ptr<ClientsSlot> slot_;
};

// One receive work request for [offset, offset + length) of a region, for
// a QP's receive queue or an SRQ.
struct Receive {
  Receive(const PyMemoryRegion& mr, std::size_t offset, std::size_t length, std::uint64_t wr_id)
      : sge(mr.sge(offset, length)) {
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
  }
  Receive(const Receive&) = delete;
  Receive& operator=(const Receive&) = delete;
  ibv_sge sge;
  ibv_recv_wr wr{};
};

// A Replay whose play() Python can interrupt: it plays on a thread of its
// own while the caller waits in slices (Ctrl-C stops the replay, then
// raises). The devices are the Python ones given, by name.
class PyReplay {
 public:
  PyReplay(PyDispatcher& dispatcher, const std::vector<PyDevice*>& devices, double speed,
           py::object on_change)
      : dispatcher_(dispatcher.use()) {
    for (const PyDevice* device : devices) {
      if (device == nullptr) throw py::type_error("Replay: devices are Devices");
      devices_.push_back(device->ref());
    }
    Replay::Options options;
    options.speed = speed;
    options.device = [devices = devices_](const std::string& recorded) -> ibv_context* {
      for (const auto& device : devices) {
        if (device->name() == recorded) return device->context();
      }
      return nullptr;
    };
    if (!on_change.is_none()) {
      Callable call(std::move(on_change), "on_change");
      options.change = [call](const RecordedChange& change) {
        call(change.device, change.added ? std::string("added") : std::string("removed"));
      };
    }
    replay_ = std::make_shared<Replay>(*dispatcher_, std::move(options));
  }
  ReplayStats play(const std::string& text, const std::string& name) {
    std::istringstream in(text);
    auto lines = std::make_shared<std::vector<RecordedLine>>(read_recording(in, name));
    struct Played {
      std::mutex mutex;
      std::condition_variable ended;
      bool done = false;
      ReplayStats stats;
      std::exception_ptr thrown;
    };
    auto played = std::make_shared<Played>();
    std::thread player([replay = replay_, lines, played] {
      ReplayStats stats;
      std::exception_ptr thrown;
      try {
        stats = replay->play(*lines);
      } catch (...) {
        thrown = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(played->mutex);
      played->stats = stats;
      played->thrown = thrown;
      played->done = true;
      played->ended.notify_all();
    });
    try {
      wait_interruptibly(std::chrono::steady_clock::time_point::max(),
                         [&](std::chrono::steady_clock::time_point end) {
                           std::unique_lock<std::mutex> lock(played->mutex);
                           return played->ended.wait_until(lock, end,
                                                           [&] { return played->done; });
                         });
    } catch (...) {  // interrupted: the play stops at once
      replay_->stop();
      without_gil([&] { player.join(); });
      throw;
    }
    without_gil([&] { player.join(); });
    if (played->thrown) std::rethrow_exception(played->thrown);
    return played->stats;
  }
  void stop() { replay_->stop(); }

 private:
  InUse dispatcher_;  // the Replay refers to it
  std::vector<std::shared_ptr<Device>> devices_;
  std::shared_ptr<Replay> replay_;
};

}  // namespace

void bind_verbs(py::module_& m) {
  py::class_<PyDevice>(m, "Device",
                       "An open RDMA device, its async events served by a Dispatcher: "
                       "listeners run on the dispatching thread. A removed device is lost: "
                       "its objects then raise OSError(ENODEV).")
      .def_static(
          "open",
          [](py::object dispatcher, const std::string& name) {
            InUse d = dispatcher_of(dispatcher, "Device.open").use();
            auto device = without_gil([&] { return Device::open(*d, name); });
            return std::make_unique<PyDevice>(std::move(device), std::move(dispatcher));
          },
          "dispatcher"_a, "name"_a = "",
          "Opens the device name (empty: the first) on dispatcher. OSError naming the device "
          "(ENODEV: not there) or the failing verb; ValueError for a closed Dispatcher.")
      .def_static("names", &Device::names, "The names of the RDMA devices present.")
      .def_property_readonly(
          "name", [](const PyDevice& d) { return (*d).name(); }, "The device's name ('rxe0').")
      .def_property_readonly(
          "node", [](const PyDevice& d) { return (*d).node(); },
          "Its node in /sys/class/infiniband (a new one when a device is re-added).")
      .def_property_readonly(
          "dispatcher", [](const PyDevice& d) { return d.dispatcher; },
          "The Dispatcher it was opened on.")
      .def_property_readonly(
          "closed", [](const PyDevice& d) { return (*d).context() == nullptr; },
          "Whether it was closed or lost.")
      .def_property_readonly("loss",
                             [](const PyDevice& d) -> std::optional<std::string> {
                               if ((*d).loss() == DeviceLoss::kNone) return std::nullopt;
                               return std::string(to_string((*d).loss()));
                             },
                             "How it was lost ('removed', 'fatal', 'async fd failed'); None.")
      .def_property_readonly(
          "port_count", [](const PyDevice& d) { return (*d).port_count(); },
          "How many ports it has.")
      .def(
          "port_state",
          [](const PyDevice& d, int port) {
            if (port < 1 || port > (*d).port_count()) {
              throw py::index_error("port " + std::to_string(port) + " of " +
                                    std::to_string((*d).port_count()));
            }
            return std::string(ibv_port_state_str(
                (*d).cached_port(static_cast<std::uint8_t>(port)).attributes.state));
          },
          "port"_a = 1,
          "The port's state as last cached ('active', 'down'; ibv_port_state_str's words), "
          "refreshed before listeners hear a port event. IndexError for no such port.")
      .def(
          "listen",
          [](PyDevice& d, py::object handler, std::optional<std::vector<int>> types,
             std::optional<int> port) {
            Handler call = event_handler(handler, About{(*d).name(), std::nullopt, false});
            if (!call) throw py::type_error("listen needs a handler");
            return std::make_unique<PyHandle>(
                (*d).on_event(event_filter(types, port), std::move(call)));
          },
          "handler"_a, "types"_a = py::none(), "port"_a = py::none(),
          "handler(Event) hears the device's events of types (codes; None: all) on port (None: "
          "any), on the dispatching thread, until the Handle returned is released. TypeError "
          "without a callable handler; ValueError for a bad code.")
      .def("close", &PyDevice::close,
           "Closes the device (waiting without the GIL for its handlers); its objects then "
           "raise OSError(ENODEV).");

  py::class_<PyDeviceClients>(m, "DeviceClients",
                              "The kernel's ib_client: add(device) for every device present and "
                              "added later, remove(device, loss) when one goes, on the "
                              "dispatching thread. Ends when closed, or with its Dispatcher.")
      .def(py::init([](py::object dispatcher) {
             auto slot = dispatcher_of(dispatcher, "DeviceClients").add_clients();
             return std::make_unique<PyDeviceClients>(std::move(slot), std::move(dispatcher));
           }),
           "dispatcher"_a)
      .def(
          "register",
          [](PyDeviceClients& clients, const std::string& name, py::object add, py::object remove) {
            Callable on_add(std::move(add), "a client's add");
            Callable on_remove(std::move(remove), "a client's remove");
            // The Device each call is handed remembers the Dispatcher.
            Kept dispatcher(clients.dispatcher);
            DeviceClient client{
                name,
                [on_add, dispatcher](const std::shared_ptr<Device>& device) {
                  py::gil_scoped_acquire gil;
                  on_add(std::make_unique<PyDevice>(device, dispatcher.get()));
                },
                [on_remove, dispatcher](const std::shared_ptr<Device>& device, DeviceLoss loss) {
                  py::gil_scoped_acquire gil;
                  on_remove(std::make_unique<PyDevice>(device, dispatcher.get()),
                            std::string(to_string(loss)));
                }};
            return std::make_unique<PyHandle>(clients.register_client(std::move(client)));
          },
          "name"_a, "add"_a, "remove"_a,
          "A client: add(Device) for every device present and added later, remove(Device, "
          "loss) when one goes, on the dispatching thread, until the Handle is released. "
          "TypeError for a callback that is not callable; ValueError once closed.")
      .def("close", &PyDeviceClients::close,
           "Ends every client (waiting without the GIL for a callback running).");

  py::class_<PyProtectionDomain>(m, "ProtectionDomain",
                                 "A protection domain on a device (ibv_alloc_pd): "
                                 "ProtectionDomain(device). OSError naming the verb, ENODEV "
                                 "for a closed device.")
      .def(py::init([](const PyDevice& device) {
             return std::make_unique<PyProtectionDomain>(ProtectionDomain::create(device.ref()));
           }),
           "device"_a, py::keep_alive<1, 2>(), "ibv_alloc_pd on device.")
      .def("close", &PyProtectionDomain::close, "ibv_dealloc_pd; its calls then raise ENODEV.");

  py::class_<PyMemoryRegion>(m, "MemoryRegion",
                             "A registered Python buffer (bytearray, memoryview, ...), kept "
                             "exported while registered.")
      .def(py::init([](const PyProtectionDomain& pd, py::object buffer, int access) {
             const bool device_writes =
                 (access & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                            IBV_ACCESS_REMOTE_ATOMIC)) != 0;
             auto view = std::make_unique<BufferView>(buffer, device_writes);
             auto mr = MemoryRegion::create(pd.ref(), view->data(), view->size(), access);
             return std::make_unique<PyMemoryRegion>(std::move(mr), std::move(view));
           }),
           "pd"_a, "buffer"_a, "access"_a = static_cast<int>(IBV_ACCESS_LOCAL_WRITE),
           py::keep_alive<1, 2>())
      .def_property_readonly(
          "lkey", [](const PyMemoryRegion& mr) { return (*mr).lkey(); }, "The local key.")
      .def("close", &PyMemoryRegion::close,
           "Deregisters the region, then lets the buffer go.");

  py::class_<WorkCompletion>(m, "WorkCompletion", "One completion (ibv_wc), a value.")
      .def_readonly("wr_id", &WorkCompletion::wr_id, "The work request's id.")
      .def_readonly("status", &WorkCompletion::status, "Its ibv_wc_status (IBV_WC_SUCCESS).")
      .def_readonly("opcode", &WorkCompletion::opcode, "Its ibv_wc_opcode (IBV_WC_SEND, ...).")
      .def_readonly("byte_len", &WorkCompletion::byte_len, "Bytes received.")
      .def_readonly("qp_num", &WorkCompletion::qp_num, "The QP it completed on.")
      .def_property_readonly(
          "status_name",
          [](const WorkCompletion& wc) {
            return std::string(ibv_wc_status_str(static_cast<ibv_wc_status>(wc.status)));
          },
          "ibv_wc_status_str of the status.");

  py::class_<PyCompletionQueue>(m, "CompletionQueue",
                                "A CQ whose completions reach on_completion(list of "
                                "WorkCompletion) and CQ_ERR on_event(event), on the "
                                "dispatching thread.")
      .def(
          py::init([](const PyDevice& device, py::object on_completion, py::object on_event,
                      int cqe) {
            Callable completions(std::move(on_completion), "on_completion");
            CompletionHandler handler = [completions](const CompletionBatch& batch) {
              py::gil_scoped_acquire gil;
              py::list list;
              for (const ibv_wc& wc : batch) {
                list.append(WorkCompletion{wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.qp_num});
              }
              completions(std::move(list));
            };
            CompletionQueue::Options options;
            options.cqe = cqe;
            Handler events = event_handler(on_event, About{(*device).name(), std::nullopt, false});
            return std::make_unique<PyCompletionQueue>(without_gil([&] {
              return CompletionQueue::create(device.ref(), std::move(handler), std::move(events),
                                             options);
            }));
          }),
          "device"_a, "on_completion"_a, "on_event"_a = py::none(), "cqe"_a = 64,
          py::keep_alive<1, 2>())
      .def("close", &PyCompletionQueue::close,
           "Destroys the CQ (waiting without the GIL for its handlers); close its QPs first.");

  py::class_<PySharedReceiveQueue>(m, "SharedReceiveQueue",
                                   "An SRQ whose SRQ_ERR and SRQ_LIMIT_REACHED reach on_event.")
      .def(py::init([](const PyProtectionDomain& pd, py::object on_event, std::uint32_t max_wr) {
             SharedReceiveQueue::Options options;
             options.max_wr = max_wr;
             return std::make_unique<PySharedReceiveQueue>(SharedReceiveQueue::create(
                 pd.ref(),
                 event_handler(on_event, About{(*pd).device()->name(), std::nullopt, false}),
                 options));
           }),
           "pd"_a, "on_event"_a = py::none(), "max_wr"_a = 64, py::keep_alive<1, 2>())
      .def(
          "arm_limit",
          [](PySharedReceiveQueue& srq, std::uint32_t limit) { (*srq).arm_limit(limit); },
          "limit"_a,
          "Arms SRQ_LIMIT_REACHED for when fewer than limit receives are posted (once). OSError "
          "naming ibv_modify_srq and its errno.")
      .def(
          "post_recv",
          [](PySharedReceiveQueue& srq, const PyMemoryRegion& mr, std::size_t offset,
             std::size_t length, std::uint64_t wr_id) {
            Receive receive(mr, offset, length, wr_id);
            ibv_recv_wr* bad = nullptr;
            ibv_srq* raw = open_object(srq, "ibv_post_srq_recv: the SharedReceiveQueue");
            if (int rc = ibv_post_srq_recv(raw, &receive.wr, &bad); rc != 0) {
              throw_system_error("ibv_post_srq_recv", rc);
            }
          },
          "mr"_a, "offset"_a, "length"_a, "wr_id"_a = 0,
          "Posts a receive of [offset, offset + length) of mr. ValueError outside the region; "
          "OSError naming ibv_post_srq_recv and its errno (ENODEV once closed).")
      .def("close", &PySharedReceiveQueue::close, "Destroys the SRQ.");

  py::class_<RcEndpoint>(m, "RcEndpoint", "What an RC peer needs, in ibv_rc_pingpong's wire form.")
      .def_property_readonly("qp_num", &RcEndpoint::qp_num, "The QP's number.")
      .def_property_readonly("psn", &RcEndpoint::psn, "The first PSN it sends with.")
      .def(
          "to_wire",
          [](const RcEndpoint& e) {
            const auto wire = e.to_wire();
            return py::bytes(wire.data(), wire.size());
          },
          "The 52 bytes ibv_rc_pingpong sends.")
      .def_static(
          "from_wire",
          [](py::bytes wire) { return RcEndpoint::from_wire(static_cast<std::string>(wire)); },
          "Parses to_wire()'s form; ValueError naming what is wrong.");

  py::class_<DrainReport>(m, "DrainReport", "What QueuePair.drain() drained.")
      .def_readonly("send_drained", &DrainReport::send_drained,
                    "Every send posted before has completed.")
      .def_readonly("receive_drained", &DrainReport::receive_drained,
                    "Every receive posted before has completed.")
      .def_readonly("last_wqe_reached", &DrainReport::last_wqe_reached,
                    "On an SRQ: LAST_WQE_REACHED was heard.");

  py::class_<PyQueuePair>(m, "QueuePair",
                          "An RC QP (by default) whose async events reach on_event on the "
                          "dispatching thread.")
      .def(py::init([](const PyProtectionDomain& pd, const PyCompletionQueue& send_cq,
                       const PyCompletionQueue& recv_cq, py::object on_event,
                       const PySharedReceiveQueue* srq, std::uint32_t max_send_wr,
                       std::uint32_t max_recv_wr) {
             QueuePair::Options options;
             options.send_cq = send_cq.ref();
             options.recv_cq = recv_cq.ref();
             if (srq != nullptr) options.srq = srq->ref();
             options.cap.max_send_wr = max_send_wr;
             options.cap.max_recv_wr = max_recv_wr;
             return std::make_unique<PyQueuePair>(QueuePair::create(
                 pd.ref(),
                 event_handler(on_event, About{(*pd).device()->name(), std::nullopt, true}),
                 options));
           }),
           "pd"_a, "send_cq"_a, "recv_cq"_a, "on_event"_a = py::none(), "srq"_a = nullptr,
           "max_send_wr"_a = 16, "max_recv_wr"_a = 16, py::keep_alive<1, 2>())
      .def_property_readonly(
          "qp_num", [](const PyQueuePair& qp) { return (*qp).qp_num(); }, "The QP's number.")
      .def(
          "endpoint",
          [](const PyQueuePair& qp, int port, int gid_index) {
            if (port < 1 || port > 255) throw py::value_error("port " + std::to_string(port));
            return (*qp).endpoint(static_cast<std::uint8_t>(port), gid_index);
          },
          "port"_a = 1, "gid_index"_a = 0,
          "This QP's RcEndpoint on port with the GID at gid_index: what the peer needs.")
      .def(
          "connect", [](PyQueuePair& qp, const RcEndpoint& remote) { (*qp).connect(remote); },
          "remote"_a,
          "RESET -> INIT -> RTR -> RTS against the peer's RcEndpoint. OSError naming "
          "ibv_modify_qp and its errno.")
      .def(
          "post_send",
          [](PyQueuePair& qp, const PyMemoryRegion& mr, std::size_t offset, std::size_t length,
             std::uint64_t wr_id, bool signaled) {
            post_send_of(mr, offset, length, wr_id, signaled,
                         [&](ibv_send_wr& wr) { (*qp).post_send(wr); });
          },
          "mr"_a, "offset"_a, "length"_a, "wr_id"_a = 0, "signaled"_a = true,
          "Posts a SEND of [offset, offset + length) of mr. ValueError outside the region; "
          "OSError naming ibv_post_send and its errno (ENODEV once closed).")
      .def(
          "post_recv",
          [](PyQueuePair& qp, const PyMemoryRegion& mr, std::size_t offset, std::size_t length,
             std::uint64_t wr_id) {
            Receive receive(mr, offset, length, wr_id);
            (*qp).post_recv(receive.wr);
          },
          "mr"_a, "offset"_a, "length"_a, "wr_id"_a = 0,
          "Posts a receive of [offset, offset + length) of mr. ValueError outside the region; "
          "OSError naming ibv_post_recv and its errno.")
      .def(
          "drain",
          [](PyQueuePair& qp, double timeout) {
            DrainOptions options;
            options.timeout = seconds(timeout);
            return without_gil([&] { return (*qp).drain(options); });
          },
          "timeout"_a = 5.0,
          "Moves the QP to ERR and waits (without the GIL, up to timeout seconds) until every "
          "request posted before has completed and the CQ's handler has had it; returns a "
          "DrainReport. Not on the dispatching thread (RuntimeError). A timeout of 0 (or below) "
          "is a ValueError.")
      .def("close", &PyQueuePair::close,
           "Destroys the QP (waiting without the GIL for its handler).");

  m.def(
      "connect_rc_pair", [](PyQueuePair& a, PyQueuePair& b) { connect_rc_pair(*a, *b); }, "a"_a,
      "b"_a, "Connects two RC QPs of one device to each other (loopback).");

  py::class_<ReplayStats>(m, "ReplayStats", "What Replay.play() did.")
      .def_readonly("injected", &ReplayStats::injected, "Events handed to inject().")
      .def_readonly("skipped", &ReplayStats::skipped, "Events with no live device or element.")
      .def_readonly("changes", &ReplayStats::changes, "Device changes handed to on_change.")
      .def_readonly("stopped", &ReplayStats::stopped, "Whether stop() ended it.");

  py::class_<PyReplay>(
      m, "Replay",
      "Plays a recording (what `ibev-watch --json` writes) into a Dispatcher through inject(), "
      "so that handlers hear what a real fabric did (dispatch/replay.h): a recorded device's "
      "events go to the Device of that name among devices (none: skipped and counted), a "
      "device added or removed to on_change(device, 'added' or 'removed'), on the thread "
      "that plays. Events are injected at their recorded distance divided by speed (0: back "
      "to back), and are synthesized. ValueError for a speed outside 1e-6 to 1e6 (or 0). "
      "It holds its Dispatcher's C++ side until it is dropped: after a Dispatcher.close(), "
      "play() still injects into it, and it goes with the "
      "Replay.")
      .def(py::init<PyDispatcher&, const std::vector<PyDevice*>&, double, py::object>(),
           "dispatcher"_a, "devices"_a = std::vector<PyDevice*>{}, "speed"_a = 1.0,
           "on_change"_a = py::none())
      .def("play", &PyReplay::play, "recording"_a, "name"_a = "recording",
           "Plays recording (the text of a .jsonl) and returns its ReplayStats once the last "
           "event is injected (delivery follows on the dispatching thread). Blocks, without the "
           "GIL; Ctrl-C stops it (KeyboardInterrupt), as stop() does: later plays return at once. "
           "ValueError naming name and the line for "
           "a recording that is not one, or an event inject() refuses.")
      .def("stop", &PyReplay::stop,
           "Ends a play() in progress at once, and every later one; any thread.");

  m.def(
      "write_metrics",
      [](const PyDispatcher& dispatcher, const std::vector<PyDevice*>& devices) {
        std::vector<std::shared_ptr<Device>> refs;
        for (const PyDevice* device : devices) {
          if (device == nullptr) throw py::type_error("write_metrics: devices are Devices");
          refs.push_back(device->ref());
        }
        InUse d = dispatcher.use();
        std::ostringstream text;
        write_metrics(text, *d, refs);
        return text.str();
      },
      "dispatcher"_a, "devices"_a = std::vector<PyDevice*>{},
      "ibev's counters in the Prometheus text format, as a str: the Dispatcher's figures and "
      "each device's events, failures and ports (docs/operations.md lists the names). Any "
      "thread, the dispatching one too: it never waits for a handler. A closed device is left "
      "out; ValueError for a closed Dispatcher.");

}

}  // namespace ibev::python
