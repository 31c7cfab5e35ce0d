// One CM event's path, top-down: CmChannelState::serve reads it, resolve()
// decides who hears it and copies what the handler needs (making the new id
// of a CONNECT_REQUEST, moving a connecting QP on CONNECT_RESPONSE), the
// event is acked, and the routing primitive's call (core/route.h) runs the
// handler, inline or on the id's executor.
//
// Locking: a channel's table of ids is a KeyedLists (its shard locks are
// leaves); its `mutex` guards the timers of release_removed_devices, and
// nothing else is done under it. Its `calls` lock is held around
// rdma_get_cm_event and each CmId's librdmacm call, never across a handler:
// librdmacm is not safe for two threads in one id at once. An id's own
// mutex guards its QP and connection state. The dispatching thread holds no
// lock while a handler runs. The waits: an id's close() releases its
// subscription, which waits for its running handler holding no lock, then
// destroys the id under `calls`; there rdma_destroy_id waits for the acks
// of the id's events, which serve() gives without `calls` (it holds that
// lock only to read), and before it delivers anything. establish() works on
// the id before the ack without `calls`: until the ack the id cannot be
// destroyed, and what it calls (rdma_init_qp_attr, rdma_establish) only
// reads the id.
#include <fcntl.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <stdexcept>
#include <utility>
#include <vector>

#include <ibev/cm/cm_devices.h>
#include <ibev/cm/test_seams.h>
#include <ibev/core/failure.h>
#include "cm_state.h"

namespace ibev {

bool (*detail::test_seams::lose_rtu)(rdma_cm_id*) = nullptr;

namespace {

void copy_private_data(const void* data, std::uint8_t length, CmEvent& event) {
  if (data == nullptr || length == 0) return;
  const auto* bytes = static_cast<const std::uint8_t*>(data);
  event.private_data.assign(bytes, bytes + length);
}

}  // namespace

namespace detail {

// Serves up to `batch` events: each read, resolved, acked, then delivered.
void CmChannelState::serve() noexcept {
  for (unsigned i = 0; i < batch; ++i) {
    rdma_cm_event* raw = nullptr;
    UniqueLock getting(calls);
    int got = 0;
    int error = 0;
    {
      IdRelease release;  // a CONNECT_REQUEST's new id may be dropped in it
      got = rdma_get_cm_event(channel, &raw);
      error = errno;
    }
    getting.unlock();
    if (got != 0) {
      if (error != EAGAIN && error != EWOULDBLOCK) {
        report(Failure::verb_failed("rdma_get_cm_event", error));
      }
      return;
    }
    bump(stats.events);
    Routed routed = resolve(*raw);
    rdma_ack_cm_event(raw);
    if (routed.refused != nullptr) destroy_id(routed.refused);
    deliver(routed);
  }
}

CmChannelState::Routed CmChannelState::resolve(rdma_cm_event& raw) noexcept {
  Routed routed;
  CmEvent& event = routed.event;
  event.code = static_cast<int>(raw.event);
  event.status = raw.status;
  const CmEventTypeInfo* info = find_cm_event_type(event.code);
  const CmPayload payload = info != nullptr ? info->payload : CmPayload::kNothing;
  if (payload == CmPayload::kConnection || payload == CmPayload::kRejection) {
    const rdma_conn_param& conn = raw.param.conn;
    copy_private_data(conn.private_data, conn.private_data_len, event);
    event.connection = CmConnection{
        conn.responder_resources, conn.initiator_depth, conn.flow_control, conn.retry_count,
        conn.rnr_retry_count,     conn.srq != 0,        conn.qp_num};
  } else if (payload == CmPayload::kDatagram) {
    copy_private_data(raw.param.ud.private_data, raw.param.ud.private_data_len, event);
  }

  if (info != nullptr && info->scope == CmScope::kListener) {
    // The new id reports to the listener's handler from now on, as a
    // kernel listener's children do; it is routed before the ack.
    bump(stats.connect_requests);
    routed.to = find(raw.listen_id);
    std::shared_ptr<CmEventChannel> channel_object = owner.lock();
    if (routed.to == nullptr || channel_object == nullptr) {
      bump(stats.requests_refused);
      routed.to = nullptr;
      routed.refused = raw.id;
      return routed;
    }
    const bool made = reported_call(
        "CmId for a CONNECT_REQUEST",
        [&] {
          const CmRoute& listener = *routed.to;
          event.new_id = std::make_shared<CmId>(
              CmId::Token{}, std::move(channel_object), raw.id, listener.handler,
              listener.executor ? *listener.executor : Executor{});
        },
        [&](Failure failure) { report(std::move(failure)); });
    if (!made) {
      bump(stats.requests_refused);
      routed.to = nullptr;
      routed.refused = raw.id;
      return routed;
    }
    event.id = routed.to->state->owner;
    MutexLock lock(event.new_id->state_->mutex);
    event.new_id->state_->request = event.connection;
    return routed;
  }

  routed.to = find(raw.id);
  if (routed.to == nullptr) {
    bump(stats.unrouted);
    return routed;
  }
  CmIdState& state = *routed.to->state;
  event.id = state.owner;
  switch (raw.event) {
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
      // Before the ack: until then rdma_destroy_id cannot free the id.
      establish(state, raw.id, event);
      break;
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      state.device_removed = true;  // its close() lets librdmacm let go
      break;
    case RDMA_CM_EVENT_REJECTED:
    case RDMA_CM_EVENT_DISCONNECTED: {
      MutexLock lock(state.mutex);
      if (state.connect_error) {
        routed.to = nullptr;  // the handler heard CONNECT_ERROR already
        break;
      }
      if (raw.event == RDMA_CM_EVENT_REJECTED && state.qp) move_to_error(*state.qp);
      break;
    }
    default:
      break;
  }
  return routed;
}

// The active side's CONNECT_RESPONSE, for a QP given to connect(): INIT
// again (now with the CM's attributes for the connection), RTR, RTS, then
// the RTU; the handler hears ESTABLISHED, or CONNECT_ERROR with the errno
// of the step that failed, as librdmacm reports for its own QPs.
void CmChannelState::establish(CmIdState& state, rdma_cm_id* id, CmEvent& event) noexcept {
  std::shared_ptr<QueuePair> qp;
  {
    MutexLock lock(state.mutex);
    qp = state.qp;
  }
  if (qp == nullptr) return;  // connected without a QP: the handler goes on
  int error = 0;
  try {
    move_qp(id, *qp, IBV_QPS_INIT);
    move_qp(id, *qp, IBV_QPS_RTR);
    move_qp(id, *qp, IBV_QPS_RTS);
    const bool lost = test_seams::lose_rtu != nullptr && test_seams::lose_rtu(id);
    if (!lost && rdma_establish(id) != 0) throw_system_error("rdma_establish", errno);
  } catch (const std::system_error& e) {
    error = e.code().value();
  } catch (const std::exception&) {
    error = EINVAL;
  }
  if (error == 0) {
    event.code = RDMA_CM_EVENT_ESTABLISHED;
    return;
  }
  move_to_error(*qp);
  event.code = RDMA_CM_EVENT_CONNECT_ERROR;
  event.status = -error;
  MutexLock lock(state.mutex);
  state.connect_error = true;
}

// The handler, unless its id was closed meanwhile (then it never runs again).
void CmChannelState::deliver(const Routed& routed) noexcept {
  if (routed.to == nullptr) return;
  call(routed.to, routed.event, "CM event handler",
       [self = shared_from_this(), to = routed.to](Failure failure, const CmEvent& event) {
         failure.event_code = event.code;
         failure.object = to->state->id.load();
         self->report(std::move(failure));
       });
}

}  // namespace detail

// --- CmEventChannel ---

std::shared_ptr<CmEventChannel> CmEventChannel::create(Dispatcher& dispatcher, Options options) {
  if (options.batch == 0) {
    throw std::invalid_argument("CmEventChannel::create: batch must be at least 1");
  }
  rdma_event_channel* raw = rdma_create_event_channel();
  if (raw == nullptr) throw_system_error("rdma_create_event_channel", errno);
  auto state = std::make_shared<detail::CmChannelState>(raw, options.batch, dispatcher.registry());
  // Served in the loop: rdma_get_cm_event then fails with EAGAIN, never blocks.
  const int flags = ::fcntl(raw->fd, F_GETFL);
  if (flags < 0 || ::fcntl(raw->fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    throw_system_error("fcntl(O_NONBLOCK) on the CM event channel", errno);
  }
  auto channel = std::make_shared<CmEventChannel>(Token{}, dispatcher, state);
  state->owner = channel;
  channel->served_ = dispatcher.watch_fd(
      raw->fd, EPOLLIN, [weak = std::weak_ptr<detail::CmChannelState>(state)](std::uint32_t) {
        // Held while serving: a handler may drop the last id, and with it
        // the channel, without the channel going under this loop.
        if (auto state = weak.lock()) state->serve();
      });
  // A removed device's librdmacm context, if no id holds it, goes at once;
  // looked for again a little later, as the device may still be listed
  // when its removal is announced. Without a device monitor (kOff) only
  // closing an id that heard DEVICE_REMOVAL does it.
  try {
    channel->devices_watched_ =
        dispatcher.watch_devices([&dispatcher, weak = std::weak_ptr<detail::CmChannelState>(state)](
                                     DeviceChange change, const std::string&) {
          if (change != DeviceChange::kRemoved) return;
          detail::release_removed_devices();
          auto state = weak.lock();
          if (state == nullptr) return;
          std::vector<Handle> later;
          for (const int delay : {100, 500, 2000}) {
            later.push_back(dispatcher.call_after(std::chrono::milliseconds(delay),
                                                  [] { detail::release_removed_devices(); }));
          }
          // An earlier removal's, replaced (on this thread: no wait).
          std::vector<Handle> earlier;
          detail::MutexLock lock(state->mutex);
          earlier.swap(state->retries);
          state->retries = std::move(later);
        });
  } catch (const std::invalid_argument&) {
    // Options::device_monitor is kOff: see above.
  }
  return channel;
}

CmEventChannel::CmEventChannel(Token, Dispatcher& dispatcher,
                               std::shared_ptr<detail::CmChannelState> state)
    : dispatcher_(dispatcher), state_(std::move(state)) {}

CmEventChannel::~CmEventChannel() { served_.release(); }

rdma_event_channel* CmEventChannel::get() const noexcept { return state_->channel; }

CmStats CmEventChannel::stats() const noexcept { return state_->stats.load(); }

}  // namespace ibev
