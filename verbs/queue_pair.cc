#include <ibev/verbs/queue_pair.h>

#include <ibev/core/happens_before.h>

#include <cerrno>
#include <random>
#include <string>
#include <stdexcept>
#include <utility>

namespace ibev {

namespace {

constexpr std::uint32_t kPsnMask = 0xffffff;  // PSNs are 24 bits

std::uint32_t random_psn() {
  thread_local std::mt19937 engine{std::random_device{}()};
  return std::uniform_int_distribution<std::uint32_t>(0, kPsnMask)(engine);
}

void require_psn(const char* what, std::uint32_t psn) {
  if (psn > kPsnMask) {
    throw std::invalid_argument(std::string(what) + ": a PSN has 24 bits, got " +
                                std::to_string(psn));
  }
}

}  // namespace

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
  if (options.psn) require_psn("QueuePair::create", *options.psn);
  ibv_qp_init_attr init{};
  init.send_cq = options.send_cq->get();
  init.recv_cq = options.recv_cq->get();
  init.srq = options.srq ? options.srq->get() : nullptr;
  init.qp_type = options.type;
  init.cap = options.cap;
  init.sq_sig_all = options.signal_all ? 1 : 0;
  if (init.send_cq == nullptr || init.recv_cq == nullptr ||
      (options.srq && init.srq == nullptr)) {
    throw_system_error("ibv_create_qp: a CQ or the SRQ was closed", ENODEV);
  }
  ibv_qp* qp = ibv_create_qp(pd->require_open("ibv_create_qp"), &init);
  if (qp == nullptr) throw_system_error("ibv_create_qp", errno);
  auto queue_pair = std::make_shared<QueuePair>(Token{}, pd, std::move(options), qp);
  if (on_event) queue_pair->qp_.serve_with(device->registry().attach(qp, std::move(on_event)));
  device->track(queue_pair);
  return queue_pair;
}

QueuePair::QueuePair(Token, std::shared_ptr<ProtectionDomain> pd, Options options,
                     ibv_qp* qp)
    : pd_(std::move(pd)),
      parents_(std::move(options)),
      psn_(parents_.psn ? *parents_.psn : random_psn()),
      qp_(qp, qp->context, &pd_->device()->registry()) {}

QueuePair::~QueuePair() = default;

void QueuePair::close() noexcept { qp_.close(); }

std::uint32_t QueuePair::qp_num() const { return qp_.require("QueuePair::qp_num")->qp_num; }

void QueuePair::modify(ibv_qp_attr& attr, int mask, const char* step) {
  // ibv_modify_qp returns the errno value itself.
  if (const int rc = ibv_modify_qp(qp_.require(step), &attr, mask); rc != 0) {
    throw_system_error(step, rc);
  }
}

void QueuePair::post_send(ibv_send_wr& wr, ibv_send_wr** bad_wr) {
  detail::release_before_post(parents_.send_cq->get());
  ibv_send_wr* bad = nullptr;
  // ibv_post_send returns the errno value itself.
  if (const int rc = ibv_post_send(qp_.require("ibv_post_send"), &wr, bad_wr ? bad_wr : &bad); rc != 0) {
    throw_system_error("ibv_post_send", rc);
  }
}

void QueuePair::post_recv(ibv_recv_wr& wr, ibv_recv_wr** bad_wr) {
  detail::release_before_post(parents_.recv_cq->get());
  ibv_recv_wr* bad = nullptr;
  if (const int rc = ibv_post_recv(qp_.require("ibv_post_recv"), &wr, bad_wr ? bad_wr : &bad); rc != 0) {
    throw_system_error("ibv_post_recv", rc);
  }
}

RcEndpoint QueuePair::endpoint(std::uint8_t port, int gid_index) const {
  const auto& device = pd_->device();
  return {qp_num(), device->query_gid(port, gid_index), psn_,
          device->query_port(port).lid};
}

void QueuePair::connect(const RcEndpoint& remote, const ConnectOptions& options) {
  const auto& device = pd_->device();
  const detail::RcTransitions steps = detail::rc_transitions(
      remote, psn_, device->query_port(options.port),
      device->query_gid(options.port, options.gid_index), options);
  ibv_qp_attr init = steps.init, rtr = steps.rtr, rts = steps.rts;
  modify(init, steps.init_mask, "ibv_modify_qp(INIT)");
  modify(rtr, steps.rtr_mask, "ibv_modify_qp(RTR)");
  modify(rts, steps.rts_mask, "ibv_modify_qp(RTS)");
}

void QueuePair::drain_send_queue() {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_SQD;
  attr.en_sqd_async_notify = 1;
  modify(attr, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY, "ibv_modify_qp(SQD)");
}

void connect_rc_pair(QueuePair& a, QueuePair& b, const ConnectOptions& options) {
  const RcEndpoint a_end = a.endpoint(options.port, options.gid_index);
  const RcEndpoint b_end = b.endpoint(options.port, options.gid_index);
  a.connect(b_end, options);
  b.connect(a_end, options);
}

namespace detail {

RcTransitions rc_transitions(const RcEndpoint& remote, std::uint32_t own_psn,
                             const ibv_port_attr& port, const ibv_gid& local_gid,
                             const ConnectOptions& options) {
  require_psn("QueuePair::connect: the remote's PSN", remote.psn);
  // Drivers that predate link_layer report UNSPECIFIED: InfiniBand.
  const bool infiniband = port.link_layer != IBV_LINK_LAYER_ETHERNET;
  if (infiniband && remote.lid == 0) {
    throw std::invalid_argument(
        "QueuePair::connect: the remote has no LID, and an InfiniBand port "
        "addresses by LID");
  }
  const bool grh = !infiniband || remote.gid.global.subnet_prefix !=
                                      local_gid.global.subnet_prefix;
  RcTransitions steps;

  steps.init.qp_state = IBV_QPS_INIT;
  steps.init.port_num = options.port;
  steps.init.pkey_index = options.pkey_index;
  steps.init.qp_access_flags = options.access_flags;
  steps.init_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;

  ibv_qp_attr& rtr = steps.rtr;
  rtr.qp_state = IBV_QPS_RTR;
  rtr.path_mtu = options.path_mtu.value_or(port.active_mtu);
  rtr.dest_qp_num = remote.qp_num;
  rtr.rq_psn = remote.psn;
  rtr.max_dest_rd_atomic = options.max_dest_rd_atomic;
  rtr.min_rnr_timer = options.min_rnr_timer;
  rtr.ah_attr.port_num = options.port;
  rtr.ah_attr.sl = options.service_level;
  rtr.ah_attr.dlid = infiniband ? remote.lid : 0;
  rtr.ah_attr.is_global = grh ? 1 : 0;
  if (grh) {
    rtr.ah_attr.grh.dgid = remote.gid;
    rtr.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(options.gid_index);
    rtr.ah_attr.grh.hop_limit = options.hop_limit;
    rtr.ah_attr.grh.traffic_class = options.traffic_class;
  }
  steps.rtr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;

  ibv_qp_attr& rts = steps.rts;
  rts.qp_state = IBV_QPS_RTS;
  rts.timeout = options.timeout;
  rts.retry_cnt = options.retry_cnt;
  rts.rnr_retry = options.rnr_retry;
  rts.sq_psn = own_psn;
  rts.max_rd_atomic = options.max_rd_atomic;
  steps.rts_mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                   IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
  return steps;
}

}  // namespace detail

}  // namespace ibev
