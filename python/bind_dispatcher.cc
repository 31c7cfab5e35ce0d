// The module's dispatching room (python/bindings.h lists the rooms): Event,
// Handle, Dispatcher and WorkerThread.
#include "objects.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <optional>
#include <string>

#include <ibev/core/event.h>
#include <ibev/core/event_type.h>
#include <ibev/dispatch/dispatcher.h>

using namespace pybind11::literals;

namespace ibev::python {

void bind_dispatcher(py::module_& m) {
  py::class_<PyEvent>(m, "Event", "One async event; a value, valid after its handler returned.")
      .def_property_readonly(
          "code", [](const PyEvent& e) { return e.event.code(); },
          "The ibv_event_type (ibev.IBV_EVENT_*), or a code this build does not know.")
      .def_property_readonly(
          "name", [](const PyEvent& e) { return std::string(e.event.name()); },
          "rdma-core's name of the event ('port error'), or the code's number.")
      .def_property_readonly("type_name",
                             [](const PyEvent& e) -> std::optional<std::string> {
                               if (!e.event.known()) return std::nullopt;
                               return std::string(e.event.info()->enumerator);
                             },
                             "The enumerator ('IBV_EVENT_PORT_ERR'); None for an unknown code.")
      .def_property_readonly(
          "element_kind",
          [](const PyEvent& e) { return std::string(to_string(e.event.element_kind())); },
          "What it is about: 'device', 'port', 'qp', 'cq', 'srq' or 'wq'.")
      .def_property_readonly(
          "severity", [](const PyEvent& e) { return std::string(to_string(e.event.severity())); },
          "'fatal', 'error', 'informational' or 'unknown', as the kernel means the code.")
      .def_property_readonly(
          "port", [](const PyEvent& e) { return e.event.port(); },
          "A port event's port number; None for other events.")
      .def_property_readonly(
          "qp_num", [](const PyEvent& e) { return e.qp_num; },
          "A QP event's QP number, when known; else None.")
      .def_property_readonly(
          "device", [](const PyEvent& e) { return e.device; },
          "The name of the device it came from ('rxe0').")
      .def_property_readonly(
          "synthesized", [](const PyEvent& e) { return e.event.synthesized(); },
          "Made by ibev (Dispatcher.inject, a device's loss), not read from rdma-core.")
      .def_property_readonly("loss",
                             [](const PyEvent& e) -> std::optional<std::string> {
                               if (e.event.loss() == DeviceLoss::kNone) return std::nullopt;
                               return std::string(to_string(e.event.loss()));
                             },
                             "For an event telling a device's loss, how it went ('removed', "
                             "'fatal', 'async fd failed'); else None.")
      .def("__repr__", [](const PyEvent& e) {
        std::string text = "<ibev.Event " + std::string(e.event.name());
        if (auto port = e.event.port()) text += " port " + std::to_string(*port);
        if (e.qp_num) text += " qp " + std::to_string(*e.qp_num);
        return text + " on " + (e.device.empty() ? "?" : e.device) + ">";
      });

  py::class_<PyHandle>(m, "Handle",
                       "A registration (a listener, a client, a callback wait): release() ends "
                       "it, and returns once its function is not running (at once from inside "
                       "it).")
      .def("release", &PyHandle::release,
           "Ends the registration; returns once its function is not running (waiting without "
           "the GIL; at once from inside it). Again: nothing.")
      .def_property_readonly("active", &PyHandle::active, "Whether it is not released yet.")
      .def(
          "__enter__", [](py::object self) { return self; }, "Returns itself.")
      .def(
          "__exit__", [](PyHandle& h, py::args) { h.release(); }, "release().");

  py::class_<PyDispatcher>(m, "Dispatcher",
                           "One epoll loop serving every device, CQ and fd; handlers run on "
                           "its thread (start()) or in run_once() (asyncio: ibev.drive).")
      .def(py::init<py::object, double, unsigned>(), "on_failure"_a = py::none(),
           "stall_after"_a = 1.0, "batch"_a = 16,
           "on_failure(kind, description) hears every failure record (None: one line on "
           "stderr), on the thread that reports; stall_after (seconds; 0: no watchdog) reports "
           "a handler that runs longer; batch: events read per turn. ValueError for a batch of "
           "0 or a bad duration.")
      .def("start",
           [](PyDispatcher& d) {
             InUse dispatcher = d.use();
             without_gil([&] { (*dispatcher).start(); });
           },
           "Starts the dispatching thread, which runs every handler from now on. RuntimeError "
           "if started already; ValueError once closed.")
      .def("stop",
           [](PyDispatcher& d) {
             InUse dispatcher = d.use();
             without_gil([&] { (*dispatcher).stop(); });
           },
           "Stops the dispatching thread, waiting (without the GIL) for the handler running.")
      .def("close", &PyDispatcher::close,
           "Ends the device clients, stops dispatching and closes the loop (waiting without "
           "the GIL); its objects then raise. Again: nothing.")
      .def_property_readonly("closed", &PyDispatcher::closed, "Whether close() was called.")
      .def(
          "fd", [](const PyDispatcher& d) { return (*d.use()).fd(); },
          "The epoll fd, readable when run_once() has work (asyncio: ibev.drive).")
      .def(
          "run_once",
          [](PyDispatcher& d, double timeout) {
            using std::chrono::steady_clock;
            const auto deadline = steady_clock::now() + seconds(timeout);
            InUse dispatcher = d.use();
            // In slices, for Ctrl-C: a turn that handled something ends it.
            std::size_t handled = 0;
            wait_interruptibly(deadline, [&](steady_clock::time_point end) {
              const auto left = std::chrono::ceil<std::chrono::milliseconds>(
                  std::max(end - steady_clock::now(), steady_clock::duration::zero()));
              handled = (*dispatcher).run_once(left);
              return handled > 0;
            });
            return handled;
          },
          "timeout"_a = 0.0,
          "Runs one turn on this thread (handlers run here), waiting up to timeout seconds for "
          "something; returns how many were handled. Ctrl-C interrupts the wait "
          "(KeyboardInterrupt). RuntimeError while started or inside another run_once().")
      .def_property_readonly(
          "running", [](const PyDispatcher& d) { return (*d.use()).running(); },
          "Whether its own thread dispatches (start()).")
      .def(
          "inject",
          [](PyDispatcher& d, const PyDevice& device, int code, std::optional<int> port,
             const PyQueuePair* qp, const PyCompletionQueue* cq, const PySharedReceiveQueue* srq) {
            const int given = (port ? 1 : 0) + (qp ? 1 : 0) + (cq ? 1 : 0) + (srq ? 1 : 0);
            if (given > 1) throw py::value_error("inject names one element: port, qp, cq or srq");
            Element element = WholeDevice{};
            if (port) element = Port{*port};
            if (qp) element = open_object(*qp, "Dispatcher.inject: the QueuePair");
            if (cq) element = open_object(*cq, "Dispatcher.inject: the CompletionQueue");
            if (srq) element = open_object(*srq, "Dispatcher.inject: the SharedReceiveQueue");
            ibv_context* context = (*device).require_open("Dispatcher.inject");
            if (!port && !qp && !cq && !srq && find_event_type(code) == nullptr) {
              element = OpaqueElement{0};
            }
            InUse dispatcher = d.use();
            require_served_by(*dispatcher, (*device).registry(), "Dispatcher.inject");
            (*dispatcher).inject(context, code, element);
          },
          "device"_a, "code"_a, "port"_a = py::none(), "qp"_a = nullptr, "cq"_a = nullptr,
          "srq"_a = nullptr,
          "Delivers a synthesized event of device (about port, qp, cq or srq: one at most) to "
          "its handlers, on the dispatching thread, as if rdma-core had reported it. ValueError "
          "(two elements, a code that does not fit the element, another Dispatcher's device), "
          "OSError(ENODEV) for a closed object.")
      .def(
          "__enter__", [](py::object self) { return self; }, "Returns itself.")
      .def(
          "__exit__", [](PyDispatcher& d, py::args) { d.close(); }, "close().");

  py::class_<PyWorkerThread>(
      m, "WorkerThread",
      "A thread of its own for handlers that block (the kernel's IB_POLL_WORKQUEUE): given as "
      "HealthOptions(executor=...), the handler runs there, in order, with the GIL taken, and "
      "the dispatching thread keeps serving. What a task raises goes to on_failure(kind, "
      "description) (None: stderr) and the thread goes on. Keep it open while what uses it "
      "lives: a closed one drops their calls.")
      .def(py::init<py::object>(), "on_failure"_a = py::none())
      .def("close", &PyWorkerThread::close,
           "Runs the tasks already posted, then ends the thread (without the GIL). RuntimeError "
           "from a task on that thread. Again: nothing.")
      .def_property_readonly("closed", &PyWorkerThread::closed, "Whether close() ended it.")
      .def(
          "post",
          [](const PyWorkerThread& w, py::object function) {
            Callable call(std::move(function), "a task");
            if (w.closed()) throw py::value_error("WorkerThread.post: the WorkerThread is closed");
            w.executor()([call] { call(); });
          },
          "function"_a,
          "Runs function() on the thread, after the tasks posted before, with the GIL taken; "
          "what it raises goes to on_failure. TypeError unless callable; ValueError once "
          "closed.")
      .def(
          "__enter__", [](py::object self) { return self; }, "Returns itself.")
      .def(
          "__exit__", [](PyWorkerThread& w, py::args) { w.close(); }, "close().");
}

}  // namespace ibev::python
