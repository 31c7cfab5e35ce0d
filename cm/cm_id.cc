// CmId's calls and CmAddress. Each librdmacm call on an id is made under its
// channel's `calls` lock (cm_channel.cc says why, and the rest of the
// locking); close() waits for a running handler holding no lock.
#include <ibev/cm/cm_id.h>

#include <arpa/inet.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <ibev/cm/cm_devices.h>
#include <ibev/core/failure.h>
#include "cm_state.h"

namespace ibev {

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
    : channel_(std::move(channel)), state_(std::make_shared<detail::CmIdState>(id)) {
  state_->owner = this;
  routed_ = route_to(std::move(handler), std::move(executor));
}

Handle CmId::route_to(CmHandler handler, Executor executor) {
  return channel_->state_->ids.add(
      detail::CmIdKey(get()),
      std::make_shared<detail::CmRoute>(state_, std::move(handler), std::move(executor)));
}

// The new route first: an event resolved from then on finds it, the newest
// (cm_state.h), and none finds neither. The old one's release is outside
// the lock, which close() takes: its running call may be closing the id.
void CmId::reroute(CmHandler handler, Executor executor) {
  if (!handler) throw std::invalid_argument("CmId::reroute: the handler is empty");
  Handle old;
  {
    detail::MutexLock lock(close_mutex_);
    if (closing_.load()) throw_system_error("CmId::reroute", ENODEV);
    old = std::exchange(routed_, route_to(std::move(handler), std::move(executor)));
  }
  old.release();
}

CmId::~CmId() { close(); }

rdma_cm_id* CmId::get() const noexcept { return state_->id.load(); }

CmId::Locked CmId::lock_id(const char* verb) const {
  std::unique_lock<detail::Mutex> lock(channel_->state_->calls);
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
    // at the fork (a handler running then never returns here): releasing
    // the subscription takes and waits for nothing of them
    // (core/process.h), and no other thread is left to race.
    if (closing_.exchange(true)) return;
    // So are what those locks guard: touched without them here (and no
    // reroute() follows: closing_).
    [&]() IBEV_NO_THREAD_SAFETY_ANALYSIS {
      routed_.release();
      state_->id.store(nullptr);
      state_->qp.reset();
      closed_ = true;
    }();
    return;
  }
  if (closing_.exchange(true)) {
    // Another close() runs. From inside this id's handler, return (that one
    // waits for this call to end, unless it is this call); from anywhere
    // else, wait for it to finish and for the handler, as it does.
    detail::CallGuard& calls = state_->calls;
    if (calls.running_here()) return;
    detail::UniqueLock lock(close_mutex_);
    closed_changed_.wait(lock.native(), [this]() IBEV_REQUIRES(close_mutex_) { return closed_; });
    lock.unlock();
    calls.wait_idle();
    return;
  }
  rdma_cm_id* id = get();
  // An event read from now on is not routed, and the handler has returned
  // (unless this is it) and never runs again: by this route, or by one a
  // reroute() is letting go of.
  Handle routed;
  {
    detail::MutexLock lock(close_mutex_);
    routed = std::move(routed_);
  }
  routed.release();
  state_->calls.close();
  state_->calls.wait_idle();
  {
    detail::MutexLock calls(channel_->state_->calls);
    state_->id.store(nullptr);
    if (detail::destroy_id(id) != 0) {
      Failure failure = Failure::verb_failed("rdma_destroy_id", errno);
      failure.kind = Failure::Kind::kDestroyFailed;
      failure.object = id;
      channel_->state_->report(std::move(failure));
    }
  }
  if (state_->device_removed) detail::release_removed_devices();
  std::shared_ptr<QueuePair> qp;  // let go outside the lock
  {
    detail::MutexLock lock(state_->mutex);
    qp.swap(state_->qp);
  }
  qp.reset();
  {
    detail::MutexLock lock(close_mutex_);
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
  detail::move_qp(id, qp, IBV_QPS_INIT);
}

void CmId::connect(std::shared_ptr<QueuePair> qp, const CmConnectOptions& options) {
  auto [lock, id] = lock_id("rdma_connect");
  if (qp == nullptr) throw std::invalid_argument("CmId::connect: the QP is null");
  require_connectable(id, *qp, "CmId::connect");
  rdma_conn_param param = conn_param(options, *qp, "CmId::connect");
  detail::move_qp(id, *qp, IBV_QPS_INIT);
  {
    detail::MutexLock lock(state_->mutex);
    state_->qp = qp;
    state_->connect_error = false;
  }
  if (rdma_connect(id, &param) != 0) {
    const int error = errno;
    detail::MutexLock lock(state_->mutex);
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
    detail::MutexLock lock(state_->mutex);
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
    detail::move_qp(id, *qp, IBV_QPS_INIT);
    detail::move_qp(id, *qp, IBV_QPS_RTR, param.responder_resources);
    detail::move_qp(id, *qp, IBV_QPS_RTS, param.initiator_depth);
  } catch (...) {
    detail::move_to_error(*qp);
    throw;
  }
  {
    detail::MutexLock lock(state_->mutex);
    state_->qp = qp;
  }
  if (rdma_accept(id, &param) != 0) {
    const int error = errno;
    detail::move_to_error(*qp);
    detail::MutexLock lock(state_->mutex);
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
  if (auto qp = queue_pair()) detail::move_to_error(*qp);
  if (rdma_disconnect(id) != 0) throw_system_error("rdma_disconnect", errno);
}

std::string CmId::device_name() const {
  detail::MutexLock lock(channel_->state_->calls);
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
  detail::MutexLock lock(state_->mutex);
  return state_->qp;
}

}  // namespace ibev
