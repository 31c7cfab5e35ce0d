#include <ibev/verbs/shared_receive_queue.h>

#include <cerrno>
#include <stdexcept>
#include <utility>

namespace ibev {

std::shared_ptr<SharedReceiveQueue> SharedReceiveQueue::create(
    std::shared_ptr<ProtectionDomain> pd, Handler on_event, Options options) {
  if (!pd) {
    throw std::invalid_argument("SharedReceiveQueue::create: the domain is null");
  }
  ibv_srq_init_attr init{};
  init.attr.max_wr = options.max_wr;
  init.attr.max_sge = options.max_sge;
  ibv_srq* srq = ibv_create_srq(pd->require_open("ibv_create_srq"), &init);
  if (srq == nullptr) throw_system_error("ibv_create_srq", errno);
  auto queue = std::make_shared<SharedReceiveQueue>(Token{}, pd, srq);
  if (on_event) {
    queue->srq_.serve_with(pd->device()->registry().attach(srq, std::move(on_event)));
  }
  pd->device()->track(queue);
  return queue;
}

SharedReceiveQueue::SharedReceiveQueue(Token, std::shared_ptr<ProtectionDomain> pd,
                                       ibv_srq* srq)
    : pd_(std::move(pd)), srq_(srq, srq->context, &pd_->device()->registry()) {}

SharedReceiveQueue::~SharedReceiveQueue() = default;

void SharedReceiveQueue::close() noexcept { srq_.close(); }

void SharedReceiveQueue::arm_limit(std::uint32_t limit) {
  ibv_srq_attr attr{};
  attr.srq_limit = limit;
  if (const int rc = ibv_modify_srq(srq_.require("ibv_modify_srq"), &attr, IBV_SRQ_LIMIT); rc != 0) {
    throw_system_error("ibv_modify_srq(IBV_SRQ_LIMIT)", rc);
  }
}

}  // namespace ibev
