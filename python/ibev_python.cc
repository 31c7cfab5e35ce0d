// ibev._ibev: the native half of the Python module `ibev` (pybind11 over the
// C++ API; python/ibev/__init__.py adds asyncio on top).
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
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <ibev/core/event.h>
#include <ibev/core/event_filter.h>
#include <ibev/core/event_type.h>
#include <ibev/core/failure.h>
#include <ibev/core/handle.h>
#include <ibev/dispatch/dispatcher.h>
#include <ibev/dispatch/event_wait.h>
#include <ibev/verbs/completion_queue.h>
#include <ibev/verbs/device.h>
#include <ibev/verbs/device_clients.h>
#include <ibev/verbs/protection_domain.h>
#include <ibev/verbs/queue_pair.h>
#include <ibev/verbs/rc_endpoint.h>
#include <ibev/verbs/shared_receive_queue.h>
#include <ibev/version.h>

namespace py = pybind11;
using namespace pybind11::literals;

namespace ibev::python {
namespace {

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
      if (!Py_IsInitialized() || _Py_IsFinalizing()) {
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
    if (!Py_IsInitialized() || _Py_IsFinalizing()) {
      throw std::runtime_error("not called: the Python interpreter is finalizing");
    }
    py::gil_scoped_acquire gil;
    try {
      function_.get()(std::forward<Args>(args)...);
    } catch (py::error_already_set& raised) {
      // The text, then the Python error is dropped here, under the GIL.
      throw std::runtime_error(py::str(raised.type().attr("__name__")).cast<std::string>() + ": " +
                               py::str(raised.value()).cast<std::string>());
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

PyEvent to_python(const Event& event, const About& about) {
  std::optional<std::uint32_t> qp_num;
  if (event.qp() != nullptr) qp_num = about.own_qp ? event.qp()->qp_num : about.qp_num;
  if (auto number = event.object_number(); number && number->kind == ElementKind::kQp) {
    qp_num = number->number;
  }
  return PyEvent{event, about.device, qp_num};
}

Handler event_handler(const py::object& handler, About about) {
  if (handler.is_none()) return {};
  Callable call(handler, "a handler");
  return [call, about = std::move(about)](const Event& event) { call(to_python(event, about)); };
}

EventFilter event_filter(const std::optional<std::vector<int>>& types, std::optional<int> port) {
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

// A duration given in seconds: finite and not negative, rounded up to
// whole milliseconds (0.0001 s is 1 ms, not 0).
std::chrono::milliseconds seconds(double value, const char* what = "timeout") {
  if (!std::isfinite(value) || value < 0 || value > 1e9) {
    throw py::value_error(std::string(what) +
                          " must be a finite number of seconds, at least 0, "
                          "not " +
                          py::str(py::float_(value)).cast<std::string>());
  }
  return std::chrono::milliseconds(static_cast<long>(std::ceil(value * 1000)));
}

// ------------------------------------------------------------ the objects

// Device clients must go before their Dispatcher (C++'s rule); Python may
// drop them in any order, so the Dispatcher ends them first when it closes.
struct ClientsSlot {
  std::mutex mutex;
  std::unique_ptr<DeviceClients> clients;  // null once ended
  void end() {
    std::unique_ptr<DeviceClients> ending;
    {
      std::lock_guard<std::mutex> lock(mutex);
      ending = std::move(clients);
    }
    ending.reset();
  }
};

// A reference to the C++ Dispatcher for one call that lets go of the GIL:
// another Python thread's close() then cannot destroy it mid-call, and if
// that close() came first, the last reference goes here, without the GIL.
class InUse {
 public:
  explicit InUse(std::shared_ptr<Dispatcher> dispatcher) : dispatcher_(std::move(dispatcher)) {}
  ~InUse() {
    without_gil([&] { dispatcher_.reset(); });
  }
  Dispatcher& operator*() const { return *dispatcher_; }

 private:
  std::shared_ptr<Dispatcher> dispatcher_;
};

class PyDispatcher {
 public:
  PyDispatcher(py::object on_failure, double stall_after, unsigned batch) {
    Dispatcher::Options options;
    options.batch = batch;
    options.stall_after = seconds(stall_after, "stall_after");
    if (!on_failure.is_none()) {
      Callable sink(std::move(on_failure), "on_failure");
      options.on_failure = [sink](const Failure& failure) {
        try {
          sink(std::string(to_string(failure.kind)), describe(failure));
        } catch (const std::exception& e) {
          // A sink that raises: what ibev does with a C++ sink that throws.
          send_to({}, Failure::handler_threw("on_failure", e.what()));
        }
      };
    }
    dispatcher_ = std::make_shared<Dispatcher>(std::move(options));
  }
  ~PyDispatcher() { close(); }

  // Under the GIL: the Dispatcher for a call, or ValueError once closed.
  InUse use() const {
    if (!dispatcher_) throw py::value_error("the Dispatcher is closed");
    return InUse(dispatcher_);
  }
  bool closed() const { return !dispatcher_; }

  std::shared_ptr<ClientsSlot> add_clients() {
    auto slot = std::make_shared<ClientsSlot>();
    {
      InUse dispatcher = use();
      auto clients = without_gil([&] { return std::make_unique<DeviceClients>(*dispatcher); });
      if (closed()) {  // closed meanwhile: the clients must not outlive it
        without_gil([&] { clients.reset(); });
        throw py::value_error("the Dispatcher is closed");
      }
      slot->clients = std::move(clients);
    }
    // Slots whose clients were closed are dropped as new ones come.
    clients_.erase(std::remove_if(clients_.begin(), clients_.end(),
                                  [](const auto& s) { return s.use_count() == 1; }),
                   clients_.end());
    clients_.push_back(slot);
    return slot;
  }
  void close() {
    std::vector<std::shared_ptr<ClientsSlot>> clients = std::move(clients_);
    std::shared_ptr<Dispatcher> ending = std::move(dispatcher_);
    without_gil([&] {
      for (const auto& slot : clients) slot->end();
      ending.reset();  // the last reference, unless a call on another thread still runs
    });
  }

 private:
  std::shared_ptr<Dispatcher> dispatcher_;
  std::vector<std::shared_ptr<ClientsSlot>> clients_;  // touched under the GIL
};

// A Dispatcher argument kept as the Python object (a Device remembers it):
// checked here, as pybind11 checks a typed one, with a TypeError.
PyDispatcher& dispatcher_of(const py::object& dispatcher, const char* who) {
  if (!py::isinstance<PyDispatcher>(dispatcher)) {
    throw py::type_error(std::string(who) + " needs a Dispatcher, not " +
                         py::str(py::type::of(dispatcher).attr("__name__")).cast<std::string>());
  }
  return dispatcher.cast<PyDispatcher&>();
}

class PyHandle {
 public:
  explicit PyHandle(Handle handle) : handle_(std::move(handle)) {}
  ~PyHandle() { release(); }
  void release() {
    Handle ending = std::move(handle_);
    without_gil([&] { ending.release(); });
  }
  bool active() const { return handle_.active(); }

 private:
  Handle handle_;
};

// One reference to a C++ object that may wait for handlers when it goes:
// dropped (and closed) without the GIL.
template <typename T>
class Shared {
 public:
  explicit Shared(std::shared_ptr<T> ref) : ref_(std::move(ref)) {}
  virtual ~Shared() {
    std::shared_ptr<T> ending = std::move(ref_);
    without_gil([&] { ending.reset(); });
  }
  T& operator*() const { return *ref_; }
  const std::shared_ptr<T>& ref() const { return ref_; }
  void close() {
    without_gil([&] { ref_->close(); });
  }

 private:
  std::shared_ptr<T> ref_;
};

// A Device remembers the Python Dispatcher it was opened on, for the waits
// made on it (Device.next_event).
struct PyDevice : Shared<Device> {
  PyDevice(std::shared_ptr<Device> device, py::object dispatcher)
      : Shared(std::move(device)), dispatcher(std::move(dispatcher)) {}
  py::object dispatcher;
};
using PyProtectionDomain = Shared<ProtectionDomain>;
using PyCompletionQueue = Shared<CompletionQueue>;
using PySharedReceiveQueue = Shared<SharedReceiveQueue>;
using PyQueuePair = Shared<QueuePair>;

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

// A Python buffer exported for as long as a region registers it (a
// bytearray cannot be resized under it): one C-contiguous block, writable
// when the region's access lets the device write (a strided view would
// register memory outside the view). Released under the GIL.
class BufferView {
 public:
  BufferView(const py::object& buffer, bool writable) {
    if (PyObject_GetBuffer(buffer.ptr(), &view_,
                           PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) != 0) {
      throw py::error_already_set();  // BufferError or TypeError, with Python's words
    }
  }
  ~BufferView() { PyBuffer_Release(&view_); }
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;
  void* data() const { return view_.buf; }
  std::size_t size() const { return static_cast<std::size_t>(view_.len); }

 private:
  Py_buffer view_{};
};

class PyMemoryRegion : public Shared<MemoryRegion> {
 public:
  PyMemoryRegion(std::shared_ptr<MemoryRegion> mr, std::unique_ptr<BufferView> view)
      : Shared(std::move(mr)), view_(std::move(view)) {}
  ~PyMemoryRegion() override {
    // The region first (Shared's destructor runs after this one: close it
    // here, so the view is released only once nothing reads the memory).
    close();
  }
  // The SGE for [offset, offset + length) of the region.
  ibv_sge sge(std::size_t offset, std::size_t length) const {
    const ibv_mr* mr = (**this).get();
    if (mr == nullptr) throw_system_error("MemoryRegion (closed)", ENODEV);
    if (offset > mr->length || length > mr->length - offset) {
      throw py::value_error("[" + std::to_string(offset) + ", " + std::to_string(offset + length) +
                            ") is outside the region's " + std::to_string(mr->length) + " bytes");
    }
    return ibv_sge{reinterpret_cast<std::uintptr_t>(mr->addr) + offset,
                   static_cast<std::uint32_t>(length), mr->lkey};
  }

 private:
  std::unique_ptr<BufferView> view_;
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

// A wait's end as Python reads it, converted when it ends (its event's
// device may be closed right after).
struct PyWaitResult {
  std::string outcome;  // "event", "timed out", "device lost"
  std::optional<PyEvent> event;
};

PyWaitResult to_python(const WaitResult& result, const About& about) {
  return {std::string(to_string(result.outcome)),
          result.event ? std::optional<PyEvent>(to_python(*result.event, about)) : std::nullopt};
}

// The rdma-core object of a Python wrapper, or OSError(ENODEV) once closed.
template <typename T>
auto* open_object(const Shared<T>& object, const std::string& what) {
  auto* raw = (*object).get();
  if (raw == nullptr) throw_system_error(what + " is closed", ENODEV);
  return raw;
}

// An object of another Dispatcher's device would never hear what this one
// sends or serves: refused.
void require_served_by(Dispatcher& dispatcher, const Registry& registry, const char* who) {
  if (&dispatcher.registry() != &registry) {
    throw py::value_error(std::string(who) + ": its device was opened on another Dispatcher");
  }
}

// What a wait targets, from the Python object given, and its names.
struct Target {
  WaitTarget target;
  About about;
  const Registry* registry;  // where its events are routed
};

template <typename T>
const Device& device_of(const T& object) {
  if constexpr (std::is_same_v<T, SharedReceiveQueue>) {
    return *object.pd()->device();
  } else {
    return *object.device();
  }
}

template <typename T>
Target object_target(const Shared<T>& object, const char* kind) {
  auto* raw = open_object(object, std::string("wait_for: the ") + kind);
  const Device& device = device_of(*object);
  About about{device.name(), std::nullopt, false};
  if constexpr (std::is_same_v<T, QueuePair>) about.qp_num = raw->qp_num;
  return Target{raw, about, &device.registry()};
}

// The blocking wait, on the callback form: wait() blocks without the GIL
// until the callback, or its own deadline if nobody dispatches; the first
// outcome is the one every wait() returns.
class PyEventWait {
 public:
  PyEventWait(Dispatcher& dispatcher, Target target, EventFilter filter,
              std::chrono::milliseconds timeout)
      : dispatcher_(dispatcher.weak_ref()),
        deadline_(std::chrono::steady_clock::now() + timeout),
        state_(std::make_shared<State>()) {
    handle_ = ibev::wait_for(dispatcher, target.target, std::move(filter), timeout,
                             [state = state_, about = target.about](const WaitResult& result) {
                               state->decide(to_python(result, about));
                             });
  }
  ~PyEventWait() { cancel(); }

  PyWaitResult wait() {
    if (cancelled_) throw py::value_error("the wait was cancelled");
    if (auto d = dispatcher_.lock(); d && d->in_dispatcher_thread()) {
      throw py::value_error(
          "EventWait.wait() on the dispatching thread, which delivers what it "
          "waits for, would never return; use wait_for(..., done=...)");
    }
    PyWaitResult result = without_gil([&] {
      std::unique_lock<std::mutex> lock(state_->mutex);
      state_->ended.wait_until(lock, deadline_, [&] { return state_->result.has_value(); });
      lock.unlock();
      state_->decide(PyWaitResult{"timed out", std::nullopt});  // if nothing came first
      lock.lock();
      return *state_->result;
    });
    release();  // decided: nothing more is heard
    return result;
  }
  void cancel() {
    cancelled_ = true;
    release();
  }

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable ended;
    std::optional<PyWaitResult> result;
    void decide(PyWaitResult outcome) {
      std::lock_guard<std::mutex> lock(mutex);
      if (result) return;
      result = std::move(outcome);
      ended.notify_all();
    }
  };
  void release() {
    Handle ending = std::move(handle_);
    without_gil([&] { ending.release(); });
  }

  std::weak_ptr<Dispatcher> dispatcher_;
  std::chrono::steady_clock::time_point deadline_;
  std::shared_ptr<State> state_;
  Handle handle_;
  bool cancelled_ = false;  // under the GIL
};

struct WorkCompletion {
  std::uint64_t wr_id;
  int status;
  int opcode;
  std::uint32_t byte_len;
  std::uint32_t qp_num;
};

Target wait_target(const py::object& target) {
  if (py::isinstance<PyDevice>(target)) {
    const Device& device = *target.cast<PyDevice&>();
    return Target{device.require_open("wait_for"), About{device.name(), std::nullopt, false},
                  &device.registry()};
  }
  if (py::isinstance<PyQueuePair>(target))
    return object_target(target.cast<PyQueuePair&>(), "QueuePair");
  if (py::isinstance<PyCompletionQueue>(target)) {
    return object_target(target.cast<PyCompletionQueue&>(), "CompletionQueue");
  }
  if (py::isinstance<PySharedReceiveQueue>(target)) {
    return object_target(target.cast<PySharedReceiveQueue&>(), "SharedReceiveQueue");
  }
  throw py::type_error(
      "a wait's target is a Device, QueuePair, CompletionQueue or "
      "SharedReceiveQueue, not " +
      py::str(py::type::of(target).attr("__name__")).cast<std::string>());
}

}  // namespace
}  // namespace ibev::python

PYBIND11_MODULE(_ibev, m) {
  using namespace ibev;
  using namespace ibev::python;
  m.doc() = "ibev: RDMA async events with the kernel's event model (native part)";
  m.attr("__version__") = IBEV_VERSION_STRING;

  // OSError(errno, text) for what C++ throws as std::system_error: the
  // errno stays readable (e.errno == errno.ENODEV).
  py::register_exception_translator([](std::exception_ptr thrown) {
    try {
      if (thrown) std::rethrow_exception(thrown);
    } catch (const std::system_error& e) {
      py::object error = py::reinterpret_steal<py::object>(
          PyObject_CallFunction(PyExc_OSError, "is", e.code().value(), e.what()));
      PyErr_SetObject(PyExc_OSError, error.ptr());
    }
  });

  // The event codes, from the one table of them.
  for (const EventTypeInfo& info : kEventTypes) {
    m.attr(std::string(info.enumerator).c_str()) = static_cast<int>(info.type);
  }
  m.attr("IBV_ACCESS_LOCAL_WRITE") = static_cast<int>(IBV_ACCESS_LOCAL_WRITE);
  m.attr("IBV_ACCESS_REMOTE_WRITE") = static_cast<int>(IBV_ACCESS_REMOTE_WRITE);
  m.attr("IBV_ACCESS_REMOTE_READ") = static_cast<int>(IBV_ACCESS_REMOTE_READ);
  m.attr("IBV_WC_SUCCESS") = static_cast<int>(IBV_WC_SUCCESS);
  m.attr("IBV_WC_WR_FLUSH_ERR") = static_cast<int>(IBV_WC_WR_FLUSH_ERR);
  m.attr("IBV_WC_SEND") = static_cast<int>(IBV_WC_SEND);
  m.attr("IBV_WC_RECV") = static_cast<int>(IBV_WC_RECV);

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
            const auto wait = seconds(timeout);
            InUse dispatcher = d.use();
            return without_gil([&] { return (*dispatcher).run_once(wait); });
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

  py::class_<PyDevice>(m, "Device", "An open RDMA device, its async events served by a Dispatcher.")
      .def_static(
          "open",
          [](py::object dispatcher, const std::string& name) {
            InUse d = dispatcher_of(dispatcher, "Device.open").use();
            auto device = without_gil([&] { return Device::open(*d, name); });
            return std::make_unique<PyDevice>(std::move(device), std::move(dispatcher));
          },
          "dispatcher"_a, "name"_a = "")
      .def_static("names", &Device::names)
      .def_property_readonly("name", [](const PyDevice& d) { return (*d).name(); })
      .def_property_readonly("node", [](const PyDevice& d) { return (*d).node(); })
      .def_property_readonly("dispatcher", [](const PyDevice& d) { return d.dispatcher; })
      .def_property_readonly("closed", [](const PyDevice& d) { return (*d).context() == nullptr; })
      .def_property_readonly("loss",
                             [](const PyDevice& d) -> std::optional<std::string> {
                               if ((*d).loss() == DeviceLoss::kNone) return std::nullopt;
                               return std::string(to_string((*d).loss()));
                             })
      .def_property_readonly("port_count", [](const PyDevice& d) { return (*d).port_count(); })
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
          "port"_a = 1)
      .def(
          "listen",
          [](PyDevice& d, py::object handler, std::optional<std::vector<int>> types,
             std::optional<int> port) {
            Handler call = event_handler(handler, About{(*d).name(), std::nullopt, false});
            if (!call) throw py::type_error("listen needs a handler");
            return std::make_unique<PyHandle>(
                (*d).on_event(event_filter(types, port), std::move(call)));
          },
          "handler"_a, "types"_a = py::none(), "port"_a = py::none())
      .def("close", &PyDevice::close);

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
          "name"_a, "add"_a, "remove"_a)
      .def("close", &PyDeviceClients::close);

  py::class_<PyProtectionDomain>(m, "ProtectionDomain")
      .def(py::init([](const PyDevice& device) {
             return std::make_unique<PyProtectionDomain>(ProtectionDomain::create(device.ref()));
           }),
           "device"_a, py::keep_alive<1, 2>())
      .def("close", &PyProtectionDomain::close);

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
      .def_property_readonly("lkey", [](const PyMemoryRegion& mr) { return (*mr).lkey(); })
      .def("close", &PyMemoryRegion::close);

  py::class_<WorkCompletion>(m, "WorkCompletion")
      .def_readonly("wr_id", &WorkCompletion::wr_id)
      .def_readonly("status", &WorkCompletion::status)
      .def_readonly("opcode", &WorkCompletion::opcode)
      .def_readonly("byte_len", &WorkCompletion::byte_len)
      .def_readonly("qp_num", &WorkCompletion::qp_num)
      .def_property_readonly("status_name", [](const WorkCompletion& wc) {
        return std::string(ibv_wc_status_str(static_cast<ibv_wc_status>(wc.status)));
      });

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
      .def("close", &PyCompletionQueue::close);

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
          "limit"_a)
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
          "mr"_a, "offset"_a, "length"_a, "wr_id"_a = 0)
      .def("close", &PySharedReceiveQueue::close);

  py::class_<RcEndpoint>(m, "RcEndpoint", "What an RC peer needs, in ibv_rc_pingpong's wire form.")
      .def_property_readonly("qp_num", &RcEndpoint::qp_num)
      .def_property_readonly("psn", &RcEndpoint::psn)
      .def("to_wire",
           [](const RcEndpoint& e) {
             const auto wire = e.to_wire();
             return py::bytes(wire.data(), wire.size());
           })
      .def_static("from_wire", [](py::bytes wire) {
        return RcEndpoint::from_wire(static_cast<std::string>(wire));
      });

  py::class_<DrainReport>(m, "DrainReport")
      .def_readonly("send_drained", &DrainReport::send_drained)
      .def_readonly("receive_drained", &DrainReport::receive_drained)
      .def_readonly("last_wqe_reached", &DrainReport::last_wqe_reached);

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
      .def_property_readonly("qp_num", [](const PyQueuePair& qp) { return (*qp).qp_num(); })
      .def(
          "endpoint",
          [](const PyQueuePair& qp, int port, int gid_index) {
            if (port < 1 || port > 255) throw py::value_error("port " + std::to_string(port));
            return (*qp).endpoint(static_cast<std::uint8_t>(port), gid_index);
          },
          "port"_a = 1, "gid_index"_a = 0)
      .def(
          "connect", [](PyQueuePair& qp, const RcEndpoint& remote) { (*qp).connect(remote); },
          "remote"_a)
      .def(
          "post_send",
          [](PyQueuePair& qp, const PyMemoryRegion& mr, std::size_t offset, std::size_t length,
             std::uint64_t wr_id, bool signaled) {
            ibv_sge sge = mr.sge(offset, length);
            ibv_send_wr wr{};
            wr.wr_id = wr_id;
            wr.sg_list = &sge;
            wr.num_sge = 1;
            wr.opcode = IBV_WR_SEND;
            wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
            (*qp).post_send(wr);
          },
          "mr"_a, "offset"_a, "length"_a, "wr_id"_a = 0, "signaled"_a = true)
      .def(
          "post_recv",
          [](PyQueuePair& qp, const PyMemoryRegion& mr, std::size_t offset, std::size_t length,
             std::uint64_t wr_id) {
            Receive receive(mr, offset, length, wr_id);
            (*qp).post_recv(receive.wr);
          },
          "mr"_a, "offset"_a, "length"_a, "wr_id"_a = 0)
      .def(
          "drain",
          [](PyQueuePair& qp, double timeout) {
            DrainOptions options;
            options.timeout = seconds(timeout);
            return without_gil([&] { return (*qp).drain(options); });
          },
          "timeout"_a = 5.0)
      .def("close", &PyQueuePair::close);

  m.def(
      "connect_rc_pair", [](PyQueuePair& a, PyQueuePair& b) { connect_rc_pair(*a, *b); }, "a"_a,
      "b"_a, "Connects two RC QPs of one device to each other (loopback).");

  py::class_<PyWaitResult>(m, "WaitResult")
      .def_readonly("outcome", &PyWaitResult::outcome, "'event', 'timed out' or 'device lost'")
      .def_readonly("event", &PyWaitResult::event)
      .def("__repr__", [](const PyWaitResult& r) { return "<ibev.WaitResult " + r.outcome + ">"; });

  py::class_<PyEventWait>(m, "EventWait",
                          "A wait armed by wait_for(): wait() blocks (never on the "
                          "dispatching thread) until the event, the device's loss or the "
                          "timeout; each call after returns the same.")
      .def("wait", &PyEventWait::wait)
      .def("cancel", &PyEventWait::cancel);

  m.def(
      "wait_for",
      [](PyDispatcher& dispatcher, py::object target, std::optional<std::vector<int>> types,
         std::optional<int> port, double timeout, py::object done) -> py::object {
        const auto limit = seconds(timeout);
        InUse d = dispatcher.use();
        const Target on = wait_target(target);
        require_served_by(*d, *on.registry, "wait_for");
        EventFilter filter = event_filter(types, port);
        if (done.is_none()) {
          return py::cast(std::make_unique<PyEventWait>(*d, on, std::move(filter), limit));
        }
        Callable call(std::move(done), "done");
        return py::cast(std::make_unique<PyHandle>(
            ibev::wait_for(*d, on.target, std::move(filter), limit,
                           [call, about = on.about](const WaitResult& result) {
                             call(to_python(result, about));
                           })));
      },
      "dispatcher"_a, "target"_a, "types"_a = py::none(), "port"_a = py::none(), "timeout"_a = 5.0,
      "done"_a = py::none(),
      "Arms a wait for one event of target (a Device, QueuePair, CompletionQueue or "
      "SharedReceiveQueue): an EventWait to wait() on; with done, a Handle, and "
      "done(WaitResult) runs once on the dispatching thread.");
}
