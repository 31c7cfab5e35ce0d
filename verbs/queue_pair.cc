#include <ibev/verbs/queue_pair.h>

#include <cerrno>
#include <stdexcept>
#include <utility>

namespace ibev {

std::shared_ptr<QueuePair> QueuePair::create(std::shared_ptr<ProtectionDomain> pd,
                                             Handler on_event, Options options) {
  if (!pd || !options.send_cq || !options.recv_cq) {
    throw std::invalid_argument(
        "QueuePair::create: needs a domain, a send CQ and a receive CQ");
  }
  const auto& device = pd->device();
  if (options.send_cq->device() != device || options.recv_cq->device() != device ||
      (options.srq && options.srq->pd()->device() != device)) {
    throw std::invalid_argument(
        "QueuePair::create: the CQs and SRQ must be on the domain's device");
  }
  ibv_qp_init_attr init{};
  init.send_cq = options.send_cq->get();
  init.recv_cq = options.recv_cq->get();
  init.srq = options.srq ? options.srq->get() : nullptr;
  init.qp_type = options.type;
  init.cap = options.cap;
  init.sq_sig_all = options.signal_all ? 1 : 0;
  ibv_qp* qp = ibv_create_qp(pd->get(), &init);
  if (qp == nullptr) detail::throw_verb_error("ibv_create_qp", errno);
  auto queue_pair = std::make_shared<QueuePair>(Token{}, pd, std::move(options), qp);
  if (on_event) {
    queue_pair->events_ = device->registry().attach(qp, std::move(on_event));
  }
  return queue_pair;
}

QueuePair::QueuePair(Token, std::shared_ptr<ProtectionDomain> pd, Options options,
                     ibv_qp* qp)
    : pd_(std::move(pd)), parents_(std::move(options)), qp_(qp) {}

QueuePair::~QueuePair() {
  events_.release();
  qp_.reset();
}

void QueuePair::modify(ibv_qp_attr& attr, int mask, const char* step) {
  // ibv_modify_qp returns the errno value itself.
  if (const int rc = ibv_modify_qp(qp_.get(), &attr, mask); rc != 0) {
    detail::throw_verb_error(step, rc);
  }
}

RcEndpoint QueuePair::endpoint(std::uint8_t port, int gid_index) const {
  return {qp_num(), pd_->device()->query_gid(port, gid_index), 0};
}

void QueuePair::connect(const RcEndpoint& remote, std::uint8_t port, int gid_index) {
  const ibv_port_attr port_attr = pd_->device()->query_port(port);

  ibv_qp_attr init{};
  init.qp_state = IBV_QPS_INIT;
  init.port_num = port;
  init.pkey_index = 0;
  init.qp_access_flags =
      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  modify(init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
         "ibv_modify_qp(INIT)");

  ibv_qp_attr rtr{};
  rtr.qp_state = IBV_QPS_RTR;
  rtr.path_mtu = port_attr.active_mtu;
  rtr.dest_qp_num = remote.qp_num;
  rtr.rq_psn = remote.psn;
  rtr.max_dest_rd_atomic = 1;
  rtr.min_rnr_timer = 12;
  rtr.ah_attr.is_global = 1;
  rtr.ah_attr.grh.dgid = remote.gid;
  rtr.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(gid_index);
  rtr.ah_attr.grh.hop_limit = 1;
  rtr.ah_attr.port_num = port;
  modify(rtr,
         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
             IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
         "ibv_modify_qp(RTR)");

  ibv_qp_attr rts{};
  rts.qp_state = IBV_QPS_RTS;
  rts.timeout = 14;
  rts.retry_cnt = 7;
  rts.rnr_retry = 7;
  rts.sq_psn = 0;
  rts.max_rd_atomic = 1;
  modify(rts,
         IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
             IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
         "ibv_modify_qp(RTS)");
}

void QueuePair::drain_send_queue() {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_SQD;
  attr.en_sqd_async_notify = 1;
  modify(attr, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY, "ibv_modify_qp(SQD)");
}

void connect_rc_pair(QueuePair& a, QueuePair& b, std::uint8_t port, int gid_index) {
  const RcEndpoint a_end = a.endpoint(port, gid_index);
  const RcEndpoint b_end = b.endpoint(port, gid_index);
  a.connect(b_end, port, gid_index);
  b.connect(a_end, port, gid_index);
}

}  // namespace ibev
