#include <ibev/verbs/work_queue.h>

#include <cerrno>
#include <stdexcept>
#include <utility>

namespace ibev {

int detail::destroy_wq(ibv_wq* wq) { return ibv_destroy_wq(wq); }

std::shared_ptr<WorkQueue> WorkQueue::create(std::shared_ptr<ProtectionDomain> pd,
                                             std::shared_ptr<CompletionQueue> cq,
                                             Handler on_event, Options options) {
  if (!pd || !cq) {
    throw std::invalid_argument("WorkQueue::create: needs a domain and a CQ");
  }
  if (cq->device() != pd->device()) {
    throw std::invalid_argument(
        "WorkQueue::create: the CQ must be on the domain's device");
  }
  ibv_wq_init_attr init{};
  init.wq_type = IBV_WQT_RQ;
  init.max_wr = options.max_wr;
  init.max_sge = options.max_sge;
  init.pd = pd->get();
  init.cq = cq->get();
  errno = 0;
  ibv_wq* wq = ibv_create_wq(pd->device()->context(), &init);
  if (wq == nullptr) detail::throw_verb_error("ibv_create_wq", errno);
  auto queue = std::make_shared<WorkQueue>(Token{}, pd, std::move(cq), wq);
  if (on_event) {
    queue->events_ = pd->device()->registry().attach(wq, std::move(on_event));
  }
  return queue;
}

WorkQueue::WorkQueue(Token, std::shared_ptr<ProtectionDomain> pd,
                     std::shared_ptr<CompletionQueue> cq, ibv_wq* wq)
    : pd_(std::move(pd)), cq_(std::move(cq)), wq_(wq) {}

WorkQueue::~WorkQueue() {
  events_.release();
  wq_.reset();
}

}  // namespace ibev
