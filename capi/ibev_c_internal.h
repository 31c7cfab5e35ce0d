// The inside of the C API (<ibev/ibev_c.h>), shared by its rooms; private,
// never installed:
//   - ibev_c.cc: the boundary (the one translation of a C++ failure,
//     ibev_last_error()) and the events' way into C (ibev_event, handlers,
//     filters, the enums C mirrors);
//   - ibev_c_dispatch.cc: the dispatcher, registrations and waits (what
//     dispatch/ is in C++);
//   - ibev_c_verbs.cc: devices, their clients and what is made on them
//     (what verbs/ is in C++), and their metrics;
//   - ibev_c_health.cc: a connection's health and its recovery attempts
//     (verbs/connection_health.h);
//   - ibev_c_cm.cc: the connection manager: CM ids (cm/cm_id.h) and
//     sessions through it (cm/cm_session.h);
//   - ibev_c_replay.cc: a recording played into a dispatcher
//     (dispatch/replay.h), its ibev_replay private to it.
// Each ibev_* object is a struct holding one reference to the C++ object
// (or the C++ object itself, for what C++ does not share), and each function
// is its C++ counterpart inside api_call(), the one place where what C++
// throws becomes an errno value and ibev_last_error()'s text. Handlers given
// as a function and a context become the C++ handlers, which run inside
// ibev's own reported calls: what a handler throws (a C++ function passed as
// a C one) is a failure record there, never an exception here.
#ifndef IBEV_CAPI_IBEV_C_INTERNAL_H_
#define IBEV_CAPI_IBEV_C_INTERNAL_H_

#include <ibev/ibev_c.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include <ibev/cm/cm_id.h>
#include <ibev/cm/cm_session.h>
#include <ibev/core/event.h>
#include <ibev/core/event_filter.h>
#include <ibev/core/failure.h>
#include <ibev/core/handle.h>
#include <ibev/core/thread_annotations.h>
#include <ibev/dispatch/dispatcher.h>
#include <ibev/dispatch/event_wait.h>
#include <ibev/dispatch/worker_thread.h>
#include <ibev/verbs/connection_health.h>
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
struct ibev_worker {
  explicit ibev_worker(ibev::FailureSink on_failure) : worker(std::move(on_failure)) {}
  ibev::WorkerThread worker;
};
struct ibev_health : Shared<ibev::ConnectionHealth> {};
// Copies of a RecoveryAttempt share it: each ibev_recovery_attempt is one.
struct ibev_recovery_attempt {
  ibev::RecoveryAttempt attempt;
};
struct ibev_cm_channel : Shared<ibev::CmEventChannel> {};
// A CM id: the application's (`owned`: from ibev_cm_id_create() or a
// CONNECT_REQUEST), or lent to a make_qp function for its call (`owned`
// null: the session's id, which only the queries and init_qp take).
struct ibev_cm_id {
  explicit ibev_cm_id(ibev::CmId* lent) : id(lent) {}
  ibev::CmId* id;
  std::shared_ptr<ibev::CmId> owned;
  // device_name()'s text once known: an id binds to one device, so the
  // pointer handed out stays valid while the id is.
  mutable ibev::detail::Mutex mutex;
  mutable std::string device_name IBEV_GUARDED_BY(mutex);
};
// The session, and its health lent as an ibev_health (an alias of the
// session's reference: the health lives as long as the session).
struct ibev_cm_session {
  std::shared_ptr<ibev::CmSession> session;
  ibev_health health;
};
struct ibev_cm_acceptor : Shared<ibev::CmAcceptor> {};

// Internal (ibev::detail is not exported; cmake/libibev.map.in), and out of
// the global namespace a program linking libibev.a has to itself.
namespace ibev {
namespace detail {
namespace capi {

// ibev_element_kind, in ibev::kElementKinds' order: a kind added there does
// not compile until ibev_c.h has its enumerator and this list has it too
// (ibev_c.cc's static_asserts).
inline constexpr ibev_element_kind kCElementKinds[] = {IBEV_ELEMENT_CQ,   IBEV_ELEMENT_QP,
                                                       IBEV_ELEMENT_SRQ,  IBEV_ELEMENT_WQ,
                                                       IBEV_ELEMENT_PORT, IBEV_ELEMENT_DEVICE};

// The one translation of a C++ failure: an errno value, and the thread's
// last error naming the C function and what C++ said (ibev_c.cc).
int failed(const char* api, const char* what, int error) noexcept;

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

// A text written into a C caller's buffer as snprintf writes: at most
// `size` - 1 characters and a NUL; `length` (if not NULL) gets its whole
// length. std::invalid_argument for a NULL buffer with a size above 0.
inline void write_text(const std::string& text, char* buffer, size_t size, size_t* length) {
  if (size > 0 && buffer == nullptr) throw std::invalid_argument("buffer is NULL");
  if (length != nullptr) *length = text.size();
  if (size == 0) return;
  const size_t copied = std::min(text.size(), size - 1);
  std::copy_n(text.data(), copied, buffer);
  buffer[copied] = '\0';
}

// The events' way into C (ibev_c.cc).
ibev_event to_c(const ibev::Event& event) noexcept;
ibev::Handler event_handler(ibev_event_fn handler, void* context);
ibev::EventFilter to_filter(const ibev_filter* filter);

// What the rooms share (ibev_c_dispatch.cc, ibev_c_verbs.cc): a C failure
// function as a FailureSink; an RC endpoint and connect attributes both ways.
ibev::FailureSink failure_sink(ibev_failure_fn sink, void* context);
ibev_rc_endpoint to_c(const ibev::RcEndpoint& endpoint) noexcept;
ibev::RcEndpoint from_c(const ibev_rc_endpoint& endpoint);
ibev::ConnectOptions connect_options(const ibev_connect_attr* attr);

// A health's way into C and back (ibev_c_health.cc), shared with the CM
// sessions' (ibev_c_cm.cc): a cause's `what` is the C++ one's, valid while
// it is.
ibev_health_cause to_c(const ibev::HealthCause& cause) noexcept;
ibev::HealthCause from_c(const ibev_health_cause* cause);
ibev_health_change to_c(const ibev::HealthChange& change) noexcept;
ibev::HealthHandler health_handler(ibev_health_fn handler, void* context);
ibev::ConnectionHealth::Options health_options(const ibev_health_attr& attr);

}  // namespace capi
}  // namespace detail
}  // namespace ibev

#endif  // IBEV_CAPI_IBEV_C_INTERNAL_H_
