// ibev::CmSession and ibev::CmAcceptor: a session, one logical RC
// connection through the CM that outlives its QPs (as an iSER or SRP
// session outlives its connections). Its health
// (verbs/connection_health.h) is one signal from the first connect to the
// end; when it goes down, its recovery (Mode::kReconnect) drains the QP and
// the connection is made again through the CM, on a new id and a new QP, on
// whatever device reaches the peer now (the old device removed, the peer
// restarted): as NVMe-oF's host tears its queues down and reconnects them,
// with the backoff, damping window and give_up_after of health/recovery.h
// instead of a fixed reconnect_delay.
//
// The active side, CmSession::connect, resolves, connects and, once the CM
// says ESTABLISHED, is up; its first connect is its first attempt, so a
// peer not there yet is retried as a lost one is. Every request carries the
// session's id (a nonzero 64-bit number of the application's) ahead of the
// application's private data. The passive side, a CmAcceptor, knows a
// reconnecting peer by that id and takes it as the same session (its
// health, its handler): a server keeps one session per peer, not one more
// half-dead connection per reconnect. A request naming a session that is up
// means the peer lost its side: the session goes down (cause kCmEvent,
// CONNECT_REQUEST) and accepts it as its next attempt. A request naming no
// live session (new, failed, closed) makes a new one; one without an id is
// rejected ("ibev: no session id").
//
// What is a cause, beside what ConnectionHealth hears itself: DISCONNECTED
// (answered with a disconnect, as rping does), DEVICE_REMOVAL (the id is
// closed there, so the device can go), REJECTED, UNREACHABLE, CONNECT_ERROR,
// TIMEWAIT_EXIT; during an attempt these and ADDR_ERROR / ROUTE_ERROR fail
// the attempt.
//
// The peer gone: its id destroyed (closed, or its process ended) is
// DISCONNECTED if the connection was established on its side, and REJECTED
// with status 28 (consumer defined: its CM rejects a connection it never
// saw established) if it went before, between its REP and the RTU reaching
// it, which the active side, up as soon as it sends the RTU, may hear
// while up. A session that is up hears either as one down, and recovers
// alike: attempts until the peer is back, or past give_up_after failed,
// with one failure record. A peer that goes before accepting is REJECTED
// (status 28) too: the attempt fails.
//
// Each attempt asks the application for its QP (MakeQp): the
// QP of that attempt's device, receives posted; the requests the last QP
// did not deliver are the attempt's undelivered(), to send again or not.
//
// Threads: the health handler runs as ConnectionHealth's (its Options'
// executor, else the dispatching thread), MakeQp on the CM's dispatching
// thread or the health's; every member may be called from any thread.
//
// Lifetime: close() (or destruction) closes the health (its handler waited
// for as core/handle.h says), then disconnects and closes the id; the QP is
// let go. A CmAcceptor's sessions are the application's to keep: one it
// drops is closed. Closing one side hangs up the other, and a live client
// then connects again: an acceptor still listening hands it over as a new
// session (OnSession runs until CmAcceptor::close() returns). To end both
// sides, close the acceptor, then the client, then the server's sessions.
// The channel's Dispatcher must outlive them all.
#ifndef IBEV_CM_CM_SESSION_H_
#define IBEV_CM_CM_SESSION_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <ibev/cm/cm_id.h>
#include <ibev/health/health.h>
#include <ibev/verbs/connection_health.h>

namespace ibev {

namespace detail {
struct CmLink;  // cm_session.cc
struct CmAcceptorState;
}  // namespace detail

// The QP for one attempt of a connection: an RC QP on `id`'s device
// (id.device_name()), its CQs served by the channel's Dispatcher. Take it to
// INIT with id.init_qp() and post its receives before returning it. Throw
// to fail the attempt. The device may not be the last attempt's: after a
// removal and re-add, the old ibev Device is lost with all made on it, and
// MakeQp opens the new one (Device::open by id.device_name()) and makes its
// protection domain, memory regions and CQs there. The QP carries traffic
// before the session runs on it (queue_pair() names it, and the health's
// completion() hears it, from ESTABLISHED on): accepted, it is in RTS and
// receives the peer's sends from the REP on, until ESTABLISHED, or, its RTU
// lost, until the attempt times out. Give it back its receives as they
// complete there too: the peer's sends to a QP short of receives meet RNR
// NAKs, each retried only after the RNR timer rdma_cm sets (655 ms), and
// wait for ever once none is left.
using MakeQp =
    std::function<std::shared_ptr<QueuePair>(CmId& id, const RecoveryAttempt& attempt)>;

class CmSession {
 public:
  // A connect request's private data on RoCE and IB (rdma_connect's
  // limit), and how much of it is the session's header ("ibev", a version,
  // the 8-byte id): the application's own follows it.
  static constexpr std::size_t kRequestDataBytes = 56;
  static constexpr std::size_t kHeaderBytes = 16;

  struct Options {
    std::uint64_t id = 0;  // nonzero: how the acceptor knows this session
    MakeQp make_qp;
    // private_data: the application's, after the session's id (40 bytes at
    // most).
    CmConnectOptions connect;
    // Keepalive, deadline, executor, and recovery.policy; its mode, its
    // reconnect and the initial state are the CmSession's.
    ConnectionHealth::Options health;
    std::optional<CmAddress> source;
    // Each of rdma_resolve_addr and rdma_resolve_route.
    std::chrono::milliseconds resolve_timeout{2000};
    // An attempt's time from its new id to ESTABLISHED: past it, the
    // attempt failed and the id goes. (The CM retries a lost REQ or REP
    // for about a minute, and a peer's CM may drop a REQ it took for a
    // duplicate of one it could not answer: a new attempt sends a new one.)
    std::chrono::milliseconds connect_timeout{5000};
  };

  // The active side: connects to `destination`, down until ESTABLISHED.
  // Throws std::invalid_argument (null channel, empty handler or MakeQp, id
  // 0, a timeout not above 0, private data past 40 bytes, or what
  // ConnectionHealth::create refuses).
  static std::shared_ptr<CmSession> connect(std::shared_ptr<CmEventChannel> channel,
                                               const CmAddress& destination,
                                               HealthHandler on_change, Options options);
  ~CmSession();
  CmSession(const CmSession&) = delete;
  CmSession& operator=(const CmSession&) = delete;

  std::uint64_t id() const noexcept;
  // Its state and causes; completion() and post_send() go through it.
  ConnectionHealth& health() const noexcept { return *health_; }
  // The QP it runs on now: the latest an attempt brought (during an outage,
  // the one that went down; null before the first).
  std::shared_ptr<QueuePair> queue_pair() const { return health_->queue_pair(); }
  void close() noexcept;

 private:
  friend struct detail::CmAcceptorState;
  struct Token {};

 public:
  CmSession(Token, std::shared_ptr<detail::CmLink> link,
               std::shared_ptr<ConnectionHealth> health);

 private:
  const std::shared_ptr<detail::CmLink> link_;
  const std::shared_ptr<ConnectionHealth> health_;
};

// A CM listener whose requests are sessions (CmSession's passive side).
// Thread-safe; its callbacks run on the dispatching thread.
class CmAcceptor {
 public:
  // A session new to this acceptor, not up yet (its first attempt is
  // accepting the request): keep it, or it is closed and the peer rejected.
  using OnSession = std::function<void(const std::shared_ptr<CmSession>& session)>;
  // A change of the session with this id (the health handler of every
  // session of this acceptor).
  using OnChange = std::function<void(std::uint64_t id, const HealthChange& change)>;

  struct Options {
    MakeQp make_qp;
    CmConnectOptions accept;  // the reply's; private_data the application's
    // Every session's: recovery.policy says how long one waits for its peer
    // to come back (give_up_after) before it fails.
    ConnectionHealth::Options health;
    int backlog = 64;
    // An attempt's time from accepting a request to ESTABLISHED (a lost
    // RTU): past it, the attempt failed, and a newer request is taken.
    std::chrono::milliseconds connect_timeout{5000};
  };

  // rdma_listen on `address` (port 0: any; local_address() tells). Throws
  // std::invalid_argument (null channel, an empty callback or MakeQp, a
  // timeout not above 0) or what CmId::listen throws.
  static std::shared_ptr<CmAcceptor> listen(std::shared_ptr<CmEventChannel> channel,
                                            const CmAddress& address, OnSession on_session,
                                            OnChange on_change, Options options);
  ~CmAcceptor();
  CmAcceptor(const CmAcceptor&) = delete;
  CmAcceptor& operator=(const CmAcceptor&) = delete;

  CmAddress local_address() const;
  // Sessions the acceptor knows by id: neither failed nor closed.
  std::size_t sessions() const;
  // Stops listening; the sessions go on (each is its keeper's).
  void close() noexcept;

 private:
  struct Token {};

 public:
  CmAcceptor(Token, std::shared_ptr<detail::CmAcceptorState> state, std::shared_ptr<CmId> listener);

 private:
  const std::shared_ptr<detail::CmAcceptorState> state_;
  std::shared_ptr<CmId> listener_;
};

}  // namespace ibev

#endif  // IBEV_CM_CM_SESSION_H_
