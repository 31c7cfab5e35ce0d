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
  init.pd = pd->require_open("ibv_create_wq");
  init.cq = cq->get();
  if (init.cq == nullptr) throw_system_error("ibv_create_wq: the CQ was closed", ENODEV);
  errno = 0;
  ibv_wq* wq = ibv_create_wq(pd->device()->require_open("ibv_create_wq"), &init);
  if (wq == nullptr) throw_system_error("ibv_create_wq", errno);
  auto queue = std::make_shared<WorkQueue>(Token{}, pd, std::move(cq), wq);
  if (on_event) {
    queue->wq_.serve_with(pd->device()->registry().attach(wq, std::move(on_event)));
  }
  pd->device()->track(queue);
  return queue;
}

WorkQueue::WorkQueue(Token, std::shared_ptr<ProtectionDomain> pd,
                     std::shared_ptr<CompletionQueue> cq, ibv_wq* wq)
    : pd_(std::move(pd)), cq_(std::move(cq)), wq_(wq, wq->context, &pd_->device()->registry()) {}

WorkQueue::~WorkQueue() = default;

void WorkQueue::close() noexcept { wq_.close(); }

}  // namespace ibev
