// Sessions through the CM on soft-RoCE (cm/cm_session.h): a client's session
// that loses its QP is made again on a new one and the server takes it back
// as the same session; a server session whose peer restarts is the same
// session; one whose peer never returns fails after give_up_after, as does a
// client whose server is gone, also when it went between REP and RTU; bad
// input is refused, and a request without a session id rejected. Both sides
// run in this process on one rxe device, each with its own CQ and QPs.
#define BOOST_TEST_MODULE ibev_softroce_cm_session
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ibev/cm/cm_session.h>
#include <ibev/cm/test_seams.h>

#include "tests/softroce/cm_fixture.h"
#include "tests/softroce/rdma_fixture.h"
#include "tests/softroce/session_fixture.h"
#include "tests/softroce/verbs_fixture.h"
#include "tests/support/testing.h"

using namespace ibev;
using namespace ibev::testing;
using namespace std::chrono_literals;

namespace {

BOOST_TEST_GLOBAL_FIXTURE(NetdevAddress);  // d0's address, for rdma_cm

// "up", "down", ...: what a side's handler heard, in order, with the causes
// of its downs as "<side> cause: <what>".
void heard(Lines& log, const std::string& side, const HealthChange& change) {
  log.add(side + ": " + std::string(to_string(change.to)));
  if (change.to == ConnectionState::kDown || change.to == ConnectionState::kFailed) {
    log.add(side + " cause: " + change.cause.what);
  }
}

// Each attempt's QP for a Messenger: made on its endpoint's CQ, taken to INIT
// through the attempt's id, its receives posted. The Messenger sends on the
// latest (attempts and its completions run on the dispatching thread).
MakeQp qp_for(Env& env, Messenger& messenger) {
  return [&env, &messenger](CmId& id, const RecoveryAttempt&) {
    messenger.endpoint.qp = messenger.endpoint.make_qp(env);
    messenger.start(id);
    return messenger.endpoint.qp;
  };
}

// An acceptor on cm_host() whose sessions are kept, each with the one
// Messenger (a test here has one peer at a time).
struct SessionServer {
  explicit SessionServer(Env& env, std::shared_ptr<CmEventChannel> channel,
                  std::chrono::milliseconds give_up_after = 20s)
      : messenger(env) {
    CmAcceptor::Options options;
    options.make_qp = qp_for(env, messenger);
    options.health.recovery.policy = quick_recovery(give_up_after);
    acceptor = CmAcceptor::listen(
        std::move(channel), CmAddress::parse(cm_host(), 0),
        [this](const std::shared_ptr<CmSession>& session) {
          std::lock_guard<std::mutex> lock(mutex);
          sessions.push_back(session);
          log.add("server session " + std::to_string(session->id()));
        },
        [this](std::uint64_t, const HealthChange& change) { heard(log, "server", change); },
        options);
  }
  std::size_t kept() {
    std::lock_guard<std::mutex> lock(mutex);
    return sessions.size();
  }
  std::shared_ptr<CmSession> session(std::size_t at) {
    std::lock_guard<std::mutex> lock(mutex);
    return sessions.at(at);
  }
  std::uint16_t port() const { return acceptor->local_address().port(); }

  Lines log;
  Messenger messenger;
  std::mutex mutex;
  std::vector<std::shared_ptr<CmSession>> sessions;
  std::shared_ptr<CmAcceptor> acceptor;  // last: its callbacks use the above
};

struct SessionClient {
  SessionClient(Env& env, std::shared_ptr<CmEventChannel> channel, std::uint16_t port,
                std::uint64_t id = 42, std::chrono::milliseconds give_up_after = 20s,
                std::chrono::milliseconds connect_timeout = 5s)
      : messenger(env) {
    CmSession::Options options;
    options.id = id;
    options.connect_timeout = connect_timeout;
    options.make_qp = qp_for(env, messenger);
    options.health.recovery.policy = quick_recovery(give_up_after);
    session = CmSession::connect(
        std::move(channel), CmAddress::parse(cm_host(), port),
        [this](const HealthChange& change) { heard(log, "client", change); }, options);
  }

  Lines log;
  Messenger messenger;
  std::shared_ptr<CmSession> session;  // last: its handler uses the above
};

// A message each way over the sessions' current QPs.
void exchange(SessionClient& client, SessionServer& server, const std::string& text) {
  const auto at_server = server.messenger.log.count("received " + text);
  const auto at_client = client.messenger.log.count("received " + text);
  client.messenger.send(text);
  BOOST_REQUIRE_MESSAGE(server.messenger.log.wait_count("received " + text, at_server + 1, 20s),
                        server.messenger.log.text());
  server.messenger.send(text);
  BOOST_REQUIRE_MESSAGE(client.messenger.log.wait_count("received " + text, at_client + 1, 20s),
                        client.messenger.log.text());
}

std::vector<std::string> states(Lines& log, const std::string& side) {
  return log.starting_with(side + ": ");
}

// The causes that say the peer went (cm_session.h): its id destroyed after
// the RTU reached it, or before.
const std::string kDisconnected = "RDMA_CM_EVENT_DISCONNECTED";
const std::string kRejected = "RDMA_CM_EVENT_REJECTED (status 28)";

struct PeerGone {
  std::string cause;           // the client's first down's
  std::size_t server_ups = 0;  // the server's side before it went
};

// A client up, then its server gone for good (acceptor and session
// closed). Whichever of kDisconnected and kRejected the client hears, its
// session ends as cm_session.h promises: the peer heard gone once, the
// attempts after it find nobody listening, and after give_up_after it
// fails, once, with one record.
PeerGone client_outlives_its_server(Env& env, std::shared_ptr<CmEventChannel> channel) {
  auto server = std::make_unique<SessionServer>(env, channel);
  SessionClient client(env, channel, server->port(), 42, 1500ms);
  BOOST_REQUIRE_MESSAGE(client.log.wait_count("client: up", 1, 20s), client.log.text());
  PeerGone gone;
  gone.server_ups = server->log.count("server: up");
  server.reset();
  BOOST_REQUIRE_MESSAGE(client.log.wait_count("client: failed", 1, 20s), client.log.text());
  const auto causes = client.log.starting_with("client cause: ");
  BOOST_REQUIRE_MESSAGE(!causes.empty(), client.log.text());
  gone.cause = causes.front();
  BOOST_TEST(client.log.count("client cause: " + kDisconnected) +
                     client.log.count("client cause: " + kRejected) ==
                 1u,
             client.log.text());
  const auto lived = states(client.log, "client");
  const auto up = std::find(lived.begin(), lived.end(), "up");
  BOOST_TEST((up != lived.end() && up + 1 != lived.end() && *(up + 1) == "down"), joined(lived));
  BOOST_TEST(client.log.count("client: up") == 1u, client.log.text());
  BOOST_TEST(client.log.count("client: failed") == 1u, client.log.text());
  const auto errors = env.errors();
  BOOST_TEST(errors.size() == 1u, joined(errors));
  BOOST_TEST(joined(errors).find("not recovered in 1500 ms") != std::string::npos,
             joined(errors));
  return gone;
}

// While it lives, the first RTU sent is lost (cm/test_seams.h): its client
// is up, and the server's id stays between REP and RTU. Make it before the
// Env, so that the seam is set before the dispatching thread starts and
// reset after it ended.
class FirstRtuLost {
 public:
  FirstRtuLost() {
    calls_ = 0;
    detail::test_seams::lose_rtu = [](rdma_cm_id*) { return calls_.fetch_add(1) == 0; };
  }
  ~FirstRtuLost() { detail::test_seams::lose_rtu = nullptr; }
  FirstRtuLost(const FirstRtuLost&) = delete;
  FirstRtuLost& operator=(const FirstRtuLost&) = delete;
  // RTUs about to be sent (the first lost).
  int calls() const { return calls_.load(); }

 private:
  static std::atomic<int> calls_;
};
std::atomic<int> FirstRtuLost::calls_{0};

}  // namespace

// The client's QP fails (an injected QP_FATAL): its session drains it and
// connects again, through the CM, on a new QP; the server, whose own QP
// still works, hears its peer come back (a request naming the session, or
// the old id's disconnect) and accepts it into the same session. One down
// each, traffic on new QPs, one session at the server.
BOOST_AUTO_TEST_CASE(a_session_whose_qp_fails_is_made_again_and_taken_back_as_the_same) {
  Env env(test_device());
  auto channel = CmEventChannel::create(env.dispatcher);
  SessionServer server(env, channel);
  SessionClient client(env, channel, server.port());
  BOOST_REQUIRE_MESSAGE(client.log.wait_count("client: up", 1, 20s), client.log.text());
  BOOST_REQUIRE_MESSAGE(server.log.wait_count("server: up", 1, 20s), server.log.text());
  exchange(client, server, "before");
  const std::uint32_t client_qp = client.session->queue_pair()->qp_num();
  const std::uint32_t server_qp = server.session(0)->queue_pair()->qp_num();

  env.dispatcher.inject(env.device->context(), IBV_EVENT_QP_FATAL,
                        client.session->queue_pair()->get());
  BOOST_REQUIRE_MESSAGE(client.log.wait_count("client: up", 2, 20s), client.log.text());
  BOOST_REQUIRE_MESSAGE(server.log.wait_count("server: up", 2, 20s), server.log.text());
  exchange(client, server, "after");

  const std::vector<std::string> healed{"recovering", "up", "down", "recovering", "up"};
  BOOST_TEST(joined(states(client.log, "client")) == joined(healed), client.log.text());
  BOOST_TEST(joined(states(server.log, "server")) == joined(healed), server.log.text());
  BOOST_TEST(client.log.count("client cause: IBV_EVENT_QP_FATAL") == 1u);
  BOOST_TEST(server.log.count("server session 42") == 1u);
  BOOST_TEST(server.kept() == 1u);
  BOOST_TEST(server.acceptor->sessions() == 1u);
  BOOST_TEST(client.session->queue_pair()->qp_num() != client_qp);
  BOOST_TEST(server.session(0)->queue_pair()->qp_num() != server_qp);
  BOOST_TEST(env.errors().empty(), joined(env.errors()));
}

// Two clients on one acceptor, each its own session: the one whose QP
// fails is made again and taken back; the other, and its server side, hear
// nothing.
BOOST_AUTO_TEST_CASE(sessions_of_one_acceptor_are_told_apart_by_their_id) {
  Env env(test_device());
  auto channel = CmEventChannel::create(env.dispatcher);
  Lines log;
  std::mutex mutex;
  Messenger at_server(env);  // both sessions' QPs on its CQ
  // After the Messenger, so that the sessions (and their QPs) go first: its
  // CQ's handler writes to it for as long as a QP keeps the CQ.
  std::vector<std::shared_ptr<CmSession>> kept;
  CmAcceptor::Options options;
  options.make_qp = qp_for(env, at_server);
  options.health.recovery.policy = quick_recovery(20s);
  auto acceptor = CmAcceptor::listen(
      channel, CmAddress::parse(cm_host(), 0),
      [&](const std::shared_ptr<CmSession>& session) {
        std::lock_guard<std::mutex> lock(mutex);
        kept.push_back(session);
      },
      [&](std::uint64_t id, const HealthChange& change) {
        log.add("server " + std::to_string(id) + ": " + std::string(to_string(change.to)));
      },
      options);
  SessionClient one(env, channel, acceptor->local_address().port(), 1);
  SessionClient two(env, channel, acceptor->local_address().port(), 2);
  BOOST_REQUIRE_MESSAGE(log.wait_count("server 1: up", 1, 20s), log.text());
  BOOST_REQUIRE_MESSAGE(log.wait_count("server 2: up", 1, 20s), log.text());
  BOOST_REQUIRE_MESSAGE(two.log.wait_count("client: up", 1, 20s), two.log.text());

  env.dispatcher.inject(env.device->context(), IBV_EVENT_QP_FATAL,
                        one.session->queue_pair()->get());
  BOOST_REQUIRE_MESSAGE(log.wait_count("server 1: up", 2, 20s), log.text());
  BOOST_REQUIRE_MESSAGE(one.log.wait_count("client: up", 2, 20s), one.log.text());
  BOOST_TEST(log.count("server 2: up") == 1u, log.text());
  BOOST_TEST(log.count("server 2: down") == 0u, log.text());
  BOOST_TEST(two.log.count("client: down") == 0u, two.log.text());
  BOOST_TEST(acceptor->sessions() == 2u);
  {
    std::lock_guard<std::mutex> lock(mutex);
    BOOST_TEST(kept.size() == 2u);
  }
  BOOST_TEST(env.errors().empty(), joined(env.errors()));
}

// A client that goes (its session closed: the server hears DISCONNECTED)
// and comes back as a new process would, with a new session of the same id:
// the server's session goes down, waits, and takes the new client in. A
// client that never returns leaves the server's session failed after its
// give_up_after, with one failure record, and the acceptor forgets it.
BOOST_AUTO_TEST_CASE(a_server_session_takes_its_restarted_peer_back_or_gives_up_on_it) {
  Env env(test_device());
  auto channel = CmEventChannel::create(env.dispatcher);
  SessionServer server(env, channel, 4000ms);  // time for a new client, under TCG and TSan
  {
    SessionClient first(env, channel, server.port(), 7);
    BOOST_REQUIRE_MESSAGE(server.log.wait_count("server: up", 1, 20s), server.log.text());
    exchange(first, server, "first");
  }
  BOOST_REQUIRE_MESSAGE(server.log.wait_count("server: down", 1, 20s), server.log.text());
  {
    SessionClient again(env, channel, server.port(), 7);
    BOOST_REQUIRE_MESSAGE(again.log.wait_count("client: up", 1, 20s), again.log.text());
    BOOST_REQUIRE_MESSAGE(server.log.wait_count("server: up", 2, 20s), server.log.text());
    exchange(again, server, "again");
    BOOST_TEST(server.kept() == 1u);
  }
  BOOST_REQUIRE_MESSAGE(server.log.wait_count("server: failed", 1, 20s), server.log.text());
  const std::vector<std::string> lived{"recovering", "up",   "down", "recovering",
                                       "up",         "down", "recovering", "failed"};
  BOOST_TEST(joined(states(server.log, "server")) == joined(lived), server.log.text());
  BOOST_TEST(server.acceptor->sessions() == 0u);
  const auto errors = env.errors();
  BOOST_TEST(errors.size() == 1u, joined(errors) + " | " + server.messenger.log.text() + " | " + server.log.text());
  BOOST_TEST(joined(errors).find("not recovered in 4000 ms") != std::string::npos,
             joined(errors));
}

// The server goes for good (acceptor and session closed) while the client
// is up: the client hears its peer gone once, its attempts find nobody
// listening, and after give_up_after it fails, once, with one record. The
// peer gone is DISCONNECTED, or REJECTED (status 28) when the server's id
// went before the RTU reached it (cm_session.h): the client is up as soon
// as it sends the RTU, and nothing orders the server's close after its
// ESTABLISHED, so this case may land on either side of that window; the
// next one stays inside it.
BOOST_AUTO_TEST_CASE(a_client_whose_server_is_gone_fails_after_give_up_after) {
  Env env(test_device());
  const auto gone = client_outlives_its_server(env, CmEventChannel::create(env.dispatcher));
  BOOST_TEST((gone.cause == kDisconnected || gone.cause == kRejected), gone.cause);
}

// The window itself (#50): the client's RTU is lost (test_seams::lose_rtu),
// so the server's id has sent its REP, the client is up, and the server's
// side never is when it goes. The kernel's CM rejects a connection whose id
// is destroyed there (reason 28, consumer defined) instead of disconnecting
// it, and the client's session ends as after any peer gone: down once, with
// REJECTED (status 28), then failed after give_up_after with one record.
BOOST_AUTO_TEST_CASE(a_client_whose_server_goes_between_rep_and_rtu_fails_after_give_up_after) {
  FirstRtuLost lost;  // before Env: reset once the dispatching thread is gone
  Env env(test_device());
  const auto gone = client_outlives_its_server(env, CmEventChannel::create(env.dispatcher));
  BOOST_TEST(lost.calls() == 1);
  BOOST_TEST(gone.server_ups == 0u);
  BOOST_TEST(gone.cause == kRejected);
}

// The campaign's application (session_fixture.h's Numbered) on both sides,
// the client's RTU lost (#50: a client up while its server's attempt waits
// for the RTU, until the attempt times out and the server's CM rejects the
// connection, REJECTED status 28). The server's QP receives from its
// accept on, before any ESTABLISHED makes it the session's QP, and the
// client that is up sends at once: more messages than the QP has receive
// slots all arrive while it is the attempt's, since each receive goes back
// to the QP it completed on. (Numbered once gave it back only on the
// session's QP of the moment: this QP took its 32 and answered every later
// message with an RNR NAK for as long as it lived, and a QP adopted short
// of receives, after a large resend had used them, could stall for good.)
BOOST_AUTO_TEST_CASE(messages_past_the_receive_slots_arrive_while_the_server_waits_for_the_rtu) {
  FirstRtuLost lost;  // before Env: reset once the dispatching thread is gone
  Env env(test_device());
  auto channel = CmEventChannel::create(env.dispatcher);
  Lines log;  // the sessions' handlers write to it until the last goes
  // Before the sessions, whose QPs complete on their CQs; each lets go of
  // its session first when it goes.
  Numbered at_server(env);
  Numbered at_client(env);
  std::mutex mutex;
  std::vector<std::shared_ptr<CmSession>> kept;
  CmAcceptor::Options accepting;
  accepting.make_qp = at_server.make_qp();
  accepting.health.recovery.policy = quick_recovery(60s);
  // Far past the waits below: the attempt keeps its QP, not yet the
  // session's (a timeout would reject the client, whose next up resends).
  accepting.connect_timeout = 60s;
  auto acceptor = CmAcceptor::listen(
      channel, CmAddress::parse(cm_host(), 0),
      [&](const std::shared_ptr<CmSession>& session) {
        std::lock_guard<std::mutex> lock(mutex);
        kept.push_back(session);
        at_server.attach(session);
      },
      [&](std::uint64_t, const HealthChange& change) { heard(log, "server", change); },
      accepting);
  CmSession::Options options;
  options.id = 42;
  options.make_qp = at_client.make_qp();
  options.health.recovery.policy = quick_recovery(60s);
  auto client = CmSession::connect(
      channel, CmAddress::parse(cm_host(), acceptor->local_address().port()),
      [&](const HealthChange& change) { heard(log, "client", change); }, options);
  at_client.attach(client);
  BOOST_REQUIRE_MESSAGE(log.wait_count("client: up", 1, 20s), log.text());
  BOOST_REQUIRE_EQUAL(lost.calls(), 1);

  constexpr std::uint64_t kMessages = 40;  // past Numbered's 32 receive slots
  for (std::uint64_t seq = 1; seq <= kMessages; ++seq) at_client.send(seq);
  BOOST_TEST(eventually([&] { return at_server.received().size() == kMessages; }, 20s),
             at_server.received().size() << " of " << kMessages << " arrived; " << log.text());
  BOOST_TEST(log.count("client: down") == 0u, log.text());

  acceptor->close();
  client->close();
  std::vector<std::shared_ptr<CmSession>> sessions;
  {
    std::lock_guard<std::mutex> lock(mutex);
    sessions = kept;
  }
  for (const auto& session : sessions) session->close();
}

// A server whose CM takes the request and never answers it (a listener
// that keeps its new ids): each attempt fails after connect_timeout, its id
// closed (the server's id hears nothing more of it), and the next one sends
// a new request.
BOOST_AUTO_TEST_CASE(an_attempt_never_answered_fails_after_connect_timeout) {
  Env env(test_device());
  auto channel = CmEventChannel::create(env.dispatcher);
  std::mutex mutex;
  std::vector<std::shared_ptr<CmId>> held;  // requests neither accepted nor rejected
  auto listener = CmId::create(channel, [&](const CmEvent& event) {
    if (event.code != RDMA_CM_EVENT_CONNECT_REQUEST) return;
    std::lock_guard<std::mutex> lock(mutex);
    held.push_back(event.new_id);
  });
  listener->listen(CmAddress::parse(cm_host(), 0), 4);
  SessionClient client(env, channel, listener->local_address().port(), 42, 20s, 300ms);
  BOOST_REQUIRE_MESSAGE(client.log.wait_count("client cause: attempt 2: not ESTABLISHED in 300 ms",
                                              1, 20s),
                        client.log.text());
  BOOST_TEST(client.log.count("client cause: attempt 1: not ESTABLISHED in 300 ms") == 1u,
             client.log.text());
  BOOST_TEST(client.log.count("client: up") == 0u);
  {
    std::lock_guard<std::mutex> lock(mutex);
    BOOST_TEST(held.size() >= 2u);  // a new request each attempt
  }
  client.session->close();
  listener->close();
  std::lock_guard<std::mutex> lock(mutex);
  for (auto& id : held) id->close();
}

BOOST_AUTO_TEST_CASE(bad_input_is_refused_and_a_request_without_a_session_id_rejected) {
  Env env(test_device());
  auto channel = CmEventChannel::create(env.dispatcher);
  SessionServer server(env, channel);
  Messenger messenger(env);
  const auto to = CmAddress::parse(cm_host(), server.port());
  const auto handler = [](const HealthChange&) {};
  CmSession::Options options;
  options.id = 1;
  options.make_qp = qp_for(env, messenger);
  CmSession::Options no_id = options;
  no_id.id = 0;
  BOOST_CHECK_THROW(CmSession::connect(channel, to, handler, no_id), std::invalid_argument);
  CmSession::Options no_qp = options;
  no_qp.make_qp = nullptr;
  BOOST_CHECK_THROW(CmSession::connect(channel, to, handler, no_qp), std::invalid_argument);
  CmSession::Options long_data = options;
  long_data.connect.private_data.assign(41, 'x');
  BOOST_CHECK_THROW(CmSession::connect(channel, to, handler, long_data), std::invalid_argument);
  BOOST_CHECK_THROW(CmSession::connect(nullptr, to, handler, options), std::invalid_argument);
  CmAcceptor::Options acceptor_options;
  BOOST_CHECK_THROW(CmAcceptor::listen(
                        channel, CmAddress::parse(cm_host(), 0),
                        [](const std::shared_ptr<CmSession>&) {},
                        [](std::uint64_t, const HealthChange&) {}, acceptor_options),
                    std::invalid_argument);

  Lines log;
  testing::Client plain(env, channel, log, "plain", server.port());
  BOOST_REQUIRE_MESSAGE(log.wait_count("plain: REJECTED 28", 1, 20s), log.text());
  BOOST_TEST(plain.rejection.rfind("ibev: no session id", 0) == 0u, plain.rejection);
  BOOST_TEST(server.kept() == 0u);
}
