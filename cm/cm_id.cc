// One CM event's path, top-down: CmChannelState::serve reads it, resolve()
// decides who hears it and copies what the handler needs (making the new id
// of a CONNECT_REQUEST, moving a connecting QP on CONNECT_RESPONSE), the
// event is acked, and the routing primitive's call (core/route.h) runs the
// handler, inline or on the id's executor.
//
// Locking: a channel's `mutex` guards its table of ids (and the timers of
// release_removed_devices), and nothing else is done under it. Its `calls`
// lock is held around rdma_get_cm_event and each CmId's librdmacm call,
// never across a handler: librdmacm is not safe for two threads in one id at
// once. An id's own mutex guards its QP and connection state. The
// dispatching thread holds no lock while a handler runs. The waits: an id's
// close() waits for its running handler (its subscriber's guard) holding no lock, then
// destroys the id under `calls`; there rdma_destroy_id waits for the acks of
// the id's events, which serve() gives without `calls` (it holds that lock
// only to read), and before it delivers anything. establish() works on the
// id before the ack without `calls`: until the ack the id cannot be
// destroyed, and what it calls (rdma_init_qp_attr, rdma_establish) only
// reads the id.
#include <ibev/cm/cm_id.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ibev/core/failure.h>
#include <ibev/core/route.h>

namespace ibev {
namespace {

const char* state_name(ibv_qp_state state) {
  switch (state) {
    case IBV_QPS_INIT:
      return "INIT";
    case IBV_QPS_RTR:
      return "RTR";
    case IBV_QPS_RTS:
      return "RTS";
    default:
      return "?";
  }
}

const char* modify_step(ibv_qp_state state) {
  switch (state) {
    case IBV_QPS_INIT:
      return "ibv_modify_qp(INIT)";
    case IBV_QPS_RTR:
      return "ibv_modify_qp(RTR)";
    case IBV_QPS_RTS:
      return "ibv_modify_qp(RTS)";
    default:
      return "ibv_modify_qp";
  }
}

// One step of the CM's QP state machine, with the attributes the CM computes
// for it (rdma_init_qp_attr), as librdmacm steps a QP of rdma_create_qp.
// `rd_atomic`: max_dest_rd_atomic at RTR, max_rd_atomic at RTS.
void move_qp(rdma_cm_id* id, QueuePair& qp, ibv_qp_state state,
             std::optional<std::uint8_t> rd_atomic = std::nullopt) {
  ibv_qp_attr attr{};
  int mask = 0;
  attr.qp_state = state;
  if (rdma_init_qp_attr(id, &attr, &mask) != 0) {
    throw_system_error(std::string("rdma_init_qp_attr(") + state_name(state) + ")", errno);
  }
  if (rd_atomic && state == IBV_QPS_RTR) attr.max_dest_rd_atomic = *rd_atomic;
  if (rd_atomic && state == IBV_QPS_RTS) attr.max_rd_atomic = *rd_atomic;
  qp.modify(attr, mask, modify_step(state));
}

// A connection that will not be: its QP stops (flushing what was posted).
void move_to_error(QueuePair& qp) noexcept {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  if (ibv_qp* raw = qp.get()) ibv_modify_qp(raw, &attr, IBV_QP_STATE);
}

// librdmacm opens a context of its own on every device its ids use, and
// closes a removed device's only when it has found the device gone from
// ibv_get_device_list (rdma_get_devices looks) and none of its ids is left
// on it. Until then the kernel's delete waits for that context, as for any.
void release_removed_devices() noexcept {
  int count = 0;
  if (ibv_context** contexts = rdma_get_devices(&count)) rdma_free_devices(contexts);
}

void copy_private_data(const void* data, std::uint8_t length, CmEvent& event) {
  if (data == nullptr || length == 0) return;
  const auto* bytes = static_cast<const std::uint8_t*>(data);
  event.private_data.assign(bytes, bytes + length);
}

}  // namespace

namespace detail {

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

// Serves up to `batch` events: each read, resolved, acked, then delivered.
void CmChannelState::serve() noexcept {
  for (unsigned i = 0; i < batch; ++i) {
    rdma_cm_event* raw = nullptr;
    std::unique_lock<std::mutex> getting(calls);
    const int got = rdma_get_cm_event(channel, &raw);
    const int error = errno;
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
    if (routed.refused != nullptr) rdma_destroy_id(routed.refused);
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
    auto made = exception_text([&] {
      const CmSubscriber& listener = *routed.to->subscriber;
      event.new_id = std::make_shared<CmId>(
          CmId::Token{}, std::move(channel_object), raw.id, listener.callback,
          listener.executor ? *listener.executor : Executor{});
    });
    if (made) {
      report(Failure::handler_threw("CmId for a CONNECT_REQUEST", std::move(*made)));
      bump(stats.requests_refused);
      routed.to = nullptr;
      routed.refused = raw.id;
      return routed;
    }
    event.id = routed.to->owner;
    std::lock_guard<std::mutex> lock(event.new_id->state_->mutex);
    event.new_id->state_->request = event.connection;
    return routed;
  }

  routed.to = find(raw.id);
  if (routed.to == nullptr) {
    bump(stats.unrouted);
    return routed;
  }
  event.id = routed.to->owner;
  switch (raw.event) {
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
      // Before the ack: until then rdma_destroy_id cannot free the id.
      establish(*routed.to, raw.id, event);
      break;
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      routed.to->device_removed = true;  // its close() lets librdmacm let go
      break;
    case RDMA_CM_EVENT_REJECTED:
    case RDMA_CM_EVENT_DISCONNECTED: {
      std::lock_guard<std::mutex> lock(routed.to->mutex);
      if (routed.to->connect_error) {
        routed.to = nullptr;  // the handler heard CONNECT_ERROR already
        break;
      }
      if (raw.event == RDMA_CM_EVENT_REJECTED && routed.to->qp) move_to_error(*routed.to->qp);
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
    std::lock_guard<std::mutex> lock(state.mutex);
    qp = state.qp;
  }
  if (qp == nullptr) return;  // connected without a QP: the handler goes on
  int error = 0;
  try {
    move_qp(id, *qp, IBV_QPS_INIT);
    move_qp(id, *qp, IBV_QPS_RTR);
    move_qp(id, *qp, IBV_QPS_RTS);
    if (rdma_establish(id) != 0) throw_system_error("rdma_establish", errno);
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
  std::lock_guard<std::mutex> lock(state.mutex);
  state.connect_error = true;
}

// The handler, unless its id was closed meanwhile (then it never runs again).
void CmChannelState::deliver(const Routed& routed) noexcept {
  if (routed.to == nullptr) return;
  call(routed.to->subscriber, routed.event, "CM event handler",
       [self = shared_from_this(), to = routed.to](Failure failure, const CmEvent& event) {
         failure.event_code = event.code;
         failure.object = to->id.load();
         self->report(std::move(failure));
       });
}

}  // namespace detail

// --- CmAddress ---

CmAddress CmAddress::parse(const std::string& host, std::uint16_t port) {
  CmAddress address;
  std::string text = host;
  if (text.size() > 2 && text.front() == '[' && text.back() == ']') {
    text = text.substr(1, text.size() - 2);
  }
  auto* v4 = reinterpret_cast<sockaddr_in*>(&address.storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&address.storage);
  if (inet_pton(AF_INET, text.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
  } else if (inet_pton(AF_INET6, text.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
  } else {
    throw std::invalid_argument("CmAddress::parse: '" + host +
                                "' is not a numeric IPv4 or IPv6 address");
  }
  return address;
}

std::uint16_t CmAddress::port() const noexcept {
  switch (storage.ss_family) {
    case AF_INET:
      return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
    case AF_INET6:
      return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
    default:
      return 0;
  }
}

std::string CmAddress::to_string() const {
  char text[INET6_ADDRSTRLEN] = {};
  switch (storage.ss_family) {
    case AF_INET:
      inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, text,
                sizeof text);
      return std::string(text) + ":" + std::to_string(port());
    case AF_INET6:
      inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr, text,
                sizeof text);
      return "[" + std::string(text) + "]:" + std::to_string(port());
    default:
      return "(no address)";
  }
}

namespace {

CmAddress copy_address(const sockaddr* address) {
  CmAddress copy;
  if (address == nullptr) return copy;
  const std::size_t length = address->sa_family == AF_INET    ? sizeof(sockaddr_in)
                             : address->sa_family == AF_INET6 ? sizeof(sockaddr_in6)
                                                              : 0;
  std::memcpy(&copy.storage, address, length);
  return copy;
}

// Only the CM's id knows its device before a QP is needed; a QP for it must
// be an RC QP of that device (by name: each library opens its own context).
void require_connectable(rdma_cm_id* id, const QueuePair& qp, const char* call) {
  ibv_qp* raw = qp.get();
  if (raw == nullptr) throw_system_error(call, ENODEV);
  if (raw->qp_type != IBV_QPT_RC) {
    throw std::invalid_argument(std::string(call) + ": only RC QPs connect through the CM here");
  }
  if (id->verbs == nullptr) {
    throw std::invalid_argument(std::string(call) +
                                ": the id has no device yet (resolve its address first)");
  }
  const std::string qp_device = ibv_get_device_name(raw->context->device);
  const std::string id_device = ibv_get_device_name(id->verbs->device);
  if (qp_device != id_device) {
    throw std::invalid_argument(std::string(call) + ": the QP is on " + qp_device + ", the id on " +
                                id_device);
  }
}

rdma_conn_param conn_param(const CmConnectOptions& options, const QueuePair& qp, const char* call) {
  if (options.private_data.size() > 255) {
    throw std::invalid_argument(std::string(call) + ": private data of " +
                                std::to_string(options.private_data.size()) +
                                " bytes (255 at most; the CM's own limit is lower)");
  }
  rdma_conn_param param{};
  param.private_data = options.private_data.empty() ? nullptr : options.private_data.data();
  param.private_data_len = static_cast<std::uint8_t>(options.private_data.size());
  param.responder_resources = options.responder_resources.value_or(RDMA_MAX_RESP_RES);
  param.initiator_depth = options.initiator_depth.value_or(RDMA_MAX_INIT_DEPTH);
  param.retry_count = options.retry_count;
  param.rnr_retry_count = options.rnr_retry_count;
  param.srq = qp.get()->srq != nullptr ? 1 : 0;
  param.qp_num = qp.get()->qp_num;
  return param;
}

}  // namespace

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
          release_removed_devices();
          auto state = weak.lock();
          if (state == nullptr) return;
          std::vector<Handle> later;
          for (const int delay : {100, 500, 2000}) {
            later.push_back(dispatcher.call_after(std::chrono::milliseconds(delay),
                                                  [] { release_removed_devices(); }));
          }
          // An earlier removal's, replaced (on this thread: no wait).
          std::vector<Handle> earlier;
          std::lock_guard<std::mutex> lock(state->mutex);
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

// --- CmId ---

std::shared_ptr<CmId> CmId::create(std::shared_ptr<CmEventChannel> channel, CmHandler handler,
                                   Options options) {
  if (channel == nullptr) throw std::invalid_argument("CmId::create: the channel is null");
  if (!handler) throw std::invalid_argument("CmId::create: the handler is empty");
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(channel->get(), &id, nullptr, options.port_space) != 0) {
    throw_system_error("rdma_create_id", errno);
  }
  return std::make_shared<CmId>(Token{}, std::move(channel), id, std::move(handler),
                                std::move(options.executor));
}

CmId::CmId(Token, std::shared_ptr<CmEventChannel> channel, rdma_cm_id* id, CmHandler handler,
           Executor executor)
    : channel_(std::move(channel)),
      state_(std::make_shared<detail::CmIdState>(id, std::move(handler), std::move(executor))) {
  state_->owner = this;
  channel_->state_->add(id, state_);
}

CmId::~CmId() { close(); }

rdma_cm_id* CmId::get() const noexcept { return state_->id.load(); }

CmId::Locked CmId::lock_id(const char* verb) const {
  std::unique_lock<std::mutex> lock(channel_->state_->calls);
  rdma_cm_id* id = get();
  if (id == nullptr) throw_system_error(verb, ENODEV);
  return {std::move(lock), id};
}

// A handler running now may still use the id (it is waited for, unless this
// is that handler); the id goes after it, under the call lock.
void CmId::close() noexcept {
  if (channel_->state_->inherited()) {
    // A forked child's copy: the parent's id, forgotten, not destroyed. Its
    // locks and its handler's guard are as the parent's threads left them
    // at the fork (a handler running then never returns here): nothing of
    // them is taken or waited for, and no other thread is left to race.
    if (closing_.exchange(true)) return;
    state_->id.store(nullptr);
    state_->qp.reset();
    closed_ = true;
    return;
  }
  if (closing_.exchange(true)) {
    // Another close() runs. From inside this id's handler, return (that one
    // waits for this call to end, unless it is this call); from anywhere
    // else, wait for it to finish and for the handler, as it does.
    detail::CallGuard& guard = state_->subscriber->guard;
    if (guard.running_here()) return;
    std::unique_lock<std::mutex> lock(close_mutex_);
    closed_changed_.wait(lock, [this] { return closed_; });
    lock.unlock();
    guard.wait_idle();
    return;
  }
  rdma_cm_id* id = get();
  channel_->state_->remove(id);  // an event read from now on is not routed
  state_->subscriber->guard.close();
  state_->subscriber->guard.wait_idle();
  {
    std::lock_guard<std::mutex> calls(channel_->state_->calls);
    state_->id.store(nullptr);
    if (rdma_destroy_id(id) != 0) {
      Failure failure = Failure::verb_failed("rdma_destroy_id", errno);
      failure.kind = Failure::Kind::kDestroyFailed;
      failure.object = id;
      channel_->state_->report(std::move(failure));
    }
  }
  if (state_->device_removed) release_removed_devices();
  std::shared_ptr<QueuePair> qp;  // let go outside the lock
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    qp.swap(state_->qp);
  }
  qp.reset();
  {
    std::lock_guard<std::mutex> lock(close_mutex_);
    closed_ = true;
  }
  closed_changed_.notify_all();
}

void CmId::resolve_addr(const CmAddress* source, const CmAddress& destination,
                        std::chrono::milliseconds timeout) {
  auto [lock, id] = lock_id("rdma_resolve_addr");
  sockaddr* src = source != nullptr ? const_cast<sockaddr*>(source->get()) : nullptr;
  if (rdma_resolve_addr(id, src, const_cast<sockaddr*>(destination.get()),
                        static_cast<int>(timeout.count())) != 0) {
    throw_system_error("rdma_resolve_addr", errno);
  }
}

void CmId::resolve_route(std::chrono::milliseconds timeout) {
  auto [lock, id] = lock_id("rdma_resolve_route");
  if (rdma_resolve_route(id, static_cast<int>(timeout.count())) != 0) {
    throw_system_error("rdma_resolve_route", errno);
  }
}

void CmId::listen(const CmAddress& address, int backlog) {
  auto [lock, id] = lock_id("rdma_bind_addr");
  if (rdma_bind_addr(id, const_cast<sockaddr*>(address.get())) != 0) {
    throw_system_error("rdma_bind_addr", errno);
  }
  if (rdma_listen(id, backlog) != 0) throw_system_error("rdma_listen", errno);
}

void CmId::init_qp(QueuePair& qp) {
  auto [lock, id] = lock_id("rdma_init_qp_attr");
  require_connectable(id, qp, "CmId::init_qp");
  move_qp(id, qp, IBV_QPS_INIT);
}

void CmId::connect(std::shared_ptr<QueuePair> qp, const CmConnectOptions& options) {
  auto [lock, id] = lock_id("rdma_connect");
  if (qp == nullptr) throw std::invalid_argument("CmId::connect: the QP is null");
  require_connectable(id, *qp, "CmId::connect");
  rdma_conn_param param = conn_param(options, *qp, "CmId::connect");
  move_qp(id, *qp, IBV_QPS_INIT);
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->qp = qp;
    state_->connect_error = false;
  }
  if (rdma_connect(id, &param) != 0) {
    const int error = errno;
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->qp.reset();
    throw_system_error("rdma_connect", error);
  }
}

void CmId::accept(std::shared_ptr<QueuePair> qp, const CmConnectOptions& options) {
  auto [lock, id] = lock_id("rdma_accept");
  if (qp == nullptr) throw std::invalid_argument("CmId::accept: the QP is null");
  require_connectable(id, *qp, "CmId::accept");
  rdma_conn_param param = conn_param(options, *qp, "CmId::accept");
  ibv_device_attr device{};
  if (const int rc = ibv_query_device(qp->get()->context, &device); rc != 0) {
    throw_system_error("ibv_query_device", rc);
  }
  CmConnection request;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    request = state_->request;
  }
  // What the reply says and what the QP is set to agree: the least of the
  // peer's ask and the device's limit, unless the caller chose.
  const auto limit = [](std::uint8_t asked, int device_max) {
    return static_cast<std::uint8_t>(std::min<int>(asked, device_max));
  };
  param.responder_resources = options.responder_resources.value_or(
      limit(request.responder_resources, device.max_qp_rd_atom));
  param.initiator_depth =
      options.initiator_depth.value_or(limit(request.initiator_depth, device.max_qp_init_rd_atom));
  try {
    move_qp(id, *qp, IBV_QPS_INIT);
    move_qp(id, *qp, IBV_QPS_RTR, param.responder_resources);
    move_qp(id, *qp, IBV_QPS_RTS, param.initiator_depth);
  } catch (...) {
    move_to_error(*qp);
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->qp = qp;
  }
  if (rdma_accept(id, &param) != 0) {
    const int error = errno;
    move_to_error(*qp);
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->qp.reset();
    throw_system_error("rdma_accept", error);
  }
}

void CmId::reject(const std::vector<std::uint8_t>& private_data) {
  auto [lock, id] = lock_id("rdma_reject");
  if (private_data.size() > 255) {
    throw std::invalid_argument("CmId::reject: private data of " +
                                std::to_string(private_data.size()) +
                                " bytes (255 at most; the CM's own limit is lower)");
  }
  if (rdma_reject(id, private_data.empty() ? nullptr : private_data.data(),
                  static_cast<std::uint8_t>(private_data.size())) != 0) {
    throw_system_error("rdma_reject", errno);
  }
}

void CmId::disconnect() {
  auto [lock, id] = lock_id("rdma_disconnect");
  // As librdmacm's own shutdown: the QP stops before the peer is told.
  if (auto qp = queue_pair()) move_to_error(*qp);
  if (rdma_disconnect(id) != 0) throw_system_error("rdma_disconnect", errno);
}

std::string CmId::device_name() const {
  std::lock_guard<std::mutex> lock(channel_->state_->calls);
  rdma_cm_id* id = get();
  if (id == nullptr || id->verbs == nullptr) return {};
  return ibv_get_device_name(id->verbs->device);
}

std::uint8_t CmId::port_num() const { return lock_id("CmId::port_num").id->port_num; }

CmAddress CmId::local_address() const {
  return copy_address(rdma_get_local_addr(lock_id("rdma_get_local_addr").id));
}

CmAddress CmId::peer_address() const {
  return copy_address(rdma_get_peer_addr(lock_id("rdma_get_peer_addr").id));
}

std::shared_ptr<QueuePair> CmId::queue_pair() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->qp;
}

}  // namespace ibev
