// ibev::Registry: who hears which async event.
//
// The userspace counterpart of two kernel mechanisms: the `event_handler`
// given to ib_create_cq/qp/srq/wq (here: attach(), one or more handlers per
// object, keyed by its ibv_* address), and a device's `event_handler_list`
// fed by ib_register_event_handler (here: listen(), in registration order).
// Routing follows the kernel: an object event (CQ, QP, SRQ, WQ) reaches only
// that object's handlers; a port or device event reaches every matching
// listener of its device. An event nobody takes goes to the on_unclaimed()
// observers and is counted, never dropped silently.
//
// Routing is two steps. resolve() decides who hears the event, now; deliver()
// calls them, later. A dispatcher resolves, then acks the event to rdma-core
// (after which the object may be destroyed and its address reused), then
// delivers: an event resolved for address A reaches only handlers that were
// attached to A when it was resolved, never a newer object's.
//
// Thread safety: every member may be called from any thread, concurrently.
// Handlers run on the thread that calls deliver() (in ibev, the Dispatcher's),
// one event at a time per deliver() call; they may attach, release (even their
// own Attachment) and deliver. A handler that throws is reported to the
// on_handler_failure() observers and counted; delivery goes on.
//
// Lifetime: releasing an Attachment (or destroying it) on a thread that is not
// running its handler returns only when the handler is not running and never
// will again. From inside the handler itself it returns at once, and the
// handler is not called again. Attachments may outlive the Registry; nothing
// else may be in use (a call in progress on another thread) when it is
// destroyed.
#ifndef IBEV_CORE_REGISTRY_H_
#define IBEV_CORE_REGISTRY_H_

#include <infiniband/verbs.h>

#include <array>
#include <boost/signals2/connection.hpp>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include <ibev/core/event.h>
#include <ibev/core/event_filter.h>
#include <ibev/core/object_table.h>

namespace ibev {

using Handler = std::function<void(const Event&)>;
// Called with the event and the exception's what() when a handler throws.
using FailureHandler = std::function<void(const Event&, std::string_view)>;

namespace detail {
class CallGuard;
struct DeviceState;
struct ObjectSlot;
struct RegistryState;

// An object's handlers, immutable once published (resolve() copies it; attach
// and release publish a new one). One handler, by far the common case, is held
// without a list: routing then touches one allocation, not three.
struct HandlerSet {
  std::shared_ptr<ObjectSlot> only;
  std::shared_ptr<const std::vector<std::shared_ptr<ObjectSlot>>> several;
};
}  // namespace detail

// Owns one handler's place in a Registry. Move-only; destroying or releasing
// it detaches the handler (see the header comment for the wait rule).
class [[nodiscard]] Attachment {
 public:
  Attachment() noexcept;
  Attachment(Attachment&& other) noexcept;
  Attachment& operator=(Attachment&& other) noexcept;
  ~Attachment();

  void release() noexcept;
  bool attached() const noexcept;

 private:
  friend class Registry;
  Attachment(std::shared_ptr<detail::CallGuard> guard,
             std::weak_ptr<detail::RegistryState> registry,
             detail::ObjectKey key,
             boost::signals2::connection connection) noexcept;

  std::shared_ptr<detail::CallGuard> guard_;
  std::weak_ptr<detail::RegistryState> registry_;
  detail::ObjectKey key_{nullptr, ElementKind::kDevice};  // object handlers
  boost::signals2::scoped_connection connection_;         // signal slots
};

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
  detail::HandlerSet object_handlers_;
  std::shared_ptr<detail::DeviceState> device_;
  std::uint64_t listener_epoch_ = 0;
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

 private:
  friend class Registry;
  std::array<EventCounts, kTrackedCodes + 1> counts_{};
};

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Per-object handlers. `filter` may narrow to some of the object's event
  // types (no port). Throws std::invalid_argument for a null object, an empty
  // handler, or a filter naming another kind's events or a port.
  [[nodiscard]] Attachment attach(ibv_cq* cq, Handler handler,
                                  EventFilter filter = {});
  [[nodiscard]] Attachment attach(ibv_qp* qp, Handler handler,
                                  EventFilter filter = {});
  [[nodiscard]] Attachment attach(ibv_srq* srq, Handler handler,
                                  EventFilter filter = {});
  [[nodiscard]] Attachment attach(ibv_wq* wq, Handler handler,
                                  EventFilter filter = {});

  // A device-wide listener, as ib_register_event_handler: every port and
  // device event of `device` (unknown codes included), or those `filter`
  // selects. Throws std::invalid_argument for a null device, an empty handler
  // or a filter naming object events.
  [[nodiscard]] Attachment listen(ibv_context* device, Handler handler,
                                  EventFilter filter = {});

  // Observers: events no handler took, and handlers that threw. They run on
  // the delivering thread, like handlers, and follow the same release rule.
  [[nodiscard]] Attachment on_unclaimed(Handler observer);
  [[nodiscard]] Attachment on_handler_failure(FailureHandler observer);

  // Throws std::invalid_argument for an event with no device.
  Delivery resolve(const Event& event) const;
  // Calls the handlers resolved; returns how many ran.
  std::size_t deliver(const Delivery& delivery);
  std::size_t route(const Event& event) { return deliver(resolve(event)); }

  CounterSnapshot counters(ibv_context* device) const;

 private:
  Attachment attach_object(const char* verb, detail::ObjectKey key,
                           Handler handler, EventFilter filter);

  std::shared_ptr<detail::RegistryState> state_;
};

}  // namespace ibev

#endif  // IBEV_CORE_REGISTRY_H_
