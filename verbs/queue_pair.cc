// The QueuePair wrapper and RC connection setup; its drain is drain.cc's.
//
// Locking: Drain::mutex_ (one drain's progress, drain.cc) and Drains::mutex
// (the drains of one QP) are leaves: neither is held across `done`, a handle's release
// or a verb. The two call guards order the rest: drain_verbs_ is held (as a
// call) while a drain posts its markers and registers, Drains::polls while it
// polls kPolled CQs for them; close() closes both and waits for each, holding
// no lock, and a drain that finds `closing` set under Drains::mutex is
// refused. So close() racing drain() either waits for the drain's verbs or
// refuses the drain, and never frees the QP under it.
#include <ibev/verbs/queue_pair.h>

#include "drain.h"

#include <ibev/core/happens_before.h>
#include <ibev/core/thread_annotations.h>
#include <ibev/dispatch/event_wait.h>

#include <algorithm>
#include <cerrno>
#include <future>
#include <random>
#include <string>
#include <stdexcept>
#include <utility>
#include <vector>

namespace ibev {

namespace {

std::uint32_t random_psn() {
  thread_local std::mt19937 engine{std::random_device{}()};
  return std::uniform_int_distribution<std::uint32_t>(0, detail::kMax24Bits)(engine);
}

// RESET or INIT -> INIT, the one step of connect() that needs no remote;
// returns the mask.
int rc_init(const ConnectOptions& options, ibv_qp_attr& init) {
  init.qp_state = IBV_QPS_INIT;
  init.port_num = options.port;
  init.pkey_index = options.pkey_index;
  init.qp_access_flags = options.access_flags;
  return IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
}

// A QP dropped with drain_on_destroy, between its drain and its destroy:
// what it needs stays alive, and Device::close() can still reach it.
class DrainingQp : public detail::Closeable {
 public:
  DrainingQp(ibv_qp* qp, std::shared_ptr<ProtectionDomain> pd, detail::QueuePairParents parents)
      : pd_(std::move(pd)),
        parents_(std::move(parents)),
        qp_(qp, qp->context, &pd_->device()->registry()) {}

  void close() noexcept override { qp_.close(); }

 private:
  const std::shared_ptr<ProtectionDomain> pd_;
  const detail::QueuePairParents parents_;
  detail::Owned<ibv_qp, ibv_destroy_qp, detail::kDestroyQp, 0> qp_;
};

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
  if (options.psn) detail::require_psn("QueuePair::create", *options.psn);
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
  if (on_event) {
    // By its number too: what names a QP without its address (a DevX
    // event, an injected ObjectNumber) reaches the same handler.
    queue_pair->qp_.serve_with(device->registry().attach(
        qp->context, ObjectNumber{ElementKind::kQp, qp->qp_num}, qp, EventFilter{},
        std::move(on_event)));
  }
  device->track(queue_pair);
  return queue_pair;
}

QueuePair::QueuePair(Token, std::shared_ptr<ProtectionDomain> pd, Options options,
                     ibv_qp* qp)
    : pd_(std::move(pd)),
      parents_{std::move(options.send_cq), std::move(options.recv_cq), std::move(options.srq)},
      psn_chosen_(options.psn.has_value()),
      drain_on_destroy_(options.drain_on_destroy),
      psn_(options.psn ? *options.psn : random_psn()),
      qp_(qp, qp->context, &pd_->device()->registry()) {}

// With drain_on_destroy, and a device still there, the QP drains first and
// the dispatching thread destroys it when its markers have come (or the
// drain's timeout passed). A kPolled CQ is polled here, bounded.
QueuePair::~QueuePair() {
  if (!drain_on_destroy_ || qp_.get() == nullptr || qp_.inherited() ||
      pd_->device()->loss() != DeviceLoss::kNone) {
    return;  // qp_ destroys it at once (in a forked child: forgets it)
  }
  ibv_qp* qp = qp_.release();
  auto draining = std::make_shared<DrainingQp>(qp, pd_, parents_);
  try {
    pd_->device()->track(draining);
    DrainOptions options;
    options.polled = [](const CompletionBatch&) {};  // nobody is left to hear them
    detail::start_drain(qp, parents_, pd_->device()->dispatcher(), detail::DrainedQueues::kBoth,
                        options,
                [draining](const DrainReport&, std::error_code) { draining->close(); })
        .run(options);
  } catch (const std::exception&) {
    draining->close();
  }
}

// Weak: a drain that ended (its timer or markers gone) is nobody's to end.
struct QueuePair::Drains {
  detail::Mutex mutex;
  bool closing IBEV_GUARDED_BY(mutex) = false;
  std::vector<std::weak_ptr<detail::Drain>> running IBEV_GUARDED_BY(mutex);
  // Held while a drain polls kPolled CQs for its markers, after its verbs:
  // close() waits for it (the CQs may go once it returns), and it lives on
  // with the drain when `done` destroys the QueuePair.
  detail::CallGuard polls;
};

std::shared_ptr<QueuePair::Drains> QueuePair::drains() {
  std::shared_ptr<Drains> drains = std::atomic_load(&drains_);
  if (drains) return drains;
  auto made = std::make_shared<Drains>();
  return std::atomic_compare_exchange_strong(&drains_, &drains, made) ? made : drains;
}

// A drain that got past its check of the QP is either in its verbs (waited
// for below) or registered (ended here), or both; one that registers after
// `closing` is set is refused there.
void QueuePair::close() noexcept {
  if (qp_.inherited()) return qp_.close();  // a forked child's: no drain of its own
  drain_verbs_.close();
  if (const std::shared_ptr<Drains> drains = std::atomic_load(&drains_)) {
    std::vector<std::weak_ptr<detail::Drain>> running;
    {
      detail::MutexLock lock(drains->mutex);
      drains->closing = true;
      running.swap(drains->running);
    }
    const auto cancelled = std::make_error_code(std::errc::operation_canceled);
    for (const auto& weak : running) {
      if (auto drain = weak.lock()) detail::cancel(*drain, cancelled);
    }
  }
  drain_verbs_.wait_idle();  // not for a drain on this thread (close() from its callback)
  if (const std::shared_ptr<Drains> drains = std::atomic_load(&drains_)) {
    drains->polls.close();  // cancelled: its polling stops at its next look
    drains->polls.wait_idle();
  }
  qp_.close();
}

// The verbs under drain_verbs_, the polling for markers on kPolled CQs
// after it under Drains::polls (close() waits for both), touching nothing of
// this QueuePair then: `done` may destroy it.
void QueuePair::run_drain(const char* verb, detail::DrainedQueues queues,
                          const DrainOptions& options,
                          std::function<void(const DrainReport&, std::error_code)> done) {
  detail::check_drain_options(options, verb);
  detail::MarkerPoll rest;
  std::shared_ptr<Drains> drains;
  {
    const auto entered = drain_verbs_.enter();
    if (!entered) detail::throw_closed(verb);
    ibv_qp* qp = qp_.require(verb);
    drains = this->drains();
    rest = detail::start_drain(
        qp, parents_, pd_->device()->dispatcher(), queues, options, std::move(done),
        [&drains, verb](const std::shared_ptr<detail::Drain>& drain) {
                         detail::MutexLock lock(drains->mutex);
                         if (drains->closing) detail::throw_closed(verb);
                         auto& running = drains->running;
                         running.erase(
                             std::remove_if(running.begin(), running.end(),
                                            [](const auto& weak) { return weak.expired(); }),
                             running.end());
                         running.push_back(drain);
                       });
  }
  if (!rest.drain) return;  // nothing to poll
  if (const auto entered = drains->polls.enter()) rest.run(options);  // else cancelled
}

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
  return {qp_num(), device->query_gid(port, gid_index), psn(),
          device->query_port(port).lid};
}

void QueuePair::to_init(const ConnectOptions& options) {
  ibv_qp_attr init{};
  const int mask = rc_init(options, init);
  modify(init, mask, "ibv_modify_qp(INIT)");
}

void QueuePair::connect(const RcEndpoint& remote, const ConnectOptions& options) {
  const auto& device = pd_->device();
  const detail::RcTransitions steps = detail::rc_transitions(
      remote, psn(), device->query_port(options.port),
      device->query_gid(options.port, options.gid_index), options);
  ibv_qp_attr init = steps.init, rtr = steps.rtr, rts = steps.rts;
  modify(init, steps.init_mask, "ibv_modify_qp(INIT)");
  modify(rtr, steps.rtr_mask, "ibv_modify_qp(RTR)");
  modify(rts, steps.rts_mask, "ibv_modify_qp(RTS)");
}

void QueuePair::reset() {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RESET;
  modify(attr, IBV_QP_STATE, "ibv_modify_qp(RESET)");
  if (!psn_chosen_) psn_.store(random_psn(), std::memory_order_relaxed);
}

void QueuePair::drain_send_queue() {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_SQD;
  attr.en_sqd_async_notify = 1;
  modify(attr, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY, "ibv_modify_qp(SQD)");
}

void QueuePair::resume_send_queue() {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTS;
  attr.cur_qp_state = IBV_QPS_SQD;
  modify(attr, IBV_QP_STATE | IBV_QP_CUR_STATE, "ibv_modify_qp(SQD->RTS)");
}

void QueuePair::drain_async(DrainOptions options,
                            std::function<void(const DrainReport&, std::error_code)> done) {
  if (!done) throw std::invalid_argument("QueuePair::drain_async: `done` is empty");
  run_drain("QueuePair::drain", detail::DrainedQueues::kBoth, options, std::move(done));
}

// The blocking form: the caller waits, so it must not be the thread that
// delivers the markers.
DrainReport QueuePair::drain_and_wait(const char* verb, detail::DrainedQueues queues,
                                      const DrainOptions& options) {
  for (const auto* cq : {&parents_.send_cq, &parents_.recv_cq}) {
    Dispatcher* served_by = (*cq)->served_by();
    if (served_by != nullptr && served_by->in_dispatcher_thread()) {
      throw std::logic_error(
          "QueuePair::drain: called on the dispatching thread, which delivers the drain's "
          "marker; use drain_async there");
    }
  }
  using Outcome = std::pair<DrainReport, std::error_code>;
  auto outcome = std::make_shared<std::promise<Outcome>>();
  std::future<Outcome> result = outcome->get_future();
  run_drain(verb, queues, options, [outcome](const DrainReport& report, std::error_code error) {
    outcome->set_value({report, error});
  });
  // The drain's own timer ends it; this bound is for a Dispatcher that
  // does not dispatch (stopped, or never started).
  const auto bound = options.timeout + options.last_wqe_timeout + std::chrono::seconds(1);
  if (result.wait_for(bound) != std::future_status::ready) {
    throw_system_error(std::string(verb) + " (is the Dispatcher running?)", ETIMEDOUT);
  }
  const Outcome got = result.get();
  if (got.second) throw_system_error(verb, got.second.value());
  return got.first;
}

DrainReport QueuePair::drain(const DrainOptions& options) {
  return drain_and_wait("QueuePair::drain", detail::DrainedQueues::kBoth, options);
}

DrainReport QueuePair::drain_send(const DrainOptions& options) {
  return drain_and_wait("QueuePair::drain_send", detail::DrainedQueues::kSend, options);
}

DrainReport QueuePair::drain_receive(const DrainOptions& options) {
  return drain_and_wait("QueuePair::drain_receive", detail::DrainedQueues::kReceive, options);
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
  // Drivers that predate link_layer report UNSPECIFIED: InfiniBand.
  const bool infiniband = port.link_layer != IBV_LINK_LAYER_ETHERNET;
  if (infiniband && remote.lid() == 0) {
    throw std::invalid_argument(
        "QueuePair::connect: the remote has no LID, and an InfiniBand port "
        "addresses by LID");
  }
  const bool grh = !infiniband || remote.gid().global.subnet_prefix !=
                                      local_gid.global.subnet_prefix;
  RcTransitions steps;

  steps.init_mask = rc_init(options, steps.init);

  ibv_qp_attr& rtr = steps.rtr;
  rtr.qp_state = IBV_QPS_RTR;
  rtr.path_mtu = options.path_mtu.value_or(port.active_mtu);
  rtr.dest_qp_num = remote.qp_num();
  rtr.rq_psn = remote.psn();
  rtr.max_dest_rd_atomic = options.max_dest_rd_atomic;
  rtr.min_rnr_timer = options.min_rnr_timer;
  rtr.ah_attr.port_num = options.port;
  rtr.ah_attr.sl = options.service_level;
  rtr.ah_attr.dlid = infiniband ? remote.lid() : 0;
  rtr.ah_attr.is_global = grh ? 1 : 0;
  if (grh) {
    rtr.ah_attr.grh.dgid = remote.gid();
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
