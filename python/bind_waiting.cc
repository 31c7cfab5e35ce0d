// The module's waiting room (python/bindings.h lists the rooms): wait_for(),
// its EventWait and their WaitResult.
#include "objects.h"

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ibev/dispatch/event_wait.h>

using namespace pybind11::literals;

namespace ibev::python {
namespace {

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
    // In slices, for Ctrl-C: a KeyboardInterrupt leaves the wait armed (a
    // later wait() goes on with it).
    wait_interruptibly(deadline_, [&](std::chrono::steady_clock::time_point end) {
      std::unique_lock<std::mutex> lock(state_->mutex);
      return state_->ended.wait_until(lock, end, [&] { return state_->result.has_value(); });
    });
    PyWaitResult result = without_gil([&] {
      state_->decide(PyWaitResult{"timed out", std::nullopt});  // if nothing came first
      std::lock_guard<std::mutex> lock(state_->mutex);
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

void bind_waiting(py::module_& m) {
  py::class_<PyWaitResult>(m, "WaitResult", "How a wait_for() wait ended, and with what event.")
      .def_readonly("outcome", &PyWaitResult::outcome, "'event', 'timed out' or 'device lost'")
      .def_readonly("event", &PyWaitResult::event, "The Event, for 'event' and 'device lost'.")
      .def("__repr__", [](const PyWaitResult& r) { return "<ibev.WaitResult " + r.outcome + ">"; });

  py::class_<PyEventWait>(m, "EventWait",
                          "A wait armed by wait_for(): wait() blocks (never on the "
                          "dispatching thread) until the event, the device's loss or the "
                          "timeout; each call after returns the same.")
      .def("wait", &PyEventWait::wait,
           "Blocks (without the GIL) until the event, the device's loss or the timeout, and "
           "returns the WaitResult. Ctrl-C raises KeyboardInterrupt within 50 ms and leaves the "
           "wait armed. ValueError on the dispatching thread or once cancelled.")
      .def("cancel", &PyEventWait::cancel,
           "Disarms the wait (waiting without the GIL for a callback running); wait() then "
           "raises ValueError.");

  m.def(
      "wait_for",
      [](PyDispatcher& dispatcher, py::object target, std::optional<std::vector<int>> types,
         std::optional<int> port, double timeout, py::object done) -> py::object {
        const auto limit = seconds(timeout);
        // Before the target: a filter that can never match is a ValueError
        // whatever the wait is on.
        EventFilter filter = event_filter(types, port);
        InUse d = dispatcher.use();
        const Target on = wait_target(target);
        require_served_by(*d, *on.registry, "wait_for");
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

}  // namespace ibev::python
