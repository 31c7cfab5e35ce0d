// The Python objects the module's rooms share (python/bindings.h lists
// them): the Dispatcher and its clients' slots, a registration's Handle, and
// the wrappers of what C++ shares (a Device and what is made on it). The
// GIL's rules are bindings.h's. Private to the module.
#ifndef IBEV_PYTHON_OBJECTS_H_
#define IBEV_PYTHON_OBJECTS_H_

#include "bindings.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ibev/core/executor.h>
#include <ibev/core/failure.h>
#include <ibev/core/handle.h>
#include <ibev/core/registry.h>
#include <ibev/dispatch/dispatcher.h>
#include <ibev/dispatch/worker_thread.h>
#include <ibev/verbs/connection_health.h>
#include <ibev/verbs/completion_queue.h>
#include <ibev/verbs/device.h>
#include <ibev/verbs/device_clients.h>
#include <ibev/verbs/protection_domain.h>
#include <ibev/verbs/queue_pair.h>
#include <ibev/verbs/shared_receive_queue.h>

namespace ibev::python {

// A Python on_failure(kind, description) as a FailureSink (empty for None):
// called on the thread that reports, with the GIL taken.
inline FailureSink failure_sink(py::object on_failure) {
  if (on_failure.is_none()) return {};
  Callable sink(std::move(on_failure), "on_failure");
  return [sink](const Failure& failure) {
    try {
      sink(std::string(to_string(failure.kind)), describe(failure));
    } catch (const std::exception& e) {
      // A sink that raises: what ibev does with a C++ sink that throws.
      send_to({}, Failure::handler_threw("on_failure", e.what()));
    }
  };
}

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
    options.on_failure = failure_sink(std::move(on_failure));
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
inline PyDispatcher& dispatcher_of(const py::object& dispatcher, const char* who) {
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

// The rdma-core object of a Python wrapper, or OSError(ENODEV) once closed.
template <typename T>
auto* open_object(const Shared<T>& object, const std::string& what) {
  auto* raw = (*object).get();
  if (raw == nullptr) throw_system_error(what + " is closed", ENODEV);
  return raw;
}

// An object of another Dispatcher's device would never hear what this one
// sends or serves: refused.
inline void require_served_by(Dispatcher& dispatcher, const Registry& registry, const char* who) {
  if (&dispatcher.registry() != &registry) {
    throw py::value_error(std::string(who) + ": its device was opened on another Dispatcher");
  }
}

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

// Hands `post` a SEND of [offset, offset + length) of `mr` (what
// QueuePair.post_send and ConnectionHealth.post_send post); the request and
// its SGE live for the call.
template <typename Post>
void post_send_of(const PyMemoryRegion& mr, std::size_t offset, std::size_t length,
                  std::uint64_t wr_id, bool signaled, Post&& post) {
  ibv_sge sge = mr.sge(offset, length);
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
  post(wr);
}

// A completion as Python reads it (a CompletionQueue's handler's list).
struct WorkCompletion {
  std::uint64_t wr_id;
  int status;
  int opcode;
  std::uint32_t byte_len;
  std::uint32_t qp_num;
};

// A WorkerThread that Python may close (or drop) while what it serves still
// holds its Executor: the executor then drops its tasks (handler calls
// lost), rather than posting to a thread that is gone.
class PyWorkerThread {
 public:
  explicit PyWorkerThread(py::object on_failure) : box_(std::make_shared<Box>()) {
    box_->worker = std::make_unique<WorkerThread>(failure_sink(std::move(on_failure)));
  }
  ~PyWorkerThread() {
    std::unique_ptr<WorkerThread> ending = take();
    if (ending && ending->in_worker_thread()) {
      // Dropped by a task of its own (the collector ran there): joined elsewhere.
      std::thread([ending = std::move(ending)]() mutable { ending.reset(); }).detach();
      return;
    }
    without_gil([&] { ending.reset(); });
  }
  // Runs the tasks posted, then joins; RuntimeError from its own thread.
  void close() {
    std::unique_ptr<WorkerThread> ending = take();
    if (ending && ending->in_worker_thread()) {
      std::lock_guard<std::mutex> lock(box_->mutex);
      box_->worker = std::move(ending);
      throw std::runtime_error("WorkerThread.close() from a task on that thread would never return");
    }
    without_gil([&] { ending.reset(); });
  }
  bool closed() const {
    std::lock_guard<std::mutex> lock(box_->mutex);
    return !box_->worker;
  }
  Executor executor() const {
    return [box = box_](Task task) {
      std::lock_guard<std::mutex> lock(box->mutex);
      if (box->worker) box->worker->post(std::move(task));
    };
  }

 private:
  struct Box {
    std::mutex mutex;
    std::unique_ptr<WorkerThread> worker;  // null once closed
  };
  std::unique_ptr<WorkerThread> take() {
    std::lock_guard<std::mutex> lock(box_->mutex);
    return std::move(box_->worker);
  }
  std::shared_ptr<Box> box_;
};

// ConnectionHealth::Options as Python gives them (HealthOptions), in seconds.
struct PyHealthOptions {
  ConnectionHealth::Options options;
};

// A Python on_change(HealthChange) as a HealthHandler (bind_health.cc):
// TypeError unless callable; called with the GIL taken.
HealthHandler health_handler(py::object on_change);

// The rdma-core QP of what a ConnectionHealth or CmSession runs on, wrapped
// (null: None).
inline py::object queue_pair_object(std::shared_ptr<QueuePair> qp) {
  if (!qp) return py::none();
  return py::cast(std::make_unique<Shared<QueuePair>>(std::move(qp)));
}

}  // namespace ibev::python

#endif  // IBEV_PYTHON_OBJECTS_H_
