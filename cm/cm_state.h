// Internal to cm/: what a CM id and its event channel share. A CmIdState is
// one id's (its handler as a routing subscriber, its QP and connection
// state); a CmChannelState is one channel's (the ids routed on it, the lock
// librdmacm needs, the stats). cm_channel.cc serves the channel,
// cm_id.cc is CmId's calls, cm_qp.cc the CM's steps of a QP.
#ifndef IBEV_CM_CM_STATE_H_
#define IBEV_CM_CM_STATE_H_

#include <rdma/rdma_cma.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include <ibev/cm/cm_id.h>
#include <ibev/core/route.h>

namespace ibev::detail {

IBEV_DECLARE_ATOMIC_STATS(CmAtomicStats, CmStats, IBEV_CM_STATS);

using CmSubscriber = Subscriber<CmEvent>;

struct CmIdState {
  CmIdState(rdma_cm_id* cm_id, CmHandler handler, Executor executor)
      : id(cm_id),
        subscriber(std::make_shared<CmSubscriber>(std::move(handler), AnyArg{},
                                                  std::move(executor))) {}

  std::atomic<rdma_cm_id*> id;  // null once closed
  // The handler; close() waits on its guard.
  const std::shared_ptr<CmSubscriber> subscriber;
  CmId* owner = nullptr;

  std::mutex mutex;
  std::shared_ptr<QueuePair> qp;  // given to connect() or accept()
  // A connecting QP failed on CONNECT_RESPONSE: the REJECTED or DISCONNECTED
  // that may follow are not news to the handler (librdmacm drops them too).
  bool connect_error = false;
  CmConnection request;                     // a new id: what its CONNECT_REQUEST asked for
  std::atomic<bool> device_removed{false};  // it heard DEVICE_REMOVAL
};

struct CmChannelState : std::enable_shared_from_this<CmChannelState> {
  CmChannelState(rdma_event_channel* c, unsigned b, Registry& r)
      : channel(c), batch(b), registry(r) {}
  // In a child forked after the channel was made, its ids are the parent's:
  // rdma_destroy_id on the shared CM file would destroy them there.
  bool inherited() const noexcept { return ::getpid() != process; }
  // The last id is gone (each keeps the channel alive), and so is serving.
  ~CmChannelState() { rdma_destroy_event_channel(channel); }

  void add(rdma_cm_id* id, std::shared_ptr<CmIdState> state) {
    std::lock_guard<std::mutex> lock(mutex);
    ids[id] = std::move(state);
  }
  void remove(rdma_cm_id* id) {
    std::lock_guard<std::mutex> lock(mutex);
    ids.erase(id);
  }
  std::shared_ptr<CmIdState> find(rdma_cm_id* id) const {
    std::lock_guard<std::mutex> lock(mutex);
    const auto it = ids.find(id);
    return it != ids.end() ? it->second : nullptr;
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
  const pid_t process = ::getpid();  // that made it
  Registry& registry;                   // the Dispatcher's: where failures go
  std::weak_ptr<CmEventChannel> owner;  // set once, before serving starts
  CmAtomicStats stats;

  // Held around rdma_get_cm_event and every CmId's librdmacm call: librdmacm
  // writes an id while it reads the id's events (its route, on
  // ADDR_RESOLVED) and finishes some calls after the kernel may have
  // answered them (rdma_resolve_addr copies the destination after), so two
  // threads must not be in it for one id at once.
  std::mutex calls;

  mutable std::mutex mutex;
  std::unordered_map<rdma_cm_id*, std::shared_ptr<CmIdState>> ids;
  std::vector<Handle> retries;  // release_removed_devices() again, later (guarded too)
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
