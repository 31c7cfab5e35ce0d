// The C API of the dispatcher (what dispatch/ is in C++): the dispatcher,
// its registrations (attach, listen, a device's async fd), and the waits for
// one event. The boundary and the helpers are capi/ibev_c_internal.h's.
#include <ibev/ibev_c.h>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include <ibev/core/event.h>
#include <ibev/core/event_filter.h>
#include <ibev/core/failure.h>
#include <ibev/core/handle.h>
#include <ibev/dispatch/dispatcher.h>
#include <ibev/dispatch/event_wait.h>
#include <ibev/dispatch/worker_thread.h>
#include "ibev_c_internal.h"

using namespace ibev::detail::capi;

namespace ibev {
namespace detail {
namespace capi {

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

}  // namespace capi
}  // namespace detail
}  // namespace ibev

namespace {

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

}  // namespace

extern "C" {

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

// ---------------------------------------------------------------- executors

ibev_worker* ibev_worker_create(ibev_failure_fn on_failure, void* context) {
  return make_call("ibev_worker_create", [&] {
    return std::make_unique<ibev_worker>(failure_sink(on_failure, context)).release();
  });
}

void ibev_worker_destroy(ibev_worker* worker) { take_back(worker); }

int ibev_worker_post(ibev_worker* worker, void (*task)(void* context), void* context) {
  return status_call("ibev_worker_post", [&] {
    void (*const run)(void*) = &require(task, "task");
    require(worker, "worker").worker.post([run, context] { run(context); });
  });
}

int ibev_worker_is_current(const ibev_worker* worker) {
  return worker != nullptr && worker->worker.in_worker_thread() ? 1 : 0;
}

}  // extern "C"
