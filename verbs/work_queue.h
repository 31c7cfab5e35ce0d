// ibev::WorkQueue: a receive work queue (ibv_wq) created with its event
// handler; WQ_FATAL goes to that handler, on the dispatching thread.
//
// Not every provider has WQs: rdma_rxe has none, and create() then throws
// std::system_error(EOPNOTSUPP, "ibv_create_wq"). close() (or destruction)
// detaches the handler (waiting unless on its thread), then destroys the WQ.
// Keeps its protection domain and CQ alive; Device::close() reaches it.
#ifndef IBEV_VERBS_WORK_QUEUE_H_
#define IBEV_VERBS_WORK_QUEUE_H_

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>

#include <ibev/core/registry.h>
#include <ibev/verbs/completion_queue.h>
#include <ibev/verbs/ownership.h>
#include <ibev/verbs/protection_domain.h>

namespace ibev {

namespace detail {
inline constexpr char kDestroyWq[] = "ibv_destroy_wq";
// ibv_destroy_wq is static inline in verbs.h; a deleter needs a function
// with linkage.
int destroy_wq(ibv_wq* wq);
}  // namespace detail

struct WorkQueueOptions {
  std::uint32_t max_wr = 64;
  std::uint32_t max_sge = 1;
};

class WorkQueue : public detail::Closeable {
 public:
  using Options = WorkQueueOptions;

  // Throws std::invalid_argument (null domain or CQ, or a CQ of another
  // device) or std::system_error (ibv_create_wq; EOPNOTSUPP where the
  // provider has no WQs).
  static std::shared_ptr<WorkQueue> create(std::shared_ptr<ProtectionDomain> pd,
                                           std::shared_ptr<CompletionQueue> cq,
                                           Handler on_event, Options options = {});
  ~WorkQueue() override;
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Null once closed.
  ibv_wq* get() const noexcept { return wq_.get(); }
  void close() noexcept override;

 private:
  struct Token {};

 public:
  WorkQueue(Token, std::shared_ptr<ProtectionDomain> pd,
            std::shared_ptr<CompletionQueue> cq, ibv_wq* wq);

 private:
  std::shared_ptr<ProtectionDomain> pd_;
  std::shared_ptr<CompletionQueue> cq_;
  detail::Owned<ibv_wq, detail::destroy_wq, detail::kDestroyWq> wq_;
};

}  // namespace ibev

#endif  // IBEV_VERBS_WORK_QUEUE_H_
