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
      .def_property_readonly("code", [](const PyEvent& e) { return e.event.code(); })
      .def_property_readonly("name", [](const PyEvent& e) { return std::string(e.event.name()); })
      .def_property_readonly("type_name",
                             [](const PyEvent& e) -> std::optional<std::string> {
                               if (!e.event.known()) return std::nullopt;
                               return std::string(e.event.info()->enumerator);
                             })
      .def_property_readonly(
          "element_kind",
          [](const PyEvent& e) { return std::string(to_string(e.event.element_kind())); })
      .def_property_readonly(
          "severity", [](const PyEvent& e) { return std::string(to_string(e.event.severity())); })
      .def_property_readonly("port", [](const PyEvent& e) { return e.event.port(); })
      .def_property_readonly("qp_num", [](const PyEvent& e) { return e.qp_num; })
      .def_property_readonly("device", [](const PyEvent& e) { return e.device; })
      .def_property_readonly("synthesized", [](const PyEvent& e) { return e.event.synthesized(); })
      .def_property_readonly("loss",
                             [](const PyEvent& e) -> std::optional<std::string> {
                               if (e.event.loss() == DeviceLoss::kNone) return std::nullopt;
                               return std::string(to_string(e.event.loss()));
                             })
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
      .def("release", &PyHandle::release)
      .def_property_readonly("active", &PyHandle::active)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyHandle& h, py::args) { h.release(); });

  py::class_<PyDispatcher>(m, "Dispatcher",
                           "One epoll loop serving every device, CQ and fd; handlers run on "
                           "its thread (start()) or in run_once() (asyncio: ibev.drive).")
      .def(py::init<py::object, double, unsigned>(), "on_failure"_a = py::none(),
           "stall_after"_a = 1.0, "batch"_a = 16)
      .def("start",
           [](PyDispatcher& d) {
             InUse dispatcher = d.use();
             without_gil([&] { (*dispatcher).start(); });
           })
      .def("stop",
           [](PyDispatcher& d) {
             InUse dispatcher = d.use();
             without_gil([&] { (*dispatcher).stop(); });
           })
      .def("close", &PyDispatcher::close)
      .def_property_readonly("closed", &PyDispatcher::closed)
      .def("fd", [](const PyDispatcher& d) { return (*d.use()).fd(); })
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
          "timeout"_a = 0.0)
      .def_property_readonly("running", [](const PyDispatcher& d) { return (*d.use()).running(); })
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
          "srq"_a = nullptr)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyDispatcher& d, py::args) { d.close(); });

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
          "__enter__", [](py::object self) { return self; }, "Returns itself.")
      .def(
          "__exit__", [](PyWorkerThread& w, py::args) { w.close(); }, "close().");
}

}  // namespace ibev::python
