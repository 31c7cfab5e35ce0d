// Internal to cm/: what a CM id and its event channel share. A CmIdState is
// one id's: a routing subscriber (core/route.h) with its QP and connection
// state. A CmChannelState is one channel's: the ids routed on it, one
// KeyedLists as the registry's objects are (CmId holds its subscription and
// close() releases it), the lock librdmacm needs, the stats. cm_channel.cc
// serves the channel, cm_id.cc is CmId's calls, cm_qp.cc the CM's steps of
// a QP.
#ifndef IBEV_CM_CM_STATE_H_
#define IBEV_CM_CM_STATE_H_

#include <rdma/rdma_cma.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <ibev/cm/cm_id.h>
#include <ibev/core/process.h>
#include <ibev/core/route.h>
#include <ibev/core/subscriber_lists.h>
#include <ibev/core/thread_annotations.h>

namespace ibev::detail {

IBEV_DECLARE_ATOMIC_STATS(CmAtomicStats, CmStats, IBEV_CM_STATS);

// An id as its channel routes to it: the handler, its executor and its
// guard (the Subscriber), and what the channel's steps need of the id.
struct CmIdState : Subscriber<CmEvent> {
  CmIdState(rdma_cm_id* cm_id, CmHandler handler, Executor executor)
      : Subscriber(std::move(handler), AnyArg{}, std::move(executor)), id(cm_id) {}

  std::atomic<rdma_cm_id*> id;  // null once closed
  CmId* owner = nullptr;

  Mutex mutex;
  std::shared_ptr<QueuePair> qp IBEV_GUARDED_BY(mutex);  // given to connect() or accept()
  // A connecting QP failed on CONNECT_RESPONSE: the REJECTED or DISCONNECTED
  // that may follow are not news to the handler (librdmacm drops them too).
  bool connect_error IBEV_GUARDED_BY(mutex) = false;
  // A new id: what its CONNECT_REQUEST asked for.
  CmConnection request IBEV_GUARDED_BY(mutex);
  std::atomic<bool> device_removed{false};  // it heard DEVICE_REMOVAL
};

// The key of an id's state: its rdma_cm_id's address, which no other id has
// while the id lives (librdmacm allocates it, so it is aligned: the
// KeyedLists' shard hash skips the low bits).
class CmIdKey {
 public:
  CmIdKey() noexcept = default;  // the empty key
  explicit CmIdKey(const rdma_cm_id* id) noexcept : bits_(reinterpret_cast<std::uintptr_t>(id)) {}
  bool empty() const noexcept { return bits_ == 0; }
  std::uintptr_t bits() const noexcept { return bits_; }
  friend bool operator==(CmIdKey a, CmIdKey b) noexcept { return a.bits_ == b.bits_; }

 private:
  std::uintptr_t bits_ = 0;
};

struct CmChannelState : std::enable_shared_from_this<CmChannelState> {
  CmChannelState(rdma_event_channel* c, unsigned b, Registry& r)
      : channel(c), batch(b), registry(r) {}
  // In a child forked after the channel was made, its ids are the parent's:
  // rdma_destroy_id on the shared CM file would destroy them there.
  bool inherited() const noexcept { return process.inherited_now(); }  // a destroy follows
  // The last id is gone (each keeps the channel alive), and so is serving.
  ~CmChannelState() { rdma_destroy_event_channel(channel); }

  // The id's state until its subscription is released; null after.
  std::shared_ptr<CmIdState> find(const rdma_cm_id* id) const {
    return ids.snapshot(CmIdKey(id)).newest();
  }

  struct Routed {
    std::shared_ptr<CmIdState> to;  // null: nobody hears it
    CmEvent event;
    rdma_cm_id* refused = nullptr;  // a new id nobody listens for any more
  };
  void serve() noexcept;
  Routed resolve(rdma_cm_event& raw) noexcept;
  void establish(CmIdState& state, rdma_cm_id* id, CmEvent& event) noexcept;
  void deliver(const Routed& routed) noexcept;
  void report(Failure failure) const noexcept { registry.report(failure); }

  rdma_event_channel* const channel;
  const unsigned batch;
  const OwningProcess process;  // that made it
  Registry& registry;                   // the Dispatcher's: where failures go
  std::weak_ptr<CmEventChannel> owner;  // set once, before serving starts
  CmAtomicStats stats;

  // Held around rdma_get_cm_event and every CmId's librdmacm call: librdmacm
  // writes an id while it reads the id's events (its route, on
  // ADDR_RESOLVED) and finishes some calls after the kernel may have
  // answered them (rdma_resolve_addr copies the destination after), so two
  // threads must not be in it for one id at once.
  Mutex calls;

  KeyedLists<CmIdState, CmIdKey> ids;  // one subscriber a key
  Mutex mutex;
  std::vector<Handle> retries IBEV_GUARDED_BY(mutex);  // release_removed_devices() again, later
};

// The CM's QP steps (cm_qp.cc). move_qp: one step with the attributes the CM
// computes (rdma_init_qp_attr), as librdmacm steps a QP of rdma_create_qp;
// `rd_atomic` is max_dest_rd_atomic at RTR, max_rd_atomic at RTS.
void move_qp(rdma_cm_id* id, QueuePair& qp, ibv_qp_state state,
             std::optional<std::uint8_t> rd_atomic = std::nullopt);
// A connection that will not be: its QP stops (flushing what was posted).
void move_to_error(QueuePair& qp) noexcept;
// librdmacm lets go of a removed device's context (see cm_qp.cc).
void release_removed_devices() noexcept;

}  // namespace ibev::detail

#endif  // IBEV_CM_CM_STATE_H_
