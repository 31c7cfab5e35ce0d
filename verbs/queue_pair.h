// ibev::QueuePair: a QP created with its event handler, as the kernel's
// ib_create_qp with qp_init_attr.event_handler. The QP's async events (fatal,
// request/access errors, COMM_EST, SQ_DRAINED, path migration, last WQE) go
// to that handler, on the dispatching thread.
//
// close() (or destruction) detaches the handler (waiting for it unless on its
// thread), then destroys the QP. Its events are acked before they are
// delivered, so destroying it from inside its own handler does not block.
// Keeps its protection domain, CQs and SRQ alive; Device::close() reaches it.
//
// Posting work is plain verbs on get(), or post_send()/post_recv(), which
// add errors as exceptions and ThreadSanitizer's view of the device's
// happens-before edge.
//
// Draining, as the kernel's ib_drain_qp/ib_drain_sq/ib_drain_rq: the QP
// moves to ERR, a marker work request is posted on each queue drained, and
// drain returns when the marker's flush completion has come: then every
// work request posted before it has completed (flushed or not) and the CQ's
// handler has had those completions. The marker's completion is ibev's
// (Dispatcher::take_completion): the handler never sees it. A QP on an SRQ
// has no receive queue of its own: drain() waits for QP_LAST_WQE_REACHED
// instead, as the kernel's rules ask before destroying such a QP, with a
// timeout standing in for providers that never raise it (rxe on Linux 6.1;
// 6.12 raises it, repeatedly: the wait takes the first). With
// drain_on_destroy, dropping the last reference drains first, then destroys,
// without blocking (the dispatching thread finishes it).
//
// close() racing a drain on another thread: close() ends the drain with
// ECANCELED (the blocking forms throw it; drain_async's `done` gets it, on
// the closing thread), waits while the drain is inside its verbs (moving the
// QP to ERR, posting its markers) or polls a kPolled CQ for them, then
// destroys the QP. The markers of a
// cancelled drain are still taken until they come or its timeout passes, so
// the handler never sees them (a kPolled CQ is the exception: the drain
// stops polling it, and the application's own polling may find a marker,
// whose wr_id is none of its own). A drain started after close() throws
// ENODEV. Posting (post_send, post_recv, the
// plain verbs on get()) is not waited for: stop posting before closing, as
// with rdma-core's ibv_destroy_qp.
#ifndef IBEV_VERBS_QUEUE_PAIR_H_
#define IBEV_VERBS_QUEUE_PAIR_H_

#include <infiniband/verbs.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <system_error>
#include <optional>

#include <ibev/core/call_guard.h>
#include <ibev/core/registry.h>
#include <ibev/verbs/completion_queue.h>
#include <ibev/verbs/ownership.h>
#include <ibev/verbs/protection_domain.h>
#include <ibev/verbs/rc_endpoint.h>
#include <ibev/verbs/shared_receive_queue.h>

namespace ibev {

namespace detail {
inline constexpr char kDestroyQp[] = "ibv_destroy_qp";
enum class DrainedQueues : std::uint8_t { kBoth, kSend, kReceive };
}  // namespace detail

// The attributes real RC code sets on the way to RTS. The defaults are
// ibv_rc_pingpong's (and ibev's before this struct existed).
struct ConnectOptions {
  std::uint8_t port = 1;
  int gid_index = 0;  // the source GID, for RoCE and for a GRH on InfiniBand
  unsigned int access_flags =
      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  std::optional<ibv_mtu> path_mtu;  // unset: the port's active MTU
  std::uint8_t timeout = 14;        // local ACK timeout: 4.096 us << timeout
  std::uint8_t retry_cnt = 7;
  std::uint8_t rnr_retry = 7;       // 7 retries for ever
  std::uint8_t min_rnr_timer = 12;  // IB's encoding: 12 is 0.64 ms
  std::uint8_t max_rd_atomic = 1;       // RDMA reads/atomics in flight, as initiator
  std::uint8_t max_dest_rd_atomic = 1;  // ... as responder
  std::uint8_t service_level = 0;
  std::uint8_t traffic_class = 0;  // GRH
  std::uint8_t hop_limit = 1;      // GRH
  std::uint16_t pkey_index = 0;
};

struct QueuePairOptions {
  std::shared_ptr<CompletionQueue> send_cq;
  std::shared_ptr<CompletionQueue> recv_cq;
  std::shared_ptr<SharedReceiveQueue> srq;  // optional
  ibv_qp_type type = IBV_QPT_RC;
  ibv_qp_cap cap{16, 16, 1, 1, 0};
  bool signal_all = false;
  // The first PSN this QP sends with, as endpoint() advertises it and
  // connect() sets it (sq_psn). Unset: random in 24 bits, as ibv_rc_pingpong
  // picks it, so that a reconnected QP is not confused by stale packets. The
  // one place to choose it: an RcEndpoint is read-only (rc_endpoint.h).
  std::optional<std::uint32_t> psn;
  // Dropping the last reference drains the QP (drain()), then destroys it;
  // close() and Device::close() destroy at once.
  bool drain_on_destroy = false;
};

// Both times must be above zero (a drain refuses others with
// std::invalid_argument before it touches the QP): a drain given no time
// would move the QP to ERR only to time out.
struct DrainOptions {
  // How long each marker's flush completion may take.
  std::chrono::milliseconds timeout{5000};
  // A QP on an SRQ: how long QP_LAST_WQE_REACHED may take before the drain
  // goes on without it (DrainReport says which it was).
  std::chrono::milliseconds last_wqe_timeout{500};
  // A kPolled CQ's completions: drain polls such a CQ itself and hands every
  // completion but its marker here. Required when a drained queue's CQ is
  // kPolled.
  CompletionHandler polled;
};

struct DrainReport {
  bool send_drained = false;
  bool receive_drained = false;
  // A QP on an SRQ drained whole: whether QP_LAST_WQE_REACHED came (false:
  // its wait timed out, the provider never raised it).
  std::optional<bool> last_wqe_reached;
};

namespace detail {
// Throws std::invalid_argument, naming `verb` and the field, unless
// `options` is one a drain takes (DrainOptions).
void check_drain_options(const DrainOptions& options, const char* verb);

// What a QP keeps alive of what it was made on (QueuePairOptions's), and
// what a drain waits on: not the rest of its options, since a QueuePair is
// made per connection.
struct QueuePairParents {
  std::shared_ptr<CompletionQueue> send_cq;
  std::shared_ptr<CompletionQueue> recv_cq;
  std::shared_ptr<SharedReceiveQueue> srq;
};

// The three modify_qp steps of an RC connection: attributes and masks.
struct RcTransitions {
  ibv_qp_attr init{};
  int init_mask = 0;
  ibv_qp_attr rtr{};
  int rtr_mask = 0;
  ibv_qp_attr rts{};
  int rts_mask = 0;
};

// What connect() sets, from the local port and the options alone. RoCE ports
// always address by GRH; InfiniBand ports by LID, with a GRH only when the
// remote is in another subnet (its GID's prefix differs from `local_gid`'s).
// Throws std::invalid_argument for an InfiniBand remote without a LID.
RcTransitions rc_transitions(const RcEndpoint& remote, std::uint32_t own_psn,
                             const ibv_port_attr& port, const ibv_gid& local_gid,
                             const ConnectOptions& options);
}  // namespace detail

class QueuePair : public detail::Closeable {
 public:
  using Options = QueuePairOptions;

  // `on_event` (may be empty) hears the QP's async events, whether they name
  // it by address (rdma-core's) or by its QP number (core/event.h's
  // ObjectNumber: Dispatcher::inject, a DevX source). Throws
  // std::invalid_argument (null domain or CQ, objects of another device) or
  // std::system_error (ibv_create_qp).
  static std::shared_ptr<QueuePair> create(std::shared_ptr<ProtectionDomain> pd,
                                           Handler on_event, Options options);
  ~QueuePair() override;
  QueuePair(const QueuePair&) = delete;
  QueuePair& operator=(const QueuePair&) = delete;

  // Null once closed.
  ibv_qp* get() const noexcept { return qp_.get(); }
  std::uint32_t qp_num() const;
  const std::shared_ptr<Device>& device() const noexcept { return pd_->device(); }
  const std::shared_ptr<CompletionQueue>& send_cq() const noexcept { return parents_.send_cq; }
  const std::shared_ptr<CompletionQueue>& recv_cq() const noexcept { return parents_.recv_cq; }
  void close() noexcept override;

  // ibv_modify_qp; throws std::system_error naming `step` (ENODEV once
  // closed, as every call below).
  void modify(ibv_qp_attr& attr, int mask, const char* step = "ibv_modify_qp");

  // ibv_post_send / ibv_post_recv; throw std::system_error naming the verb
  // (`bad_wr` tells which request failed, as the verb does). The same as the
  // plain verbs on get(), and also tell ThreadSanitizer builds that what this
  // thread wrote before posting happens before the completion handler that
  // sees the completion: that edge runs through the device, where TSan
  // cannot see it.
  void post_send(ibv_send_wr& wr, ibv_send_wr** bad_wr = nullptr);
  void post_recv(ibv_recv_wr& wr, ibv_recv_wr** bad_wr = nullptr);

  // The first PSN this QP sends with (QueuePairOptions::psn).
  std::uint32_t psn() const noexcept { return psn_.load(std::memory_order_relaxed); }

  // This QP as an RC peer sees it: GID `gid_index` and LID of `port`, and
  // psn(), the PSN connect() will send with.
  RcEndpoint endpoint(std::uint8_t port = 1, int gid_index = 0) const;
  // RESET -> INIT with the options' port, P_Key index and access flags: the
  // QP takes receives from here on, so they can be posted before the peer's
  // endpoint arrives, as ibv_rc_pingpong does. Throws std::system_error
  // naming "ibv_modify_qp(INIT)".
  void to_init(const ConnectOptions& options = {});
  // RESET or INIT -> INIT -> RTR -> RTS, connected to `remote`: its PSN is
  // our rq_psn, psn() our sq_psn. From INIT (to_init(), or modify() with
  // IBV_QPS_INIT) the first step is INIT -> INIT, which sets the options'
  // port, P_Key index and access flags again; receives posted in INIT stay
  // posted. From any other state it fails with EINVAL. Throws
  // std::system_error naming the step ("ibv_modify_qp(RTR)") or
  // std::invalid_argument for a bad remote.
  void connect(const RcEndpoint& remote, const ConnectOptions& options = {});
  // Any state -> RESET, as a reconnection in place begins: whatever was
  // posted and not yet completed is gone without a completion (drain()
  // first to have them all completed), and psn() is drawn anew, at random
  // in 24 bits, so that packets of the old connection still in the fabric
  // are not taken for the new one's (an explicit QueuePairOptions::psn is
  // kept: the application chose it). Throws std::system_error naming
  // "ibv_modify_qp(RESET)".
  void reset();
  // RTS -> SQD: the send queue drains, then the device raises SQ_DRAINED
  // (wait for it with ibev::wait_for, armed before; dispatch/event_wait.h),
  // and resume_send_queue() (SQD -> RTS) sends again.
  void drain_send_queue();
  void resume_send_queue();

  // ib_drain_qp: both queues (a QP on an SRQ: its send queue, then
  // QP_LAST_WQE_REACHED); ib_drain_sq; ib_drain_rq (not for a QP on an SRQ).
  // Block until drained; the QP is in ERR after. Throw std::logic_error on
  // the dispatching thread of a drained CQ that is not kPolled (it delivers
  // the marker; drain_async works there), std::invalid_argument (a UD QP,
  // drain_receive on an SRQ's QP, a kPolled CQ without DrainOptions::polled,
  // a DrainOptions time not above zero),
  // std::system_error (ETIMEDOUT after DrainOptions::timeout; the failing
  // verb).
  DrainReport drain(const DrainOptions& options = {});
  DrainReport drain_send(const DrainOptions& options = {});
  DrainReport drain_receive(const DrainOptions& options = {});
  // drain() without blocking: `done` runs once, on the dispatching thread
  // (or the CQ's executor), with the report, or the error (ETIMEDOUT, ...)
  // as a non-empty error_code; ECANCELED on the thread that closed the QP
  // meanwhile. Throws what drain() throws before it starts.
  void drain_async(DrainOptions options,
                   std::function<void(const DrainReport&, std::error_code)> done);

 private:
  struct Token {};

 public:
  QueuePair(Token, std::shared_ptr<ProtectionDomain> pd, Options options, ibv_qp* qp);

 private:
  // The drains in progress, which close() ends; made by the first drain.
  struct Drains;
  std::shared_ptr<Drains> drains();
  void run_drain(const char* verb, detail::DrainedQueues queues, const DrainOptions& options,
                 std::function<void(const DrainReport&, std::error_code)> done);
  DrainReport drain_and_wait(const char* verb, detail::DrainedQueues queues,
                             const DrainOptions& options);

  std::shared_ptr<ProtectionDomain> pd_;
  const detail::QueuePairParents parents_;  // kept alive
  const bool psn_chosen_;                   // QueuePairOptions::psn was set
  const bool drain_on_destroy_;
  std::atomic<std::uint32_t> psn_;  // reset() draws a new one
  // Held by a drain while it is in its verbs: close() waits for it.
  detail::CallGuard drain_verbs_;
  std::shared_ptr<Drains> drains_;  // std::atomic_load/store: several threads
  detail::Owned<ibv_qp, ibv_destroy_qp, detail::kDestroyQp> qp_;
};

// Connects two RC QPs to each other (both on one device: loopback).
void connect_rc_pair(QueuePair& a, QueuePair& b, const ConnectOptions& options = {});

}  // namespace ibev

#endif  // IBEV_VERBS_QUEUE_PAIR_H_
