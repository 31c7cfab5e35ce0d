// ibev::QueuePair: a QP created with its event handler, as the kernel's
// ib_create_qp with qp_init_attr.event_handler. The QP's async events (fatal,
// request/access errors, COMM_EST, SQ_DRAINED, path migration, last WQE) go
// to that handler, on the dispatching thread.
//
// Destruction detaches the handler (waiting for it unless on its thread), then
// destroys the QP. Its events are acked before they are delivered, so
// destroying it from inside its own handler does not block. Keeps its
// protection domain, CQs and SRQ alive.
//
// Posting work is plain verbs on get(): ibev is an event layer.
#ifndef IBEV_VERBS_QUEUE_PAIR_H_
#define IBEV_VERBS_QUEUE_PAIR_H_

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>

#include <ibev/core/registry.h>
#include <ibev/verbs/completion_queue.h>
#include <ibev/verbs/ownership.h>
#include <ibev/verbs/protection_domain.h>
#include <ibev/verbs/shared_receive_queue.h>

namespace ibev {

namespace detail {
inline constexpr char kDestroyQp[] = "ibv_destroy_qp";
}  // namespace detail

// What a peer needs to reach an RC QP.
struct RcEndpoint {
  std::uint32_t qp_num;
  ibv_gid gid;
  std::uint32_t psn;
};

struct QueuePairOptions {
  std::shared_ptr<CompletionQueue> send_cq;
  std::shared_ptr<CompletionQueue> recv_cq;
  std::shared_ptr<SharedReceiveQueue> srq;  // optional
  ibv_qp_type type = IBV_QPT_RC;
  ibv_qp_cap cap{16, 16, 1, 1, 0};
  bool signal_all = false;
};

class QueuePair {
 public:
  using Options = QueuePairOptions;

  // Throws std::invalid_argument (null domain or CQ, objects of another
  // device) or std::system_error (ibv_create_qp).
  static std::shared_ptr<QueuePair> create(std::shared_ptr<ProtectionDomain> pd,
                                           Handler on_event, Options options);
  ~QueuePair();
  QueuePair(const QueuePair&) = delete;
  QueuePair& operator=(const QueuePair&) = delete;

  ibv_qp* get() const noexcept { return qp_.get(); }
  std::uint32_t qp_num() const noexcept { return qp_->qp_num; }

  // ibv_modify_qp; throws std::system_error naming `step`.
  void modify(ibv_qp_attr& attr, int mask, const char* step = "ibv_modify_qp");

  // This QP as an RC peer sees it (GID `gid_index` of `port`, PSN 0).
  RcEndpoint endpoint(std::uint8_t port = 1, int gid_index = 0) const;
  // RESET -> INIT -> RTR -> RTS, connected to `remote` over RoCE (GRH).
  void connect(const RcEndpoint& remote, std::uint8_t port = 1, int gid_index = 0);
  // RTS -> SQD: the send queue drains, then the device raises SQ_DRAINED.
  void drain_send_queue();

 private:
  struct Token {};

 public:
  QueuePair(Token, std::shared_ptr<ProtectionDomain> pd, Options options, ibv_qp* qp);

 private:
  std::shared_ptr<ProtectionDomain> pd_;
  Options parents_;  // the CQs and SRQ, kept alive
  detail::Owned<ibv_qp, ibv_destroy_qp, detail::kDestroyQp> qp_;
  Attachment events_;
};

// Connects two RC QPs to each other (both on one device: loopback).
void connect_rc_pair(QueuePair& a, QueuePair& b, std::uint8_t port = 1,
                     int gid_index = 0);

}  // namespace ibev

#endif  // IBEV_VERBS_QUEUE_PAIR_H_
