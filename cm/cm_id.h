// ibev::CmId and ibev::CmEventChannel: the RDMA connection manager with its
// event handler given at creation, as the kernel's rdma_create_id(net,
// event_handler, context, ps, qp_type), served by the same Dispatcher as
// every async fd and completion channel.
//
// The event path is the one of async events (dispatch/dispatcher.h): the
// channel's fd is non-blocking in the Dispatcher's loop; each event is read
// (rdma_get_cm_event), resolved to the id that hears it, copied (private
// data, connection parameters), acked (rdma_ack_cm_event), and only then
// delivered. rdma_destroy_id waits until every event reported on its id is
// acked, and ibev never holds one across a handler: so closing an id, from
// its own handler or any thread, never waits for the dispatcher, and an
// event read for a closed id is dropped (counted: CmStats::unrouted), never
// delivered to a newer id at the same address.
//
// Who hears what (cm/cm_event_type.h): an id's handler hears the events
// naming it. A listener's handler hears CONNECT_REQUEST with the new id
// already made (CmEvent::new_id): as in the kernel, the new id reports to
// the listener's handler (and executor) from then on, unless reroute() gives
// it a handler of its own. Keep new_id to go on with the connection
// (accept() or reject()); dropping it destroys the id, and the kernel
// rejects the request.
//
// QPs. A connection's QP is an ibev QueuePair made by the application on an
// ibev Device for the id's device (device_name(), known once the address is
// resolved, or on CONNECT_REQUEST), so its async events, completions, drain
// and device lifecycle are those of every other QP. ibev moves it through
// the CM's states as librdmacm moves a QP of rdma_create_qp: init_qp() or
// connect() takes it to INIT; on CONNECT_RESPONSE ibev takes it to RTR and
// RTS and sends the RTU (rdma_establish), and the handler hears ESTABLISHED
// (or CONNECT_ERROR with the failing step's errno); accept() takes it to RTS
// before it replies; REJECTED and disconnect() move it to ERR. Draining and
// destroying it after DISCONNECTED is the application's, as in the kernel.
//
// Threads. Handlers run on the dispatching thread unless the id was made
// with an Executor. An id's calls (connect, accept, ...) may be made from
// any thread, while its events arrive too: a channel's librdmacm calls are
// made one at a time (librdmacm is not safe otherwise; cm/cm_id.cc).
//
// Lifetime. close() (or destruction of the last reference) stops the
// handler, with the wait rule of core/handle.h, then destroys the id; the
// QP it was given is not destroyed, only let go. Ids keep their channel
// alive; the Dispatcher must outlive both.
//
// Device removal. Every id on a removed device hears DEVICE_REMOVAL; close
// it there (with what it holds), as a kernel ULP destroys its ids. librdmacm
// keeps a context of its own open on each device its ids use, which holds
// up the kernel's delete like any open context: ibev has librdmacm let a
// removed device's context go once its last id is closed (and when the
// Dispatcher's device monitor sees a device go), so the delete completes.
// The ibev Device of that device is lost as docs/design.md says.
#ifndef IBEV_CM_CM_ID_H_
#define IBEV_CM_CM_ID_H_

#include <rdma/rdma_cma.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <ibev/cm/cm_event_type.h>
#include <ibev/core/executor.h>
#include <ibev/core/handle.h>
#include <ibev/core/stats.h>
#include <ibev/core/thread_annotations.h>
#include <ibev/dispatch/dispatcher.h>
#include <ibev/verbs/queue_pair.h>

namespace ibev {

class CmId;

// An IPv4 or IPv6 socket address for the CM, from a numeric host.
struct CmAddress {
  // Throws std::invalid_argument for a host that is not a numeric address.
  static CmAddress parse(const std::string& host, std::uint16_t port);
  const sockaddr* get() const noexcept { return reinterpret_cast<const sockaddr*>(&storage); }
  std::uint16_t port() const noexcept;
  std::string to_string() const;  // "10.0.0.1:7471", "[fd00::1]:7471"

  sockaddr_storage storage{};
};

// rdma_conn_param as an event carries it: the peer's side of the connection.
struct CmConnection {
  std::uint8_t responder_resources = 0;
  std::uint8_t initiator_depth = 0;
  std::uint8_t flow_control = 0;
  std::uint8_t retry_count = 0;
  std::uint8_t rnr_retry_count = 0;
  bool srq = false;
  std::uint32_t qp_num = 0;
};

// One CM event, copied out of the rdma_cm_event before it was acked.
struct CmEvent {
  int code = 0;  // rdma_cm_event_type; codes not in kCmEventTypes are kept
  // 0, or a negative errno (ADDR_ERROR, UNREACHABLE, CONNECT_ERROR, ...), or
  // for REJECTED the CM's reject reason (28: the consumer rejected).
  int status = 0;
  CmId* id = nullptr;            // who hears it (for CONNECT_REQUEST, the listener)
  std::shared_ptr<CmId> new_id;  // CONNECT_REQUEST only: keep it, or it rejects
  std::vector<std::uint8_t> private_data;
  CmConnection connection;  // for the payloads kConnection and kRejection

  // nullptr for a code this build does not know.
  const CmEventTypeInfo* info() const noexcept { return find_cm_event_type(code); }
  std::string name() const { return describe_cm_event_code(code); }
};

using CmHandler = std::function<void(const CmEvent& event)>;

// What connect() and accept() send (rdma_conn_param). Unset depths are
// librdmacm's defaults: the device's maximum, or on accept() the least of
// the peer's request and the device's maximum.
struct CmConnectOptions {
  std::vector<std::uint8_t> private_data;  // REQ: 56 bytes at most; REP: 196
  std::optional<std::uint8_t> responder_resources;
  std::optional<std::uint8_t> initiator_depth;
  std::uint8_t retry_count = 7;
  std::uint8_t rnr_retry_count = 7;  // 7: for ever
};

// events: read and acked; unrouted: for an id closed in the meantime;
// connect_requests: CONNECT_REQUESTs read; requests_refused: those whose
// listener was closed (their new id destroyed, so the peer is rejected).
#define IBEV_CM_STATS(X) X(events) X(unrouted) X(connect_requests) X(requests_refused)
IBEV_DECLARE_STATS(CmStats, IBEV_CM_STATS);

namespace detail {
struct CmChannelState;
struct CmIdState;
}  // namespace detail

// An rdma_event_channel served by a Dispatcher. Thread-safe.
class CmEventChannel {
 public:
  struct Options {
    unsigned batch = 16;  // events read per turn
  };
  // Throws std::system_error (rdma_create_event_channel: ENODEV without
  // rdma_cm in the kernel; fcntl; the Dispatcher's epoll_ctl) or
  // std::invalid_argument (batch 0).
  static std::shared_ptr<CmEventChannel> create(Dispatcher& dispatcher, Options options);
  static std::shared_ptr<CmEventChannel> create(Dispatcher& dispatcher) {
    return create(dispatcher, Options{});
  }
  // Stops serving the channel (waiting for the dispatcher unless on its
  // thread); the channel itself goes when the last of its ids does.
  ~CmEventChannel();
  CmEventChannel(const CmEventChannel&) = delete;
  CmEventChannel& operator=(const CmEventChannel&) = delete;

  rdma_event_channel* get() const noexcept;
  Dispatcher& dispatcher() const noexcept { return dispatcher_; }
  CmStats stats() const noexcept;

 private:
  friend class CmId;
  struct Token {};

 public:
  CmEventChannel(Token, Dispatcher& dispatcher, std::shared_ptr<detail::CmChannelState> state);

 private:
  Dispatcher& dispatcher_;
  std::shared_ptr<detail::CmChannelState> state_;
  Handle served_;
  Handle devices_watched_;  // removed devices: librdmacm's contexts let go
};

class CmId {
 public:
  struct Options {
    // RDMA_PS_TCP: reliable connections (RC QPs). Others may be made and
    // resolved; connect() and accept() take RC QPs only.
    rdma_port_space port_space = RDMA_PS_TCP;
    Executor executor;  // where the handler runs; empty: the dispatching thread
  };

  // rdma_create_id on `channel`. Throws std::invalid_argument (null channel,
  // empty handler) or std::system_error (rdma_create_id).
  static std::shared_ptr<CmId> create(std::shared_ptr<CmEventChannel> channel, CmHandler handler,
                                      Options options);
  static std::shared_ptr<CmId> create(std::shared_ptr<CmEventChannel> channel, CmHandler handler) {
    return create(std::move(channel), std::move(handler), Options{});
  }
  ~CmId();
  CmId(const CmId&) = delete;
  CmId& operator=(const CmId&) = delete;

  // Null once closed.
  rdma_cm_id* get() const noexcept;
  void close() noexcept;

  // The id's events go to `handler` (on `executor`; empty: the dispatching
  // thread) from now on: each to the handler that was the id's when it was
  // read, never to both. The old one is released with the wait rule of
  // core/handle.h, so an event read for it but not run yet (queued on its
  // executor, or read on the dispatching thread while this runs on another)
  // is dropped, as a released handler's is; rerouted from a handler on the
  // dispatching thread, an id whose old handler has no executor has none
  // (so CmAcceptor gives a request's new id to its session). A reroute()
  // and a close() made by two calls of the id's handlers running at once
  // (an executor that runs calls in parallel) wait for each other, as two
  // handlers releasing each other's handles do. Throws
  // std::invalid_argument (empty handler) or std::system_error (ENODEV once
  // closed).
  void reroute(CmHandler handler, Executor executor = {});

  // Every call below throws std::system_error naming the librdmacm call and
  // its errno (ENODEV once closed), or std::invalid_argument for bad input.

  // ADDR_RESOLVED (or ADDR_ERROR) follows; `source` may be null.
  void resolve_addr(const CmAddress* source, const CmAddress& destination,
                    std::chrono::milliseconds timeout);
  // ROUTE_RESOLVED (or ROUTE_ERROR) follows.
  void resolve_route(std::chrono::milliseconds timeout);
  // rdma_bind_addr, then rdma_listen: CONNECT_REQUESTs follow. Port 0 binds
  // any free port: local_address() tells which.
  void listen(const CmAddress& address, int backlog);
  // RESET -> INIT with the attributes the CM gives `qp` (RC, on the id's
  // device), as rdma_create_qp leaves its QP: receives may be posted from
  // now on, before connect() or accept() (which take a QP to INIT
  // themselves if it is not).
  void init_qp(QueuePair& qp);
  // Sends the connection request for `qp`. ESTABLISHED (QP in RTS),
  // REJECTED, UNREACHABLE or CONNECT_ERROR follows.
  void connect(std::shared_ptr<QueuePair> qp, const CmConnectOptions& options = {});
  // On a new id from CONNECT_REQUEST: takes `qp` to RTS and replies;
  // ESTABLISHED follows when the peer's RTU comes.
  void accept(std::shared_ptr<QueuePair> qp, const CmConnectOptions& options = {});
  // On a new id from CONNECT_REQUEST: the peer hears REJECTED with this.
  void reject(const std::vector<std::uint8_t>& private_data = {});
  // Moves the QP to ERR and sends the disconnect (DREQ): the peer hears
  // DISCONNECTED and calls disconnect() too, which answers (DREP); then this
  // side hears DISCONNECTED, and both TIMEWAIT_EXIT. A side that does not
  // answer leaves the other waiting for the DREQ's timeout, as in the
  // kernel: call disconnect() on DISCONNECTED, as rping does.
  void disconnect();

  // The RDMA device the id is bound to ("rxe0"); empty before that.
  std::string device_name() const;
  std::uint8_t port_num() const;
  CmAddress local_address() const;
  CmAddress peer_address() const;
  // The QP given to connect() or accept(); null before.
  std::shared_ptr<QueuePair> queue_pair() const;
  const std::shared_ptr<CmEventChannel>& channel() const noexcept { return channel_; }

 private:
  struct Token {};
  friend struct detail::CmChannelState;
  // The id for one librdmacm call, with its channel's call lock held (see
  // cm/cm_id.cc); std::system_error(ENODEV) naming `verb` once closed.
  struct Locked {
    std::unique_lock<detail::Mutex> lock;
    rdma_cm_id* id;
  };
  Locked lock_id(const char* verb) const;
  // A route to `handler`, subscribed in the channel's table of ids.
  Handle route_to(CmHandler handler, Executor executor);

 public:
  CmId(Token, std::shared_ptr<CmEventChannel> channel, rdma_cm_id* id, CmHandler handler,
       Executor executor);

 private:
  const std::shared_ptr<CmEventChannel> channel_;
  const std::shared_ptr<detail::CmIdState> state_;  // what its routes share
  std::atomic<bool> closing_{false};  // the first close() does it; others wait
  detail::Mutex close_mutex_;
  std::condition_variable closed_changed_;
  bool closed_ IBEV_GUARDED_BY(close_mutex_) = false;  // the first close() is done
  // Its route in the channel's table of ids: replaced by reroute(), released
  // by the first close().
  Handle routed_ IBEV_GUARDED_BY(close_mutex_);
};

}  // namespace ibev

#endif  // IBEV_CM_CM_ID_H_
