// A session's path, top-down: its health (Mode::kReconnect) calls
// attempt() once per attempt, after the old QP is drained; the attempt
// closes the old id and makes the new one (active: resolve, route, MakeQp,
// connect; passive: MakeQp, accept the peer's request, or wait for one);
// heard() takes the id's CM events, and ESTABLISHED replaces the health's
// QP, bringing the session up. A CM event of an id the session has moved
// on from is not its news. Then the acceptor: a request is routed by the
// session id in its private data's header, and its new id rerouted there.
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

// One session's CM side: the id of the current attempt (or connection),
// the attempt in progress, and (passive) a peer's request waiting for one.
// A step names its attempt by the recovery's step (RecoveryAttempt::step,
// the health's one staleness token): made for an attempt no longer in
// progress (a late event, a timer), it does nothing.
struct CmLink : std::enable_shared_from_this<CmLink> {
  enum class Role { kActive, kPassive };

  CmLink(Role r, std::shared_ptr<CmEventChannel> c, std::uint64_t i, MakeQp m,
         CmConnectOptions o, std::chrono::milliseconds t)
      : role(r),
        channel(std::move(c)),
        id(i),
        make_qp(std::move(m)),
        connect(std::move(o)),
        connect_timeout(t) {}

  // The health's reconnect: a new attempt, the old QP drained. The old id
  // goes (and with it the CM's hold on the old QP).
  void attempt(const RecoveryAttempt& next) {
    std::shared_ptr<CmId> old;
    std::shared_ptr<CmId> request;
    std::uint64_t at;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (closed) return;  // dropped: abandoned, and stale anyway
      at = next.step();
      in_progress = next;
      std::swap(old, current);
      if (role == Role::kPassive) {
        std::swap(request, waiting);
        current = request;  // accepting it from now on: a newer request fails this attempt
      }
    }
    hang_up(old);
    if (role == Role::kActive) return resolve(at, next);
    if (request) accept(at, std::move(request), next);
    // else: waiting for the peer's request (or give_up_after)
  }

  // Active: a new id, and the address resolved (ADDR_RESOLVED follows).
  void resolve(std::uint64_t at, const RecoveryAttempt& attempt) {
    try {
      auto next = CmId::create(
          channel, hearing(),
          CmId::Options{RDMA_PS_TCP, executor});
      if (!adopt(at, next)) return next->close();
      next->resolve_addr(source ? &*source : nullptr, destination, resolve_timeout);
    } catch (const std::exception& e) {
      fail(at, attempt, e.what());
    }
  }

  // Passive: `request`'s QP made and accepted (ESTABLISHED follows).
  void accept(std::uint64_t at, std::shared_ptr<CmId> request, const RecoveryAttempt& attempt) {
    try {
      if (!adopt(at, request)) return;  // dropped: rejected
      auto qp = made(*request, attempt);
      request->accept(std::move(qp), connect);
    } catch (const std::exception& e) {
      fail(at, attempt, e.what());
    }
  }

  // `next` is attempt `at`'s id, unless the session moved on or closed
  // meanwhile; it has connect_timeout to be ESTABLISHED.
  bool adopt(std::uint64_t at, const std::shared_ptr<CmId>& next) {
    Handle timer = channel->dispatcher().call_after(connect_timeout, [weak = weak_from_this(), at] {
      if (auto self = weak.lock()) self->timed_out(at);
    });
    std::lock_guard<std::mutex> lock(mutex);
    if (!attempting(at)) return false;
    current = next;
    std::swap(timer, connect_timer);
    return true;
  }  // the timer replaced (or the unused one) released after the lock

  // Attempt `at` was not ESTABLISHED in time: it failed. (The CM retries a
  // lost REQ or REP for about a minute, and a peer's CM may drop a request
  // it took for a duplicate of one it could not answer: the next attempt
  // sends a new one, and closes this id.)
  void timed_out(std::uint64_t at) noexcept {
    std::optional<RecoveryAttempt> attempt;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!attempting(at)) return;
      attempt = in_progress;
    }
    fail(at, *attempt, "not ESTABLISHED in " + std::to_string(connect_timeout.count()) + " ms");
  }

  std::shared_ptr<QueuePair> made(CmId& on, const RecoveryAttempt& attempt) {
    auto qp = make_qp(on, attempt);
    if (!qp) throw std::invalid_argument("MakeQp gave no QP");
    return qp;
  }

  // Attempt `at` is over: no timer, nothing in progress (unless a newer
  // attempt is).
  void settled(std::uint64_t at) noexcept {
    Handle timer;
    std::lock_guard<std::mutex> lock(mutex);
    if (!attempting(at)) return;
    in_progress.reset();
    std::swap(timer, connect_timer);
  }  // released after the lock

  // Attempt `at` failed, `why` (settled once: a second is EALREADY, ignored).
  void fail(std::uint64_t at, const RecoveryAttempt& attempt, const std::string& why) noexcept {
    settled(at);
    try {
      attempt.fail(why);
    } catch (const std::exception&) {
    }
  }

  // The handler of the session's ids (an acceptor's are rerouted to it).
  CmHandler hearing() {
    return [weak = weak_from_this()](const CmEvent& event) {
      if (auto self = weak.lock()) self->heard(event);
    };
  }

  // An event of the session's current id. A failure in handling it is a
  // failed attempt, or reported.
  void heard(const CmEvent& event) noexcept {
    try {
      hear(event);
    } catch (const std::exception& e) {
      channel->dispatcher().registry().report(
          Failure::verb_failed("CmSession: " + event.name(), errno_of(e), e.what()));
    }
  }

  void hear(const CmEvent& event) {
    std::shared_ptr<CmId> on;
    std::shared_ptr<CmId> gone;
    std::optional<RecoveryAttempt> attempt;
    std::shared_ptr<ConnectionHealth> told;
    std::uint64_t at = 0;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (closed) return;
      // A request not taken yet whose device is gone goes (so can the
      // device); whatever else it hears is the next attempt's to find.
      if (waiting && waiting.get() == event.id &&
          event.code == RDMA_CM_EVENT_DEVICE_REMOVAL) {
        std::swap(gone, waiting);
      } else if (current && current.get() == event.id) {
        on = current;
        attempt = in_progress;
        if (attempt) at = attempt->step();
        told = health.lock();
      }
    }
    if (gone) gone->close();
    if (!on) return;  // an id moved on from
    const std::string what = event.name() + (event.status != 0
                                                 ? " (status " + std::to_string(event.status) + ")"
                                                 : std::string());
    try {
      switch (event.code) {
        case RDMA_CM_EVENT_ADDR_RESOLVED:
          on->resolve_route(resolve_timeout);
          return;
        case RDMA_CM_EVENT_ROUTE_RESOLVED:
          if (attempt) on->connect(made(*on, *attempt), connect);
          return;
        case RDMA_CM_EVENT_ESTABLISHED:
          return established(at, on, attempt);
        case RDMA_CM_EVENT_DISCONNECTED:
          answer(*on);
          break;
        case RDMA_CM_EVENT_DEVICE_REMOVAL:
          forget(on);
          on->close();  // the device goes once its ids do
          break;
        default:
          break;
      }
    } catch (const std::exception& e) {
      if (attempt) fail(at, *attempt, what + ": " + e.what());
      return;
    }
    // A cause: during an attempt, the attempt's failure; else the health's.
    const bool error = event.code == RDMA_CM_EVENT_ADDR_ERROR ||
                       event.code == RDMA_CM_EVENT_ROUTE_ERROR;
    auto cause = health_cause_of_cm_event(event.code);
    if (!cause && !error) return;
    if (attempt) return fail(at, *attempt, what);
    if (cause && told) {
      cause->what = what;
      told->cause(std::move(*cause));
    }
  }

  // ESTABLISHED: the health runs on `on`'s QP from now on. A connection no
  // attempt takes (the recovery ended, or moved on) is disconnected and
  // closed at once, so the peer does not keep a half-dead one up.
  void established(std::uint64_t at, const std::shared_ptr<CmId>& on,
                   const std::optional<RecoveryAttempt>& attempt) {
    bool taken = false;
    if (attempt) {
      settled(at);
      try {
        attempt->replace(on->queue_pair());
        taken = true;
      } catch (const std::exception&) {
        // replace() failed the attempt (or it was over): the id is retired below.
      }
    }
    std::shared_ptr<CmId> dropped;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!taken && current == on) current.reset();
      if (taken) std::swap(dropped, waiting);  // a request older than this connection
    }
    if (dropped) dropped->close();  // rejected
    if (!taken) hang_up(on);
  }

  // An id let go: disconnected first if it was connected (so the peer hears
  // it now), then closed.
  static void hang_up(const std::shared_ptr<CmId>& on) noexcept {
    if (!on) return;
    if (on->queue_pair()) answer(*on);
    on->close();
  }

  // A disconnect answered, so the peer's ends now (one already made, or a
  // QP gone, is no news).
  static void answer(CmId& on) noexcept {
    try {
      on.disconnect();
    } catch (const std::exception&) {
    }
  }

  void forget(const std::shared_ptr<CmId>& on) {
    std::lock_guard<std::mutex> lock(mutex);
    if (current == on) current.reset();
  }

  // Passive: the peer asks again. Taken by the attempt waiting for it;
  // else kept for the next (a newer request replaces it), which starts now
  // (ConnectionHealth::retry_now). The peer asks again only once it has
  // given up its side: a request being accepted is dead (that attempt
  // fails, and the next, at once, takes this one), and a session that is
  // up goes down.
  void requested(std::shared_ptr<CmId> request) {
    std::optional<RecoveryAttempt> attempt;
    std::shared_ptr<ConnectionHealth> told;
    std::uint64_t at;
    bool accepting = false;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (closed) return;  // `request` dropped: rejected
      attempt = in_progress;
      at = attempt ? attempt->step() : 0;
      accepting = current != nullptr;
      told = health.lock();
    }
    // Taken by the attempt waiting for it, if it still is (a cause since
    // made it stale: the next attempt takes the request).
    if (attempt && !accepting && attempt->current()) {
      return accept(at, std::move(request), *attempt);
    }
    std::shared_ptr<CmId> dropped;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (closed) return;
      dropped = std::move(waiting);
      waiting = std::move(request);
    }
    if (dropped) dropped->close();  // rejected
    if (attempt && accepting) fail(at, *attempt, "the peer asked again");
    if (!told) return;
    if (told->state() == ConnectionState::kUp) {
      told->cause(HealthCause{HealthSource::kCmEvent, RDMA_CM_EVENT_CONNECT_REQUEST, 0,
                              "RDMA_CM_EVENT_CONNECT_REQUEST: the peer connects again"});
    } else {
      told->retry_now();
    }
  }

  // Neither closed nor failed: a request naming it is its.
  bool live() {
    std::shared_ptr<ConnectionHealth> told;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (closed) return false;
      told = health.lock();
    }
    return told && told->state() != ConnectionState::kFailed;
  }

  // The session's end (closed, or failed): no attempt after it; its ids go,
  // disconnected first, so that the peer hears it now.
  void close() noexcept {
    std::vector<std::shared_ptr<CmId>> ids;
    Handle timer;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (closed) return;
      closed = true;
      ids.push_back(std::move(current));
      ids.push_back(std::move(waiting));
      in_progress.reset();
      std::swap(timer, connect_timer);
    }
    for (auto& on : ids) hang_up(on);
    if (on_close) on_close();
  }

  // Under the lock: attempt `at` is the one in progress.
  bool attempting(std::uint64_t at) const { return !closed && in_progress && in_progress->step() == at; }

  const Role role;
  const std::shared_ptr<CmEventChannel> channel;
  const std::uint64_t id;
  const MakeQp make_qp;
  const CmConnectOptions connect;  // its private data with the session's header ahead (active)
  const std::chrono::milliseconds connect_timeout;
  // Active only.
  CmAddress destination;
  std::optional<CmAddress> source;
  std::chrono::milliseconds resolve_timeout{2000};
  Executor executor;

  std::mutex mutex;
  std::weak_ptr<ConnectionHealth> health;  // set once, before the first attempt can be up
  bool closed = false;
  std::optional<RecoveryAttempt> in_progress;
  std::shared_ptr<CmId> current;   // the attempt's id, or the connection's
  std::shared_ptr<CmId> waiting;   // passive: a request no attempt took yet
  Handle connect_timer;            // the attempt's id's time to be ESTABLISHED
  std::function<void()> on_close;  // passive: its acceptor forgets it (set once, at creation)
};

// The health a session's link steers: its recovery replaces the QP through
// the link, the state starts down (the first connect is the first attempt),
// and a failed session lets its ids go (the peer hears it) before the
// application's handler hears of it.
std::shared_ptr<ConnectionHealth> session_health(Dispatcher& dispatcher,
                                                 const std::shared_ptr<CmLink>& link,
                                                 HealthHandler on_change,
                                                 ConnectionHealth::Options options) {
  options.initial = ConnectionState::kDown;
  options.recovery.mode = ConnectionHealth::Options::Recovery::Mode::kReconnect;
  options.recovery.reconnect = [weak = std::weak_ptr<CmLink>(link)](const RecoveryAttempt& a) {
    if (auto self = weak.lock()) self->attempt(a);
  };
  auto health = ConnectionHealth::create(
      dispatcher,
      [weak = std::weak_ptr<CmLink>(link), on_change = std::move(on_change)](
          const HealthChange& change) {
        if (change.to == ConnectionState::kFailed) {
          if (auto self = weak.lock()) self->close();
        }
        on_change(change);
      },
      std::move(options));
  std::lock_guard<std::mutex> lock(link->mutex);
  link->health = health;
  return health;
}

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
      std::lock_guard<std::mutex> lock(mutex);
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
    link->waiting = request;
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
    std::lock_guard<std::mutex> lock(mutex);
    sessions[named] = link;
    return std::make_shared<CmSession>(CmSession::Token{}, link, health);
  }

  static bool same(const std::weak_ptr<CmLink>& a, const std::weak_ptr<CmLink>& b) {
    return !a.owner_before(b) && !b.owner_before(a);
  }

  // The session `named` is failed or closed: a request naming it makes a
  // new one.
  void forget(std::uint64_t named, const std::weak_ptr<CmLink>& link) {
    std::lock_guard<std::mutex> lock(mutex);
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
  std::mutex mutex;
  std::map<std::uint64_t, std::weak_ptr<CmLink>> sessions;  // the newest of each id
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
  std::lock_guard<std::mutex> lock(state_->mutex);
  return static_cast<std::size_t>(
      std::count_if(state_->sessions.begin(), state_->sessions.end(),
                    [](const auto& entry) { return !entry.second.expired(); }));
}

void CmAcceptor::close() noexcept { listener_->close(); }

}  // namespace ibev
