// CmSession and CmAcceptor: the session's header in the private data, the
// acceptor, and the public classes. A session's own path, attempt by
// attempt, is its link's (cm_link.h, cm_link.cc). The acceptor: a request
// is routed by the session id in its private data's header to the session
// that id names (or a new one), and its new id rerouted there.
//
// Locking: CmAcceptorState::mutex and CmLink::mutex, never both, and
// nothing under either: no CM call, no health call, no callback and no id
// closed (closing an id waits for its running handler, which may be waiting
// for that lock).
#include <ibev/cm/cm_session.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

#include <ibev/core/failure.h>
#include "cm_link.h"

namespace ibev {
namespace detail {

namespace {

// The header ahead of the application's private data: "ibev", version 1,
// three bytes reserved, the session's id big-endian.
constexpr std::uint8_t kMagic[4] = {'i', 'b', 'e', 'v'};
constexpr std::uint8_t kVersion = 1;

std::vector<std::uint8_t> with_header(std::uint64_t id, const std::vector<std::uint8_t>& data) {
  std::vector<std::uint8_t> bytes(CmSession::kHeaderBytes, 0);
  std::copy(std::begin(kMagic), std::end(kMagic), bytes.begin());
  bytes[4] = kVersion;
  for (int i = 0; i < 8; ++i) bytes[8 + i] = static_cast<std::uint8_t>(id >> (56 - 8 * i));
  bytes.insert(bytes.end(), data.begin(), data.end());
  return bytes;
}

std::optional<std::uint64_t> id_of(const std::vector<std::uint8_t>& data) {
  if (data.size() < CmSession::kHeaderBytes || !std::equal(std::begin(kMagic), std::end(kMagic),
                                                          data.begin()) ||
      data[4] != kVersion) {
    return std::nullopt;
  }
  std::uint64_t id = 0;
  for (int i = 0; i < 8; ++i) id = (id << 8) | data[8 + i];
  if (id == 0) return std::nullopt;
  return id;
}

}  // namespace



struct CmAcceptorState : std::enable_shared_from_this<CmAcceptorState> {
  // A request: for the live session it names, or a new one. Its new id is
  // rerouted to that session, whose events then reach it without passing
  // here.
  void request(const CmEvent& event) {
    const auto named = id_of(event.private_data);
    if (!named) {
      try {
        const std::string why = "ibev: no session id";
        event.new_id->reject(std::vector<std::uint8_t>(why.begin(), why.end()));
      } catch (const std::exception&) {
      }
      return;
    }
    std::shared_ptr<CmLink> link;
    {
      MutexLock lock(mutex);
      auto found = sessions.find(*named);
      if (found != sessions.end()) link = found->second.lock();
    }
    if (link && link->live()) {
      event.new_id->reroute(link->hearing());
      return link->requested(event.new_id);
    }
    std::shared_ptr<CmSession> made;
    try {
      made = make_session(*named, event.new_id);
    } catch (const std::exception& e) {
      channel->dispatcher().registry().report(
          Failure::verb_failed("CmAcceptor: a new session", errno_of(e), e.what()));
      return;  // the request dropped: rejected
    }
    on_session(made);
  }

  std::shared_ptr<CmSession> make_session(std::uint64_t named,
                                          const std::shared_ptr<CmId>& request) {
    auto link = std::make_shared<CmLink>(CmLink::Role::kPassive, channel, named, options.make_qp,
                                         options.accept, options.connect_timeout);
    {
      MutexLock lock(link->mutex);  // no one else has it yet
      link->waiting = request;
    }
    link->on_close = [weak = weak_from_this(), named, weak_link = std::weak_ptr<CmLink>(link)] {
      if (auto self = weak.lock()) self->forget(named, weak_link);
    };
    auto health = session_health(
        channel->dispatcher(), link,
        [change_handler = on_change, named](const HealthChange& change) {
          change_handler(named, change);
        },
        options.health);
    request->reroute(link->hearing());
    MutexLock lock(mutex);
    sessions[named] = link;
    return std::make_shared<CmSession>(CmSession::Token{}, link, health);
  }

  static bool same(const std::weak_ptr<CmLink>& a, const std::weak_ptr<CmLink>& b) {
    return !a.owner_before(b) && !b.owner_before(a);
  }

  // The session `named` is failed or closed: a request naming it makes a
  // new one.
  void forget(std::uint64_t named, const std::weak_ptr<CmLink>& link) {
    MutexLock lock(mutex);
    auto found = sessions.find(named);
    if (found == sessions.end() || !same(found->second, link)) {
      return;  // another session has the id now
    }
    sessions.erase(found);
  }

  // The listener's events; a new id's reach here only until it is rerouted.
  void heard(const CmEvent& event) {
    if (event.code == RDMA_CM_EVENT_CONNECT_REQUEST) return request(event);
    auto listening = listener.lock();
    if (listening && listening.get() == event.id &&
        event.code == RDMA_CM_EVENT_DEVICE_REMOVAL) {
      // Closed, so the device can go; nothing is accepted here any more.
      channel->dispatcher().registry().report(Failure::verb_failed(
          "CmAcceptor", ENODEV, "the listener's device was removed: it listens no more"));
      listening->close();
    }
  }

  std::shared_ptr<CmEventChannel> channel;
  std::weak_ptr<CmId> listener;  // the CmAcceptor holds it
  CmAcceptor::OnSession on_session;
  CmAcceptor::OnChange on_change;
  CmAcceptor::Options options;
  Mutex mutex;
  // The newest of each id.
  std::map<std::uint64_t, std::weak_ptr<CmLink>> sessions IBEV_GUARDED_BY(mutex);
};

}  // namespace detail

// --- CmSession ---

std::shared_ptr<CmSession> CmSession::connect(std::shared_ptr<CmEventChannel> channel,
                                                    const CmAddress& destination,
                                                    HealthHandler on_change, Options options) {
  const std::string verb = "CmSession::connect";
  if (!channel) throw std::invalid_argument(verb + ": the channel is null");
  if (!on_change) throw std::invalid_argument(verb + ": the handler is empty");
  if (!options.make_qp) throw std::invalid_argument(verb + ": MakeQp is empty");
  if (options.id == 0) throw std::invalid_argument(verb + ": a session's id is nonzero");
  if (options.connect_timeout.count() <= 0 || options.resolve_timeout.count() <= 0) {
    throw std::invalid_argument(verb + ": a timeout is above 0");
  }
  constexpr std::size_t kMost = kRequestDataBytes - kHeaderBytes;
  if (options.connect.private_data.size() > kMost) {
    throw std::invalid_argument(verb + ": private data of " +
                                std::to_string(options.connect.private_data.size()) +
                                " bytes (" + std::to_string(kMost) +
                                " at most after the session's header)");
  }
  ConnectionHealth::validate(verb, options.health);
  CmConnectOptions connect = options.connect;
  connect.private_data = detail::with_header(options.id, options.connect.private_data);
  auto link = std::make_shared<detail::CmLink>(detail::CmLink::Role::kActive, channel, options.id,
                                               std::move(options.make_qp), std::move(connect),
                                               options.connect_timeout);
  link->destination = destination;
  link->source = options.source;
  link->resolve_timeout = options.resolve_timeout;
  link->executor = options.health.executor;
  auto health = detail::session_health(channel->dispatcher(), link, std::move(on_change),
                                       std::move(options.health));
  return std::make_shared<CmSession>(Token{}, std::move(link), std::move(health));
}

CmSession::CmSession(Token, std::shared_ptr<detail::CmLink> link,
                           std::shared_ptr<ConnectionHealth> health)
    : link_(std::move(link)), health_(std::move(health)) {}

CmSession::~CmSession() { close(); }

std::uint64_t CmSession::id() const noexcept { return link_->id; }

// The health first: no attempt starts after it; then the ids.
void CmSession::close() noexcept {
  health_->close();
  link_->close();
}

// --- CmAcceptor ---

std::shared_ptr<CmAcceptor> CmAcceptor::listen(std::shared_ptr<CmEventChannel> channel,
                                               const CmAddress& address,
                                               OnSession on_session, OnChange on_change,
                                               Options options) {
  const std::string verb = "CmAcceptor::listen";
  if (!channel) throw std::invalid_argument(verb + ": the channel is null");
  if (!on_session || !on_change) {
    throw std::invalid_argument(verb + ": a callback is empty");
  }
  if (!options.make_qp) throw std::invalid_argument(verb + ": MakeQp is empty");
  if (options.connect_timeout.count() <= 0) {
    throw std::invalid_argument(verb + ": a timeout is above 0");
  }
  ConnectionHealth::validate(verb, options.health);
  auto state = std::make_shared<detail::CmAcceptorState>();
  state->channel = channel;
  state->on_session = std::move(on_session);
  state->on_change = std::move(on_change);
  state->options = std::move(options);
  // Held by the listener's handler, which a request's new id has too until
  // it is rerouted to its session: the sessions go on without the acceptor.
  auto listener = CmId::create(channel, [state](const CmEvent& event) { state->heard(event); });
  state->listener = listener;
  listener->listen(address, state->options.backlog);
  return std::make_shared<CmAcceptor>(Token{}, std::move(state), std::move(listener));
}

CmAcceptor::CmAcceptor(Token, std::shared_ptr<detail::CmAcceptorState> state,
                       std::shared_ptr<CmId> listener)
    : state_(std::move(state)), listener_(std::move(listener)) {}

CmAcceptor::~CmAcceptor() { close(); }

CmAddress CmAcceptor::local_address() const { return listener_->local_address(); }

std::size_t CmAcceptor::sessions() const {
  detail::MutexLock lock(state_->mutex);
  return static_cast<std::size_t>(
      std::count_if(state_->sessions.begin(), state_->sessions.end(),
                    [](const auto& entry) { return !entry.second.expired(); }));
}

void CmAcceptor::close() noexcept { listener_->close(); }

}  // namespace ibev
