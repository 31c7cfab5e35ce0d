// One session's CM side (cm_link.cc), internal to cm/: the link a
// CmSession or a CmAcceptor's session steers through its ConnectionHealth.
// Locking: CmLink::mutex is a leaf (cm_link.cc says what never runs under
// it).
#ifndef IBEV_CM_CM_LINK_H_
#define IBEV_CM_CM_LINK_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <ibev/cm/cm_session.h>
#include <ibev/core/thread_annotations.h>

namespace ibev {
namespace detail {

// One session's CM side: the id of the current attempt (or connection),
// the attempt in progress, and (passive) a peer's request waiting for one.
// A step names its attempt by the recovery's step (RecoveryAttempt::step,
// the health's one staleness token): made for an attempt no longer in
// progress (a late event, a timer), it does nothing.
struct CmLink : std::enable_shared_from_this<CmLink> {
  enum class Role { kActive, kPassive };

  CmLink(Role r, std::shared_ptr<CmEventChannel> c, std::uint64_t i, MakeQp m, CmConnectOptions o,
         std::chrono::milliseconds t)
      : role(r),
        channel(std::move(c)),
        id(i),
        make_qp(std::move(m)),
        connect(std::move(o)),
        connect_timeout(t) {}

  // The health's reconnect: a new attempt, the old QP drained. The old id
  // goes (and with it the CM's hold on the old QP).
  void attempt(const RecoveryAttempt& next);

  // Active: a new id, and the address resolved (ADDR_RESOLVED follows).
  void resolve(std::uint64_t at, const RecoveryAttempt& attempt);

  // Passive: `request`'s QP made and accepted (ESTABLISHED follows).
  void accept(std::uint64_t at, std::shared_ptr<CmId> request, const RecoveryAttempt& attempt);

  // `next` is attempt `at`'s id, unless the session moved on or closed
  // meanwhile; it has connect_timeout to be ESTABLISHED.
  bool adopt(std::uint64_t at, const std::shared_ptr<CmId>& next);

  // Attempt `at` was not ESTABLISHED in time: it failed. (The CM retries a
  // lost REQ or REP for about a minute, and a peer's CM may drop a request
  // it took for a duplicate of one it could not answer: the next attempt
  // sends a new one, and closes this id.)
  void timed_out(std::uint64_t at) noexcept;

  std::shared_ptr<QueuePair> made(CmId& on, const RecoveryAttempt& attempt);

  // Attempt `at` is over: no timer, nothing in progress (unless a newer
  // attempt is).
  void settled(std::uint64_t at) noexcept;

  // Attempt `at` failed, `why` (settled once: a second is EALREADY, ignored).
  void fail(std::uint64_t at, const RecoveryAttempt& attempt, const std::string& why) noexcept;

  // The handler of the session's ids (an acceptor's are rerouted to it).
  CmHandler hearing();

  // An event of the session's current id. A failure in handling it is a
  // failed attempt, or reported.
  void heard(const CmEvent& event) noexcept;

  void hear(const CmEvent& event);

  // ESTABLISHED: the health runs on `on`'s QP from now on. A connection no
  // attempt takes (the recovery ended, or moved on) is disconnected and
  // closed at once, so the peer does not keep a half-dead one up.
  void established(std::uint64_t at, const std::shared_ptr<CmId>& on,
                   const std::optional<RecoveryAttempt>& attempt);

  // An id let go: disconnected first if it was connected (so the peer hears
  // it now), then closed.
  static void hang_up(const std::shared_ptr<CmId>& on) noexcept;

  // A disconnect answered, so the peer's ends now (one already made, or a
  // QP gone, is no news).
  static void answer(CmId& on) noexcept;

  void forget(const std::shared_ptr<CmId>& on);

  // Passive: the peer asks again. Taken by the attempt waiting for it;
  // else kept for the next (a newer request replaces it), which starts now
  // (ConnectionHealth::retry_now). The peer asks again only once it has
  // given up its side: a request being accepted is dead (that attempt
  // fails, and the next, at once, takes this one), and a session that is
  // up goes down.
  void requested(std::shared_ptr<CmId> request);

  // Neither closed nor failed: a request naming it is its.
  bool live();

  // The session's end (closed, or failed): no attempt after it; its ids go,
  // disconnected first, so that the peer hears it now.
  void close() noexcept;

  // Attempt `at` is the one in progress.
  bool attempting(std::uint64_t at) const IBEV_REQUIRES(mutex) {
    return !closed && in_progress && in_progress->step() == at;
  }

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

  Mutex mutex;
  // Set once, before the first attempt can be up.
  std::weak_ptr<ConnectionHealth> health IBEV_GUARDED_BY(mutex);
  bool closed IBEV_GUARDED_BY(mutex) = false;
  std::optional<RecoveryAttempt> in_progress IBEV_GUARDED_BY(mutex);
  // The attempt's id, or the connection's.
  std::shared_ptr<CmId> current IBEV_GUARDED_BY(mutex);
  // Passive: a request no attempt took yet.
  std::shared_ptr<CmId> waiting IBEV_GUARDED_BY(mutex);
  // The attempt's id's time to be ESTABLISHED.
  Handle connect_timer IBEV_GUARDED_BY(mutex);
  std::function<void()> on_close;  // passive: its acceptor forgets it (set once, at creation)
};

// The health a session's link steers: its recovery replaces the QP through
// the link, the state starts down (the first connect is the first attempt),
// and a failed session lets its ids go (the peer hears it) before the
// application's handler hears of it.
std::shared_ptr<ConnectionHealth> session_health(Dispatcher& dispatcher,
                                                 const std::shared_ptr<CmLink>& link,
                                                 HealthHandler on_change,
                                                 ConnectionHealth::Options options);

}  // namespace detail
}  // namespace ibev

#endif  // IBEV_CM_CM_LINK_H_
