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
  ibv_srq* srq = ibv_create_srq(pd->get(), &init);
  if (srq == nullptr) detail::throw_verb_error("ibv_create_srq", errno);
  auto queue = std::make_shared<SharedReceiveQueue>(Token{}, pd, srq);
  if (on_event) {
    queue->events_ = pd->device()->registry().attach(srq, std::move(on_event));
  }
  return queue;
}

SharedReceiveQueue::SharedReceiveQueue(Token, std::shared_ptr<ProtectionDomain> pd,
                                       ibv_srq* srq)
    : pd_(std::move(pd)), srq_(srq) {}

SharedReceiveQueue::~SharedReceiveQueue() {
  events_.release();
  srq_.reset();
}

void SharedReceiveQueue::arm_limit(std::uint32_t limit) {
  ibv_srq_attr attr{};
  attr.srq_limit = limit;
  if (const int rc = ibv_modify_srq(srq_.get(), &attr, IBV_SRQ_LIMIT); rc != 0) {
    detail::throw_verb_error("ibv_modify_srq(IBV_SRQ_LIMIT)", rc);
  }
}

}  // namespace ibev
