// The C API: each ibev_* object is a struct holding one reference to the C++
// object (or the C++ object itself, for what C++ does not share), and each
// function is its C++ counterpart inside api_call(), the one place where what
// C++ throws becomes an errno value and ibev_last_error()'s text. Handlers
// given as a function and a context become the C++ handlers, which run
// inside ibev's own reported calls: what a handler throws (a C++ function
// passed as a C one) is a failure record there, never an exception here.
#include <ibev/ibev_c.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>

#include <ibev/core/event.h>
#include <ibev/core/event_filter.h>
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

// What C++ shares (a device, what is made on it) C holds one reference to;
// what it does not (a dispatcher, a registration, a wait) C owns.
template <typename T>
struct Shared {
  std::shared_ptr<T> ref;
};
struct ibev_device : Shared<ibev::Device> {};
struct ibev_pd : Shared<ibev::ProtectionDomain> {};
struct ibev_mr : Shared<ibev::MemoryRegion> {};
struct ibev_cq : Shared<ibev::CompletionQueue> {};
struct ibev_srq : Shared<ibev::SharedReceiveQueue> {};
struct ibev_qp : Shared<ibev::QueuePair> {};

struct ibev_dispatcher {
  explicit ibev_dispatcher(ibev::Dispatcher::Options options) : dispatcher(std::move(options)) {}
  ibev::Dispatcher dispatcher;
};
struct ibev_clients {
  explicit ibev_clients(ibev::Dispatcher& dispatcher) : clients(dispatcher) {}
  ibev::DeviceClients clients;
};
struct ibev_handle {
  ibev::Handle handle;
};
struct ibev_waiter {
  ibev::EventWait wait;
};

namespace {

thread_local std::string last_error;

// The one translation of a C++ failure: an errno value, and the thread's
// last error naming the C function and what C++ said.
int failed(const char* api, const char* what, int error) noexcept {
  try {
    last_error = std::string(api) + ": " + what;
  } catch (...) {
    last_error.clear();  // no memory for the text; the errno still says it
  }
  errno = error;
  return error;
}

// Runs `body` for the C function `api`: its result, or, when it throws, the
// errno it stands for (with errno and ibev_last_error() set) from
// `on_error(error)`. Nothing escapes.
template <typename Body, typename OnError>
auto api_call(const char* api, Body&& body, OnError&& on_error) noexcept -> decltype(body()) {
  try {
    return body();
  } catch (const std::exception& e) {
    return on_error(failed(api, e.what(), ibev::errno_of(e)));
  } catch (...) {
    return on_error(failed(api, "an exception not derived from std::exception", EIO));
  }
}

// The two shapes of C result: 0 or an errno value; an object or NULL.
template <typename Body>
int status_call(const char* api, Body&& body) noexcept {
  return api_call(
      api,
      [&] {
        body();
        return 0;
      },
      [](int error) { return error; });
}
template <typename Body>
auto make_call(const char* api, Body&& body) noexcept -> decltype(body()) {
  return api_call(api, std::forward<Body>(body), [](int) -> decltype(body()) { return nullptr; });
}

// Bad input from C is EINVAL, naming what was missing.
template <typename T>
T& require(T* object, const char* what) {
  if (object == nullptr) throw std::invalid_argument(std::string(what) + " is NULL");
  return *object;
}

// C owns what it is handed: one allocation, freed by its _destroy.
template <typename T, typename... Args>
T* hand_out(Args&&... args) {
  return std::make_unique<T>(T{std::forward<Args>(args)...}).release();
}
template <typename T>
void take_back(T* object) noexcept {
  std::unique_ptr<T> owned(object);
}

ibev_event to_c(const ibev::Event& event) noexcept {
  ibev_event c{};
  c.device = event.device();
  c.code = event.code();
  c.name = event.name().data();  // always a static, NUL-terminated string
  c.element_kind = static_cast<ibev_element_kind>(event.element_kind());
  c.severity = static_cast<ibev_severity>(event.severity());
  c.cq = event.cq();
  c.qp = event.qp();
  c.srq = event.srq();
  c.wq = event.wq();
  c.port = event.port().value_or(0);
  if (const auto number = event.object_number()) {
    c.numbered = 1;
    c.object_number = number->number;
  }
  c.synthesized = event.synthesized() ? 1 : 0;
  c.loss = static_cast<ibev_device_loss>(event.loss());
  return c;
}

// The C enums mirror the C++ ones value for value: a cast between them is
// the conversion. ibev_element_kind, in ibev::kElementKinds' order: a kind
// added there does not compile until ibev_c.h has its enumerator and this
// list has it too.
constexpr ibev_element_kind kCElementKinds[] = {IBEV_ELEMENT_CQ,  IBEV_ELEMENT_QP,
                                                IBEV_ELEMENT_SRQ, IBEV_ELEMENT_WQ,
                                                IBEV_ELEMENT_PORT, IBEV_ELEMENT_DEVICE};
static_assert(std::size(kCElementKinds) == ibev::kElementKinds.size(),
              "ibev_element_kind has one enumerator per ibev::ElementKind");
constexpr bool c_element_kinds_mirror() {
  for (std::size_t i = 0; i < ibev::kElementKinds.size(); ++i) {
    if (static_cast<int>(kCElementKinds[i]) != static_cast<int>(ibev::kElementKinds[i].kind)) {
      return false;
    }
  }
  return true;
}
static_assert(c_element_kinds_mirror(), "ibev_element_kind mirrors ibev::ElementKind");

// The others, enumerator by enumerator.
#define IBEV_C_MIRRORS(c_value, cpp_value) \
  static_assert(static_cast<int>(c_value) == static_cast<int>(cpp_value), #c_value)
IBEV_C_MIRRORS(IBEV_SEVERITY_FATAL, ibev::Severity::kFatal);
IBEV_C_MIRRORS(IBEV_SEVERITY_ERROR, ibev::Severity::kError);
IBEV_C_MIRRORS(IBEV_SEVERITY_INFORMATIONAL, ibev::Severity::kInformational);
IBEV_C_MIRRORS(IBEV_SEVERITY_UNKNOWN, ibev::Severity::kUnknown);
IBEV_C_MIRRORS(IBEV_LOSS_NONE, ibev::DeviceLoss::kNone);
IBEV_C_MIRRORS(IBEV_LOSS_REMOVED, ibev::DeviceLoss::kRemoved);
IBEV_C_MIRRORS(IBEV_LOSS_FATAL, ibev::DeviceLoss::kFatal);
IBEV_C_MIRRORS(IBEV_LOSS_ASYNC_FD_FAILED, ibev::DeviceLoss::kAsyncFdFailed);
IBEV_C_MIRRORS(IBEV_FAILURE_HANDLER_THREW, ibev::Failure::Kind::kHandlerThrew);
IBEV_C_MIRRORS(IBEV_FAILURE_VERB_FAILED, ibev::Failure::Kind::kVerbFailed);
IBEV_C_MIRRORS(IBEV_FAILURE_DEVICE_LOST, ibev::Failure::Kind::kDeviceLost);
IBEV_C_MIRRORS(IBEV_FAILURE_DESTROY_FAILED, ibev::Failure::Kind::kDestroyFailed);
IBEV_C_MIRRORS(IBEV_FAILURE_UNDISPATCHED, ibev::Failure::Kind::kUndispatched);
IBEV_C_MIRRORS(IBEV_FAILURE_STALLED, ibev::Failure::Kind::kStalled);
IBEV_C_MIRRORS(IBEV_FAILURE_CONNECTION_FAILED, ibev::Failure::Kind::kConnectionFailed);
IBEV_C_MIRRORS(IBEV_DEVICE_MONITOR_AUTO, ibev::DeviceMonitor::kAuto);
IBEV_C_MIRRORS(IBEV_DEVICE_MONITOR_UEVENTS, ibev::DeviceMonitor::kUevents);
IBEV_C_MIRRORS(IBEV_DEVICE_MONITOR_INOTIFY, ibev::DeviceMonitor::kInotify);
IBEV_C_MIRRORS(IBEV_DEVICE_MONITOR_RESCAN, ibev::DeviceMonitor::kRescan);
IBEV_C_MIRRORS(IBEV_DEVICE_MONITOR_OFF, ibev::DeviceMonitor::kOff);
IBEV_C_MIRRORS(IBEV_CQ_EVENT, ibev::CompletionMode::kEvent);
IBEV_C_MIRRORS(IBEV_CQ_ADAPTIVE, ibev::CompletionMode::kAdaptive);
IBEV_C_MIRRORS(IBEV_CQ_POLLED, ibev::CompletionMode::kPolled);
IBEV_C_MIRRORS(IBEV_WAIT_EVENT, ibev::WaitResult::Outcome::kEvent);
IBEV_C_MIRRORS(IBEV_WAIT_TIMED_OUT, ibev::WaitResult::Outcome::kTimedOut);
IBEV_C_MIRRORS(IBEV_WAIT_DEVICE_LOST, ibev::WaitResult::Outcome::kDeviceLost);
#undef IBEV_C_MIRRORS

// A C enum from the caller: in C any int may be stored in one, in C++ an
// enum holding none of its values is undefined to read (UBSan checks), so
// its bits are read as an int, then checked: one of its values, or EINVAL.
template <typename CEnum>
int bits_of(const CEnum& value) noexcept {
  static_assert(sizeof(CEnum) == sizeof(int));
  int bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}
template <typename Enum, typename CEnum>
Enum enum_in_range(const CEnum& value, int last, const char* what) {
  const int bits = bits_of(value);
  if (bits < 0 || bits > last) {
    throw std::invalid_argument(std::string(what) + " " + std::to_string(bits) +
                                " is none of its enum's values");
  }
  return static_cast<Enum>(bits);
}

ibev::Handler event_handler(ibev_event_fn handler, void* context) {
  if (handler == nullptr) return {};
  return [handler, context](const ibev::Event& event) {
    const ibev_event c = to_c(event);
    handler(&c, context);
  };
}

ibev::EventFilter to_filter(const ibev_filter* filter) {
  if (filter == nullptr) return {};
  ibev::EventFilter result;
  if (filter->count > 0) {
    result = ibev::EventFilter::of_codes(filter->codes, filter->count);
  }
  if (filter->port != 0) result.on_port(filter->port);
  return result;
}

ibev::FailureSink failure_sink(ibev_failure_fn sink, void* context) {
  if (sink == nullptr) return {};
  return [sink, context](const ibev::Failure& failure) {
    const std::string description = ibev::describe(failure);
    ibev_failure c{};
    c.kind = static_cast<ibev_failure_kind>(failure.kind);
    c.verb = failure.verb.c_str();
    c.error = failure.error.value();
    c.device = failure.device;
    c.object = failure.object;
    c.event_code = failure.event_code.value_or(-1);
    c.what = failure.what.c_str();
    c.description = description.c_str();
    sink(&c, context);
  };
}

ibev::WaitTarget wait_target(const ibev_element_kind& kind, void* target) {
  if (target == nullptr) throw std::invalid_argument("target is NULL");
  switch (enum_in_range<ibev_element_kind>(kind, static_cast<int>(std::size(kCElementKinds)) - 1,
                                           "kind")) {
    case IBEV_ELEMENT_CQ:
      return static_cast<ibv_cq*>(target);
    case IBEV_ELEMENT_QP:
      return static_cast<ibv_qp*>(target);
    case IBEV_ELEMENT_SRQ:
      return static_cast<ibv_srq*>(target);
    case IBEV_ELEMENT_WQ:
      return static_cast<ibv_wq*>(target);
    case IBEV_ELEMENT_DEVICE:
      return static_cast<ibv_context*>(target);
    case IBEV_ELEMENT_PORT:
      break;
  }
  throw std::invalid_argument("a port is not a CQ, QP, SRQ, WQ or device");
}

ibev_rc_endpoint to_c(const ibev::RcEndpoint& endpoint) noexcept {
  return {endpoint.qp_num(), endpoint.gid(), endpoint.psn(), endpoint.lid()};
}
ibev::RcEndpoint from_c(const ibev_rc_endpoint& endpoint) {
  return ibev::RcEndpoint(endpoint.qp_num, endpoint.gid, endpoint.psn, endpoint.lid);
}

ibev::ConnectOptions connect_options(const ibev_connect_attr* attr) {
  ibev::ConnectOptions options;
  if (attr == nullptr) return options;
  options.port = attr->port;
  options.gid_index = attr->gid_index;
  options.access_flags = attr->access_flags;
  if (bits_of(attr->path_mtu) != 0) {
    options.path_mtu = enum_in_range<ibv_mtu>(attr->path_mtu, IBV_MTU_4096, "attr->path_mtu");
  }
  options.timeout = attr->timeout;
  options.retry_cnt = attr->retry_cnt;
  options.rnr_retry = attr->rnr_retry;
  options.min_rnr_timer = attr->min_rnr_timer;
  options.max_rd_atomic = attr->max_rd_atomic;
  options.max_dest_rd_atomic = attr->max_dest_rd_atomic;
  options.service_level = attr->service_level;
  options.traffic_class = attr->traffic_class;
  options.hop_limit = attr->hop_limit;
  options.pkey_index = attr->pkey_index;
  return options;
}

}  // namespace

extern "C" {

const char* ibev_last_error(void) { return last_error.c_str(); }

// -------------------------------------------------------------- dispatcher

ibev_dispatcher* ibev_dispatcher_create(const ibev_dispatcher_attr* attr) {
  return make_call("ibev_dispatcher_create", [&] {
    ibev::Dispatcher::Options options;
    if (attr != nullptr) {
      if (attr->batch != 0) options.batch = attr->batch;
      options.on_failure = failure_sink(attr->on_failure, attr->failure_context);
      if (attr->stall_after_ms != 0) {
        options.stall_after = std::chrono::milliseconds(std::max(attr->stall_after_ms, 0));
      }
      options.device_monitor = enum_in_range<ibev::DeviceMonitor>(
          attr->device_monitor, IBEV_DEVICE_MONITOR_OFF, "attr->device_monitor");
    }
    return std::make_unique<ibev_dispatcher>(std::move(options)).release();
  });
}

void ibev_dispatcher_destroy(ibev_dispatcher* dispatcher) { take_back(dispatcher); }

int ibev_dispatcher_start(ibev_dispatcher* dispatcher) {
  return status_call("ibev_dispatcher_start",
                     [&] { require(dispatcher, "dispatcher").dispatcher.start(); });
}

int ibev_dispatcher_stop(ibev_dispatcher* dispatcher) {
  return status_call("ibev_dispatcher_stop",
                     [&] { require(dispatcher, "dispatcher").dispatcher.stop(); });
}

int ibev_dispatcher_fd(const ibev_dispatcher* dispatcher) {
  return api_call(
      "ibev_dispatcher_fd", [&] { return require(dispatcher, "dispatcher").dispatcher.fd(); },
      [](int) { return -1; });
}

int ibev_dispatcher_run_once(ibev_dispatcher* dispatcher, int timeout_ms, size_t* served) {
  return status_call("ibev_dispatcher_run_once", [&] {
    const std::size_t count = require(dispatcher, "dispatcher")
                                  .dispatcher.run_once(std::chrono::milliseconds(timeout_ms));
    if (served != nullptr) *served = count;
  });
}

int ibev_dispatcher_inject(ibev_dispatcher* dispatcher, ibv_context* device,
                           const ibv_async_event* event) {
  return status_call("ibev_dispatcher_inject", [&] {
    const ibv_async_event& raw = require(event, "event");
    // Read as a real event is (the member its type names), then checked as
    // an injected one is (no NULL object, no port 0).
    const ibev::Event read = ibev::Event::from_async(&require(device, "device"), raw);
    require(dispatcher, "dispatcher").dispatcher.inject(device, read.code(), read.element());
  });
}

ibev_handle* ibev_dispatcher_watch_device(ibev_dispatcher* dispatcher, ibv_context* device) {
  return make_call("ibev_dispatcher_watch_device", [&] {
    return hand_out<ibev_handle>(require(dispatcher, "dispatcher")
                                     .dispatcher.watch_async_events(&require(device, "device")));
  });
}

ibev_handle* ibev_attach(ibev_dispatcher* dispatcher, ibev_element_kind kind, void* object,
                         const ibev_filter* filter, ibev_event_fn handler, void* context) {
  return make_call("ibev_attach", [&] {
    ibev::Registry& registry = require(dispatcher, "dispatcher").dispatcher.registry();
    ibev::Handler call = event_handler(&require(handler, "handler"), context);
    return hand_out<ibev_handle>(std::visit(
        [&](auto* target) -> ibev::Handle {
          if constexpr (std::is_same_v<decltype(target), ibv_context*>) {
            throw std::invalid_argument("a device is listened to (ibev_listen), not attached to");
          } else {
            return registry.attach(target, to_filter(filter), std::move(call));
          }
        },
        wait_target(kind, object)));
  });
}

ibev_handle* ibev_listen(ibev_dispatcher* dispatcher, ibv_context* device,
                         const ibev_filter* filter, ibev_event_fn handler, void* context) {
  return make_call("ibev_listen", [&] {
    ibev::Handler call = event_handler(&require(handler, "handler"), context);
    return hand_out<ibev_handle>(
        require(dispatcher, "dispatcher")
            .dispatcher.registry()
            .listen(&require(device, "device"), to_filter(filter), std::move(call)));
  });
}

void ibev_handle_release(ibev_handle* handle) { take_back(handle); }

// ------------------------------------------------------------------ devices

ibev_device* ibev_device_open(ibev_dispatcher* dispatcher, const char* name) {
  return make_call("ibev_device_open", [&] {
    return hand_out<ibev_device>(ibev::Device::open(require(dispatcher, "dispatcher").dispatcher,
                                                    name != nullptr ? name : ""));
  });
}

ibev_device* ibev_device_ref(ibev_device* device) {
  return make_call("ibev_device_ref",
                   [&] { return hand_out<ibev_device>(require(device, "device").ref); });
}

void ibev_device_destroy(ibev_device* device) { take_back(device); }

ibv_context* ibev_device_context(const ibev_device* device) {
  return device != nullptr ? device->ref->context() : nullptr;
}

const char* ibev_device_name(const ibev_device* device) {
  return device != nullptr ? device->ref->name().c_str() : nullptr;
}

ibev_device_loss ibev_device_lost(const ibev_device* device) {
  return device != nullptr ? static_cast<ibev_device_loss>(device->ref->loss()) : IBEV_LOSS_NONE;
}

ibev_handle* ibev_device_listen(ibev_device* device, const ibev_filter* filter,
                                ibev_event_fn handler, void* context) {
  return make_call("ibev_device_listen", [&] {
    ibev::Handler call = event_handler(&require(handler, "handler"), context);
    return hand_out<ibev_handle>(
        require(device, "device").ref->on_event(to_filter(filter), std::move(call)));
  });
}

ibev_clients* ibev_clients_create(ibev_dispatcher* dispatcher) {
  return make_call("ibev_clients_create", [&] {
    return std::make_unique<ibev_clients>(require(dispatcher, "dispatcher").dispatcher).release();
  });
}

void ibev_clients_destroy(ibev_clients* clients) { take_back(clients); }

ibev_handle* ibev_clients_register(ibev_clients* clients, const ibev_client* client) {
  return make_call("ibev_clients_register", [&] {
    const ibev_client c = require(client, "client");
    if (c.add == nullptr || c.remove == nullptr) {
      throw std::invalid_argument("client's add and remove are required");
    }
    // The ibev_device each of this client's calls is handed, from its add to
    // the end of its remove. Only the dispatching thread touches it (add and
    // remove run there, one at a time).
    auto lent = std::make_shared<std::map<const ibev::Device*, std::unique_ptr<ibev_device>>>();
    ibev::DeviceClient registered;
    registered.name = c.name != nullptr ? c.name : "C client";
    registered.add = [c, lent](const std::shared_ptr<ibev::Device>& device) {
      auto& handed = (*lent)[device.get()];
      handed = std::make_unique<ibev_device>(ibev_device{device});
      c.add(handed.get(), c.context);
    };
    registered.remove = [c, lent](const std::shared_ptr<ibev::Device>& device,
                                  ibev::DeviceLoss loss) {
      const auto handed = lent->find(device.get());
      if (handed == lent->end()) return;
      const std::unique_ptr<ibev_device> ending = std::move(handed->second);
      lent->erase(handed);
      c.remove(ending.get(), static_cast<ibev_device_loss>(loss), c.context);
    };
    return hand_out<ibev_handle>(
        require(clients, "clients").clients.register_client(std::move(registered)));
  });
}

// ------------------------------------------------------ domains and regions

ibev_pd* ibev_pd_create(ibev_device* device) {
  return make_call("ibev_pd_create", [&] {
    return hand_out<ibev_pd>(ibev::ProtectionDomain::create(require(device, "device").ref));
  });
}

void ibev_pd_destroy(ibev_pd* pd) { take_back(pd); }

ibv_pd* ibev_pd_get(const ibev_pd* pd) { return pd != nullptr ? pd->ref->get() : nullptr; }

ibev_mr* ibev_mr_create(ibev_pd* pd, void* address, size_t length, int access) {
  return make_call("ibev_mr_create", [&] {
    return hand_out<ibev_mr>(
        ibev::MemoryRegion::create(require(pd, "pd").ref, address, length, access));
  });
}

void ibev_mr_destroy(ibev_mr* mr) { take_back(mr); }

ibv_mr* ibev_mr_get(const ibev_mr* mr) { return mr != nullptr ? mr->ref->get() : nullptr; }

// -------------------------------------------------------- completion queues

ibev_cq* ibev_cq_create(ibev_device* device, const ibev_cq_attr* attr,
                        ibev_completion_fn on_completion, ibev_event_fn on_event, void* context) {
  return make_call("ibev_cq_create", [&] {
    ibev::CompletionQueue::Options options;
    if (attr != nullptr) {
      if (attr->cqe != 0) options.cqe = attr->cqe;
      options.completion.mode =
          enum_in_range<ibev::CompletionMode>(attr->mode, IBEV_CQ_POLLED, "attr->mode");
      if (attr->ack_batch != 0) options.completion.ack_batch = attr->ack_batch;
      if (attr->poll_batch != 0) options.completion.poll_batch = attr->poll_batch;
      if (attr->budget != 0) options.completion.budget = attr->budget;
      options.completion.solicited_only = attr->solicited_only != 0;
      if (attr->dispatcher != nullptr) options.dispatcher = &attr->dispatcher->dispatcher;
      options.comp_vector = attr->comp_vector;
    }
    std::shared_ptr<ibev::Device> on = require(device, "device").ref;
    ibev::Handler events = event_handler(on_event, context);
    if (options.completion.mode == ibev::CompletionMode::kPolled) {
      if (on_completion != nullptr) {
        throw std::invalid_argument("a polled CQ takes no completion function");
      }
      return hand_out<ibev_cq>(
          ibev::CompletionQueue::create_polled(std::move(on), std::move(events), options));
    }
    if (on_completion == nullptr) throw std::invalid_argument("on_completion is NULL");
    auto completions = [on_completion, context](const ibev::CompletionBatch& batch) {
      on_completion(batch.cq, batch.data, batch.size, context);
    };
    return hand_out<ibev_cq>(ibev::CompletionQueue::create(std::move(on), std::move(completions),
                                                           std::move(events), options));
  });
}

void ibev_cq_destroy(ibev_cq* cq) { take_back(cq); }

ibv_cq* ibev_cq_get(const ibev_cq* cq) { return cq != nullptr ? cq->ref->get() : nullptr; }

// ---------------------------------------------------- shared receive queues

ibev_srq* ibev_srq_create(ibev_pd* pd, uint32_t max_wr, uint32_t max_sge, ibev_event_fn on_event,
                          void* context) {
  return make_call("ibev_srq_create", [&] {
    ibev::SharedReceiveQueue::Options options;
    if (max_wr != 0) options.max_wr = max_wr;
    if (max_sge != 0) options.max_sge = max_sge;
    return hand_out<ibev_srq>(ibev::SharedReceiveQueue::create(
        require(pd, "pd").ref, event_handler(on_event, context), options));
  });
}

void ibev_srq_destroy(ibev_srq* srq) { take_back(srq); }

ibv_srq* ibev_srq_get(const ibev_srq* srq) { return srq != nullptr ? srq->ref->get() : nullptr; }

int ibev_srq_arm_limit(ibev_srq* srq, uint32_t limit) {
  return status_call("ibev_srq_arm_limit", [&] { require(srq, "srq").ref->arm_limit(limit); });
}

// ------------------------------------------------------------- queue pairs

ibev_qp* ibev_qp_create(ibev_pd* pd, const ibev_qp_attr* attr, ibev_event_fn on_event,
                        void* context) {
  return make_call("ibev_qp_create", [&] {
    const ibev_qp_attr& a = require(attr, "attr");
    ibev::QueuePair::Options options;
    options.send_cq = require(a.send_cq, "attr->send_cq").ref;
    options.recv_cq = require(a.recv_cq, "attr->recv_cq").ref;
    if (a.srq != nullptr) options.srq = a.srq->ref;
    if (bits_of(a.qp_type) != 0) {
      options.type = enum_in_range<ibv_qp_type>(a.qp_type, IBV_QPT_DRIVER, "attr->qp_type");
    }
    if (a.cap.max_send_wr != 0) options.cap.max_send_wr = a.cap.max_send_wr;
    if (a.cap.max_recv_wr != 0) options.cap.max_recv_wr = a.cap.max_recv_wr;
    if (a.cap.max_send_sge != 0) options.cap.max_send_sge = a.cap.max_send_sge;
    if (a.cap.max_recv_sge != 0) options.cap.max_recv_sge = a.cap.max_recv_sge;
    options.cap.max_inline_data = a.cap.max_inline_data;
    options.signal_all = a.sq_sig_all != 0;
    if (a.fixed_psn != 0) options.psn = a.psn;
    options.drain_on_destroy = a.drain_on_destroy != 0;
    return hand_out<ibev_qp>(
        ibev::QueuePair::create(require(pd, "pd").ref, event_handler(on_event, context), options));
  });
}

void ibev_qp_destroy(ibev_qp* qp) { take_back(qp); }

ibv_qp* ibev_qp_get(const ibev_qp* qp) { return qp != nullptr ? qp->ref->get() : nullptr; }

int ibev_rc_endpoint_to_wire(const ibev_rc_endpoint* endpoint,
                             char wire[IBEV_RC_ENDPOINT_WIRE_SIZE]) {
  static_assert(IBEV_RC_ENDPOINT_WIRE_SIZE == ibev::RcEndpoint::kWireSize);
  return status_call("ibev_rc_endpoint_to_wire", [&] {
    const auto text = from_c(require(endpoint, "endpoint")).to_wire();
    std::copy(text.begin(), text.end(), &require(wire, "wire"));
  });
}

int ibev_rc_endpoint_from_wire(const char* wire, size_t length, ibev_rc_endpoint* endpoint) {
  return status_call("ibev_rc_endpoint_from_wire", [&] {
    require(endpoint, "endpoint") =
        to_c(ibev::RcEndpoint::from_wire(std::string_view(&require(wire, "wire"), length)));
  });
}

void ibev_connect_attr_init(ibev_connect_attr* attr) {
  if (attr == nullptr) return;
  const ibev::ConnectOptions d;
  *attr = ibev_connect_attr{};
  attr->port = d.port;
  attr->gid_index = d.gid_index;
  attr->access_flags = d.access_flags;
  attr->timeout = d.timeout;
  attr->retry_cnt = d.retry_cnt;
  attr->rnr_retry = d.rnr_retry;
  attr->min_rnr_timer = d.min_rnr_timer;
  attr->max_rd_atomic = d.max_rd_atomic;
  attr->max_dest_rd_atomic = d.max_dest_rd_atomic;
  attr->service_level = d.service_level;
  attr->traffic_class = d.traffic_class;
  attr->hop_limit = d.hop_limit;
  attr->pkey_index = d.pkey_index;
}

int ibev_qp_endpoint(const ibev_qp* qp, uint8_t port, int gid_index, ibev_rc_endpoint* endpoint) {
  return status_call("ibev_qp_endpoint", [&] {
    require(endpoint, "endpoint") = to_c(require(qp, "qp").ref->endpoint(port, gid_index));
  });
}

int ibev_qp_connect(ibev_qp* qp, const ibev_rc_endpoint* remote, const ibev_connect_attr* attr) {
  return status_call("ibev_qp_connect", [&] {
    require(qp, "qp").ref->connect(from_c(require(remote, "remote")), connect_options(attr));
  });
}

int ibev_qp_drain(ibev_qp* qp, int timeout_ms, ibev_drain_report* report) {
  return status_call("ibev_qp_drain", [&] {
    ibev::DrainOptions options;
    if (timeout_ms != 0) options.timeout = std::chrono::milliseconds(timeout_ms);
    const ibev::DrainReport drained = require(qp, "qp").ref->drain(options);
    if (report == nullptr) return;
    report->send_drained = drained.send_drained ? 1 : 0;
    report->receive_drained = drained.receive_drained ? 1 : 0;
    report->last_wqe_reached =
        drained.last_wqe_reached.has_value() ? (*drained.last_wqe_reached ? 1 : 0) : -1;
  });
}

// ----------------------------------------------------------------- waiting

ibev_waiter* ibev_wait_for(ibev_dispatcher* dispatcher, ibev_element_kind kind, void* target,
                           const ibev_filter* filter, int timeout_ms) {
  return make_call("ibev_wait_for", [&] {
    return hand_out<ibev_waiter>(ibev::wait_for(require(dispatcher, "dispatcher").dispatcher,
                                                wait_target(kind, target), to_filter(filter),
                                                std::chrono::milliseconds(timeout_ms)));
  });
}

int ibev_waiter_wait(ibev_waiter* waiter, ibev_wait_outcome* outcome, ibev_event* event) {
  return status_call("ibev_waiter_wait", [&] {
    const ibev::WaitResult result = require(waiter, "waiter").wait.wait();
    if (outcome != nullptr) *outcome = static_cast<ibev_wait_outcome>(result.outcome);
    if (event != nullptr) *event = result.event ? to_c(*result.event) : ibev_event{};
  });
}

void ibev_waiter_destroy(ibev_waiter* waiter) { take_back(waiter); }

}  // extern "C"
