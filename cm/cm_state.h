// Internal to cm/: what a CM id and its event channel share. A CmIdState is
// one id's QP and connection state; a CmRoute, the way to its handler: a
// routing subscriber (core/route.h) with the id's state. A CmChannelState is
// one channel's: the ids routed on it, one KeyedLists as the registry's
// objects are (CmId holds its route's subscription, which reroute() replaces
// and close() releases), the lock librdmacm needs, the stats. cm_channel.cc
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
#include <ibev/core/call_guard.h>
#include <ibev/core/process.h>
#include <ibev/core/route.h>
#include <ibev/core/subscriber_lists.h>
#include <ibev/core/thread_annotations.h>

namespace ibev::detail {

IBEV_DECLARE_ATOMIC_STATS(CmAtomicStats, CmStats, IBEV_CM_STATS);

// What the channel's steps need of an id, whichever handler hears it.
struct CmIdState {
  explicit CmIdState(rdma_cm_id* cm_id) : id(cm_id) {}

  std::atomic<rdma_cm_id*> id;  // null once closed
  CmId* owner = nullptr;
  // Entered by every call of the id's handler, by whichever route it came:
  // close() waits on it, so also for a handler a reroute() is letting go of.
  CallGuard calls;

  Mutex mutex;
  std::shared_ptr<QueuePair> qp IBEV_GUARDED_BY(mutex);  // given to connect() or accept()
  // A connecting QP failed on CONNECT_RESPONSE: the REJECTED or DISCONNECTED
  // that may follow are not news to the handler (librdmacm drops them too).
  bool connect_error IBEV_GUARDED_BY(mutex) = false;
  // A new id: what its CONNECT_REQUEST asked for.
  CmConnection request IBEV_GUARDED_BY(mutex);
  std::atomic<bool> device_removed{false};  // it heard DEVICE_REMOVAL
};

// An id as its channel routes to it: the handler, its executor and its
// guard (the Subscriber), and the id's state. An id has one, and two while
// it is rerouted: the new one is subscribed before the old is released, so
// each event goes to one of them (the newest when it is resolved).
struct CmRoute : Subscriber<CmEvent> {
  CmRoute(std::shared_ptr<CmIdState> id_state, CmHandler h, Executor executor)
      : Subscriber(
            [this](const CmEvent& event) {
              guarded_call(state->calls, [&] { handler(event); });
            },
            AnyArg{}, std::move(executor)),
        state(std::move(id_state)),
        handler(std::move(h)) {}

  const std::shared_ptr<CmIdState> state;
  const CmHandler handler;  // as given: a listener's new ids get it too
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

  // The id's route until its subscription is released; null after.
  std::shared_ptr<CmRoute> find(const rdma_cm_id* id) const {
    return ids.snapshot(CmIdKey(id)).newest();
  }

  struct Routed {
    std::shared_ptr<CmRoute> to;  // null: nobody hears it
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

  KeyedLists<CmRoute, CmIdKey> ids;  // one route a key (two while rerouted)
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

}  // namespace ibev::detail

#endif  // IBEV_CM_CM_STATE_H_
