// ibev::Registry: who hears which async event.
//
// The userspace counterpart of two kernel mechanisms: the `event_handler`
// given to ib_create_cq/qp/srq/wq (here: attach(), one or more handlers per
// object, keyed by its ibv_* address or by its number on its device), and a
// device's `event_handler_list` fed by ib_register_event_handler (here:
// listen(), in registration order).
// Routing follows the kernel: an object event (CQ, QP, SRQ, WQ) reaches only
// that object's handlers; a port or device event reaches every matching
// listener of its device. An event nobody takes goes to the on_unclaimed()
// observers and is counted, never dropped silently.
//
// Routing is two steps. resolve() decides who hears the event, now; deliver()
// calls them, later. A dispatcher resolves, then acks the event to rdma-core
// (after which the object may be destroyed and its address reused), then
// delivers: an event resolved for address A reaches only handlers that were
// attached to A when it was resolved, never a newer object's; a listener
// added after the resolve does not hear it.
//
// Where handlers run: on the thread that calls deliver() (in ibev, the
// Dispatcher's), one event at a time per deliver() call, unless the
// subscription names an Executor (core/executor.h): then deliver() hands the
// call to it. Handlers may subscribe, release (even their own Handle) and
// deliver. A handler that throws becomes a Failure (core/failure.h) for the
// sink, counted per device and code; delivery goes on.
//
// Every subscription returns a Handle (core/handle.h) with its wait rule.
// Thread safety: every member may be called from any thread, concurrently.
// A Dispatcher owns the Registry it routes to (Dispatcher::registry()); a
// Registry of one's own is for code that reads events some other way.
#ifndef IBEV_CORE_REGISTRY_H_
#define IBEV_CORE_REGISTRY_H_

#include <infiniband/verbs.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ibev/core/event.h>
#include <ibev/core/event_filter.h>
#include <ibev/core/executor.h>
#include <ibev/core/failure.h>
#include <ibev/core/handle.h>
#include <ibev/core/route.h>

namespace ibev {

using Handler = std::function<void(const Event&)>;

namespace detail {
// An object's handler, a device listener or an unclaimed observer.
using EventSubscriber = Subscriber<Event, EventFilter>;
struct DeviceState;
struct RegistryState;
class ObjectKey;
class NumberKey;
}  // namespace detail

// The result of Registry::resolve(): the event and who will hear it.
// Move-only and cheap; hand it to Registry::deliver() on any thread.
class Delivery {
 public:
  Delivery(Delivery&&) noexcept;
  Delivery& operator=(Delivery&&) noexcept;
  ~Delivery();

  const Event& event() const noexcept { return event_; }

 private:
  friend class Registry;
  explicit Delivery(const Event& event) noexcept;

  Event event_;
  detail::Snapshot<detail::EventSubscriber> who_;  // the object's handlers, or the listeners
  std::shared_ptr<detail::DeviceState> device_;    // its counters
};

struct EventCounts {
  std::uint64_t delivered = 0;  // events that reached at least one handler
  std::uint64_t unclaimed = 0;  // events that reached none
  std::uint64_t handler_failures = 0;  // handler calls that threw
};

// A consistent-enough copy of one device's counters: each number is exact,
// the set is not one atomic instant (delivery does not stop to read it).
class CounterSnapshot {
 public:
  // Codes 0..kTrackedCodes-1 are counted each on their own (room for codes
  // newer kernels add); any other code shares one bucket.
  static constexpr int kTrackedCodes = 32;

  EventCounts for_code(int code) const noexcept;
  EventCounts total() const noexcept;
  // What the counts of bucket `code` (0..kTrackedCodes) are called in
  // reports: the code's enumerator ("IBV_EVENT_PORT_ERR"), "unknown(N)" for a
  // code no ibv_event_type names, "other" for the shared bucket.
  static std::string bucket_name(int code);
  // Completion handlers of the device's CQs that threw.
  std::uint64_t completion_handler_failures() const noexcept {
    return completion_handler_failures_;
  }
  // Every Failure reported for the device, of any kind.
  std::uint64_t failures() const noexcept { return failures_; }

 private:
  friend class Registry;
  std::array<EventCounts, kTrackedCodes + 1> counts_{};
  std::uint64_t completion_handler_failures_ = 0;
  std::uint64_t failures_ = 0;
};

class Registry {
 public:
  // `sink` receives every Failure reported here; empty: written to stderr.
  explicit Registry(FailureSink sink = {});
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // An object's handler, as the event_handler of ib_create_cq/qp/srq/wq.
  // `filter` may narrow to some of the object's event types (no port).
  // Throws std::invalid_argument for a null object, an address that is not
  // 8-aligned (every rdma-core object's is: core/object_table.h keeps the
  // kind in those bits), an empty handler, or a filter naming another kind's
  // events or a port.
  Handle attach(ibv_cq* cq, Handler handler);
  Handle attach(ibv_qp* qp, Handler handler);
  Handle attach(ibv_srq* srq, Handler handler);
  Handle attach(ibv_wq* wq, Handler handler);
  Handle attach(ibv_cq* cq, EventFilter filter, Handler handler, Executor executor = {});
  Handle attach(ibv_qp* qp, EventFilter filter, Handler handler, Executor executor = {});
  Handle attach(ibv_srq* srq, EventFilter filter, Handler handler,
                Executor executor = {});
  Handle attach(ibv_wq* wq, EventFilter filter, Handler handler, Executor executor = {});
  // An object named by its number on `device` (core/event.h's ObjectNumber):
  // it hears the events that name it so (Event::object_number()), which a
  // source with no ibv_* address for the object makes; events that name the
  // object by address reach the handlers attached by address. A QueuePair
  // made with a handler is attached both ways. Throws std::invalid_argument
  // for a null device, a kind that is not an object's, an empty handler, or a
  // filter naming another kind's events or a port.
  Handle attach(ibv_context* device, ObjectNumber object, EventFilter filter, Handler handler,
                Executor executor = {});
  // Both at once: the object by its number on `device` and by `address`,
  // its ibv_* object (the ibv_qp* of a kQp number): one handler (one state)
  // under one Handle. A QueuePair made with a handler is attached so. Throws
  // as the two attach()es above do.
  Handle attach(ibv_context* device, ObjectNumber object, const void* address,
                EventFilter filter, Handler handler, Executor executor = {});

  // A device-wide listener, as ib_register_event_handler: every port and
  // device event of `device` (unknown codes included), or those `filter`
  // selects. Throws std::invalid_argument for a null device, an empty handler
  // or a filter naming object events.
  Handle listen(ibv_context* device, Handler handler);
  Handle listen(ibv_context* device, EventFilter filter, Handler handler,
                Executor executor = {});
  // For ibev's own listeners (DeviceClients hears a device's loss there):
  // runs on the delivering thread after every listener, once the event was
  // counted and, if no listener took it, offered to the unclaimed
  // observers; it neither claims nor counts the event. Its snapshot is
  // taken then, not at resolve.
  Handle listen_last(ibv_context* device, EventFilter filter, Handler handler);

  // Events no handler took. Runs on the delivering thread, like handlers.
  Handle on_unclaimed(Handler observer);

  // Throws std::invalid_argument for an event with no device.
  Delivery resolve(const Event& event) const;
  // Calls (or hands to their executors) the handlers resolved; returns how
  // many.
  std::size_t deliver(const Delivery& delivery);
  std::size_t route(const Event& event) { return deliver(resolve(event)); }

  // Counts `failure` for its device and hands it to the sink. Never throws.
  void report(const Failure& failure) noexcept;
  // From now on failures go to stderr: the sink's owner is gone (a
  // Dispatcher's destructor says so for the Registry it outlives in the
  // objects made through it).
  void detach_failure_sink() noexcept;

  CounterSnapshot counters(ibv_context* device) const;

  // `device` is closed: its listeners and the handlers attached by number on
  // it hear nothing more (their handles stay, inert) and its counters go, so
  // that a device opened later at the same address (a re-added one) starts
  // afresh. Events resolved before are still delivered.
  void forget(ibv_context* device) noexcept;

 private:
  Handle attach_object(const char* verb, const void* object, ElementKind kind,
                       EventFilter filter, Handler handler, Executor executor);
  // Either key may be empty, not both.
  Handle attach_keys(detail::ObjectKey address, detail::NumberKey number, EventFilter filter,
                     Handler handler, Executor executor);
  static void require_address(const char* verb, const void* object);
  static void require_number(const char* verb, ibv_context* device, ObjectNumber object);
  detail::NumberKey number_key(ibv_context* device, ObjectNumber object) const;
  static void require_object_filter(const char* verb, ElementKind kind,
                                    const EventFilter& filter);

  std::shared_ptr<detail::RegistryState> state_;
};

}  // namespace ibev

#endif  // IBEV_CORE_REGISTRY_H_
