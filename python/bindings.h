// The native half of the Python module `ibev` in rooms (python/ibev/__init__.py
// adds asyncio on top), one module, _ibev, defined in ibev_python.cc:
//   - this header: what every room shares: the GIL's helpers (Kept,
//     Callable, without_gil), events as Python keeps them, durations, and
//     each room's bind_*();
//   - objects.h: the Python objects the rooms share (Dispatcher, Handle,
//     Device and the other wrappers of what C++ shares);
//   - bind_dispatcher.cc: Event, Handle, Dispatcher;
//   - bind_verbs.cc: Device, DeviceClients, ProtectionDomain, MemoryRegion,
//     CompletionQueue, SharedReceiveQueue, QueuePair and their values;
//   - bind_waiting.cc: wait_for, EventWait, WaitResult;
//   - bind_health.cc: ConnectionHealth, HealthOptions, HealthChange,
//     HealthCause, RecoveryAttempt;
//   - bind_cm.cc: CmEventChannel, CmId, CmEvent, CmSession, CmAcceptor and
//     the RDMA_CM_EVENT_* codes.
// WorkerThread is the dispatching room's; write_metrics and Replay the verbs
// room's.
// Private to the module.
//
// The GIL, which every wrapper here is shaped by:
// - Handlers run on the dispatching thread (the Dispatcher's own, or the
//   caller of run_once()) and take the GIL for their call. What a Python
//   handler raises becomes the C++ exception ibev turns into a failure
//   record (kHandlerThrew, with the Python exception's type and text).
// - Every call that may wait for a handler (stop, run_once, a release, a
//   close, a drain, a blocking wait, an object's destruction) lets go of the
//   GIL first: the handler it waits for may be waiting for the GIL.
// - A Python callable kept by C++ is dropped with the GIL taken, on
//   whichever thread C++ drops it (Callable).
// Lifetime follows C++: a Device keeps its Dispatcher's registry alive, a
// QueuePair its CQs and PD; close() ends an object at once, and its calls
// then raise OSError(ENODEV). A closed Dispatcher raises ValueError.
#ifndef IBEV_PYTHON_BINDINGS_H_
#define IBEV_PYTHON_BINDINGS_H_

// Python.h (through pybind11) comes before any standard header.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ibev/core/event.h>
#include <ibev/core/event_filter.h>
#include <ibev/core/registry.h>

namespace py = pybind11;

namespace ibev::python {

// Whether a thread other than Python's may take the GIL now: not during the
// interpreter's finalization, when CPython ends a thread that asks for it.
inline bool python_is_running() { return Py_IsInitialized() && !_Py_IsFinalizing(); }

// Before taking the GIL to call Python from C++: a call that cannot be made
// is an exception (ibev makes it a failure record), not a thread ended.
inline void require_python_running() {
  if (!python_is_running()) {
    throw std::runtime_error("not called: the Python interpreter is finalizing");
  }
}

// What Python raised, as the C++ exception ibev records ("Type: message");
// the Python error is dropped by the caller's handler, under the GIL.
inline std::runtime_error described(py::error_already_set& raised) {
  return std::runtime_error(py::str(raised.type().attr("__name__")).cast<std::string>() + ": " +
                            py::str(raised.value()).cast<std::string>());
}

// A Python object held by C++ (in a std::function that C++ copies and
// destroys on any thread, with or without the GIL): read under the GIL,
// dropped with the GIL taken.
class Kept {
 public:
  explicit Kept(py::object object) : held_(std::make_shared<Held>(std::move(object))) {}
  // Under the GIL only.
  const py::object& get() const { return held_->object; }

 private:
  struct Held {
    explicit Held(py::object o) : object(std::move(o)) {}
    ~Held() {
      if (!python_is_running()) {
        // Taking the GIL now would end this thread (CPython does that to
        // threads that ask for it during finalization): leak it instead.
        object.release();
        return;
      }
      py::gil_scoped_acquire gil;
      object = py::object();
    }
    py::object object;
  };
  std::shared_ptr<Held> held_;
};

// A Python callable held by C++: called with the GIL taken, and what it
// raises turned into a C++ exception (ibev makes it a failure record).
// Made under the GIL from what Python passed as `what`: TypeError unless it
// is callable.
class Callable {
 public:
  Callable(py::object function, const std::string& what) : function_(std::move(function)) {
    if (!PyCallable_Check(function_.get().ptr())) throw py::type_error(what + " must be callable");
  }

  template <typename... Args>
  void operator()(Args&&... args) const {
    require_python_running();
    py::gil_scoped_acquire gil;
    try {
      function_.get()(std::forward<Args>(args)...);
    } catch (py::error_already_set& raised) {
      throw described(raised);
    }
  }

 private:
  Kept function_;
};

// An event as Python keeps it: the value, with the names of what it is
// about taken when the handler was given (the device's name; a QP's number).
// Nothing is read through the event's pointers at delivery: a device
// listener's or a wait's object may be destroyed between the ack and the
// delivery.
struct PyEvent {
  Event event;
  std::string device;
  std::optional<std::uint32_t> qp_num;  // a QP event's, for a handler of that QP
};

// What a handler or wait is about, named while it is alive.
struct About {
  std::string device;
  std::optional<std::uint32_t> qp_num;
  // A QP's own handler: its QP outlives every call (closing it waits for
  // the handler), so the number is read from the event.
  bool own_qp = false;
};

inline PyEvent to_python(const Event& event, const About& about) {
  std::optional<std::uint32_t> qp_num;
  if (event.qp() != nullptr) qp_num = about.own_qp ? event.qp()->qp_num : about.qp_num;
  if (auto number = event.object_number(); number && number->kind == ElementKind::kQp) {
    qp_num = number->number;
  }
  return PyEvent{event, about.device, qp_num};
}

inline Handler event_handler(const py::object& handler, About about) {
  if (handler.is_none()) return {};
  Callable call(handler, "a handler");
  return [call, about = std::move(about)](const Event& event) { call(to_python(event, about)); };
}

inline EventFilter event_filter(const std::optional<std::vector<int>>& types,
                                std::optional<int> port) {
  EventFilter filter;
  if (types) filter = EventFilter::of_codes(types->data(), types->size());
  if (port) filter.on_port(*port);
  return filter;
}

// What the GIL must not be held for: a call that may wait for a handler.
template <typename Call>
auto without_gil(Call&& call) {
  py::gil_scoped_release nogil;
  return call();
}

// A blocking wait that Ctrl-C interrupts, as time.sleep() is: waits without
// the GIL in slices of at most kSignalSlice, running Python's signal handlers
// between them (PyErr_CheckSignals, a no-op off the main thread), so that
// SIGINT's KeyboardInterrupt (or what any Python handler raises) leaves as
// py::error_already_set within a slice. `wait_until(end)` blocks until
// `end` at most and says whether the wait is over; returns false once
// `deadline` passed without that. Under the GIL; the GIL is let go for each
// slice (a handler it waits for may need it).
inline constexpr std::chrono::milliseconds kSignalSlice{50};

template <typename WaitUntil>
bool wait_interruptibly(std::chrono::steady_clock::time_point deadline, WaitUntil&& wait_until) {
  for (;;) {
    const auto end = std::min(deadline, std::chrono::steady_clock::now() + kSignalSlice);
    if (without_gil([&] { return wait_until(end); })) return true;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (std::chrono::steady_clock::now() >= deadline) return false;
  }
}

// A duration given in seconds: finite and not negative, rounded up to
// whole milliseconds (0.0001 s is 1 ms, not 0).
inline std::chrono::milliseconds seconds(double value, const char* what = "timeout") {
  if (!std::isfinite(value) || value < 0 || value > 1e9) {
    throw py::value_error(std::string(what) +
                          " must be a finite number of seconds, at least 0, "
                          "not " +
                          py::str(py::float_(value)).cast<std::string>());
  }
  return std::chrono::milliseconds(static_cast<long>(std::ceil(value * 1000)));
}

// The rooms, each registering its classes and functions on the module, in
// this order (a signature names a class registered before it).
void bind_dispatcher(py::module_& m);  // bind_dispatcher.cc
void bind_verbs(py::module_& m);       // bind_verbs.cc
void bind_waiting(py::module_& m);     // bind_waiting.cc
void bind_health(py::module_& m);      // bind_health.cc
void bind_cm(py::module_& m);          // bind_cm.cc

}  // namespace ibev::python

#endif  // IBEV_PYTHON_BINDINGS_H_
