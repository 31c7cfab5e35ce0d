// ibev::SharedReceiveQueue: an SRQ created with its event handler, as the
// kernel's ib_create_srq with srq_init_attr.event_handler. SRQ_ERR and
// SRQ_LIMIT_REACHED go to that handler, on the dispatching thread.
//
// arm_limit() sets the limit (IBV_SRQ_LIMIT): the device raises
// SRQ_LIMIT_REACHED once when the posted receives drop below it, then the
// limit reads 0 until armed again. close() (or destruction) detaches the
// handler (waiting for it unless on its thread), then destroys the SRQ. Keeps
// its protection domain alive; Device::close() reaches it.
#ifndef IBEV_VERBS_SHARED_RECEIVE_QUEUE_H_
#define IBEV_VERBS_SHARED_RECEIVE_QUEUE_H_

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>

#include <ibev/core/registry.h>
#include <ibev/verbs/ownership.h>
#include <ibev/verbs/protection_domain.h>

namespace ibev {

namespace detail {
inline constexpr char kDestroySrq[] = "ibv_destroy_srq";
}  // namespace detail

struct SharedReceiveQueueOptions {
  std::uint32_t max_wr = 64;
  std::uint32_t max_sge = 1;
};

class SharedReceiveQueue : public detail::Closeable {
 public:
  using Options = SharedReceiveQueueOptions;

  // Throws std::invalid_argument (null domain) or std::system_error
  // (ibv_create_srq).
  static std::shared_ptr<SharedReceiveQueue> create(
      std::shared_ptr<ProtectionDomain> pd, Handler on_event, Options options = {});
  ~SharedReceiveQueue() override;
  SharedReceiveQueue(const SharedReceiveQueue&) = delete;
  SharedReceiveQueue& operator=(const SharedReceiveQueue&) = delete;

  // Throws std::system_error (ibv_modify_srq).
  void arm_limit(std::uint32_t limit);

  // Null once closed.
  ibv_srq* get() const noexcept { return srq_.get(); }
  void close() noexcept override;
  const std::shared_ptr<ProtectionDomain>& pd() const noexcept { return pd_; }

 private:
  struct Token {};

 public:
  SharedReceiveQueue(Token, std::shared_ptr<ProtectionDomain> pd, ibv_srq* srq);

 private:
  std::shared_ptr<ProtectionDomain> pd_;
  detail::Owned<ibv_srq, ibv_destroy_srq, detail::kDestroySrq> srq_;
};

}  // namespace ibev

#endif  // IBEV_VERBS_SHARED_RECEIVE_QUEUE_H_
