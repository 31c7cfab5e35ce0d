// Sessions between two hosts, as the harness makes them (softroce_run.sh
// --devices 2: rxe0 on v0 at fd00::1, rxe1 on v1 at fd00::2, the veth pair
// their cable, policy routing between them; docs/softroce.md): the client
// is this process on rxe0, the server another process (session_peer) on
// rxe1. Numbered messages ("seq N") show what arrives: nothing lost, and a
// copy the outage made (delivered, its ack lost, sent again) dropped by the
// receiver as an application does. The cable is pulled for 2 s mid-traffic;
// the server process is killed while the session is idle and started again.
#define BOOST_TEST_MODULE ibev_softroce_session_two_hosts
#include <signal.h>

#include <atomic>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <ibev/cm/cm_session.h>

#include "tests/softroce/cm_fixture.h"
#include "tests/softroce/rdma_fixture.h"
#include "tests/softroce/session_fixture.h"
#include "tests/softroce/verbs_fixture.h"
#include "tests/support/testing.h"

using namespace ibev;
using namespace ibev::testing;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// The peer program's path, from the command line (after "--").
std::string peer_program() {
  auto& suite = boost::unit_test::framework::master_test_suite();
  BOOST_REQUIRE_MESSAGE(suite.argc >= 2, "usage: session_two_hosts_test -- PEER_PROGRAM");
  return suite.argv[suite.argc - 1];
}

long long ms_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(to - from).count();
}

// session_peer in a process of its own, on rxe1.
struct Peer : PeerProcess {
  explicit Peer(std::uint16_t port) : PeerProcess(peer_program(), port) {}
};

// The client on rxe0: a session to the peer, its states in `log` ("up",
// "down: CAUSE", ...), what its last attempt did not deliver sent again on
// each up.
struct ClientSide {
  ClientSide(std::uint16_t port, std::chrono::milliseconds keepalive = 0ms)
      : env(test_device()), channel(CmEventChannel::create(env.dispatcher)), numbered(env) {
    CmSession::Options options;
    options.id = 42;
    options.source = CmAddress::parse(cm_host(), 0);
    options.make_qp = numbered.make_qp();
    options.health.recovery.policy = quick_recovery(30s);
    options.health.keepalive.interval = keepalive;
    session = CmSession::connect(
        channel, CmAddress::parse(cm_host2(), port),
        [this](const HealthChange& change) {
          log.add(state_line(change));
          if (change.to == ConnectionState::kUp) numbered.resend();
        },
        options);
    numbered.attach(session);
  }
  ~ClientSide() { session->close(); }

  std::vector<std::string> states() {
    std::vector<std::string> to;
    for (const std::string& line : log.starting_with("")) to.push_back(line.substr(0, line.find(':')));
    return to;
  }

  Env env;
  std::shared_ptr<CmEventChannel> channel;
  Lines log;
  Numbered numbered;
  std::shared_ptr<CmSession> session;
};

// Whether `states` ("up", "down: CAUSE", ...) are a connection made, then
// one outage for `cause`, with any number of failed attempts, then up.
bool one_outage(const std::vector<std::string>& states, const std::string& cause) {
  std::vector<std::string> expected{"recovering", "up", "down: " + cause, "recovering"};
  if (states.size() < expected.size() + 1 || states.back() != "up") return false;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    if (states[i].rfind(expected[i], 0) != 0) return false;
  }
  for (std::size_t i = expected.size(); i + 1 < states.size(); i += 2) {
    if (states[i].rfind("down: attempt ", 0) != 0 || states[i + 1].rfind("recovering", 0) != 0) {
      return false;
    }
  }
  return (states.size() - expected.size()) % 2 == 1;
}

// The cable back, and the route IPv6 dropped with it (the harness's policy
// route for the peer's address).
void plug_in() {
  run_command("ip link set " + test_netdev2() + " up");
  put_back_policy_routes();
}

// Numbered messages, one every 20 ms while the session is up, from a thread
// of its own; what the QP refuses (in ERR, between the down and the
// sender's look) is counted, not sent again.
class Sender {
 public:
  explicit Sender(ClientSide& client)
      : thread_([this, &client] {
          while (sending_) {
            if (client.session->health().state() == ConnectionState::kUp) {
              try {
                client.numbered.send(next_);
                ++next_;
              } catch (const std::exception& e) {
                refused.add(e.what());
              }
            }
            std::this_thread::sleep_for(20ms);  // a pace, not a wait: one every 20 ms
          }
        }) {}
  ~Sender() { stop(); }

  std::uint64_t next() const { return next_; }
  // The last number sent.
  std::uint64_t stop() {
    sending_ = false;
    if (thread_.joinable()) thread_.join();
    return next_ - 1;
  }

  Lines refused;

 private:
  std::atomic<bool> sending_{true};
  std::atomic<std::uint64_t> next_{1};
  std::thread thread_;
};

// How many of 1..last never reached the peer.
std::size_t missing(Peer& peer, std::uint64_t last) {
  std::size_t missing = 0;
  for (std::uint64_t seq = 1; seq <= last; ++seq) {
    missing += peer.lines.count("received " + std::to_string(seq)) == 0 ? 1 : 0;
  }
  return missing;
}

}  // namespace

// Traffic flows, the cable is pulled for 2 s and put back: each side goes
// down once (PORT_ERR), waits for PORT_ACTIVE, and the session is made
// again on new QPs; every message arrives, the undelivered ones sent again.
// Printed: the time from the client's PORT_ACTIVE to its first completion
// on the new connection.
BOOST_AUTO_TEST_CASE(a_pulled_cable_heals_and_every_message_arrives) {
  Peer peer(0);
  ClientSide client(peer.port());
  std::atomic<long long> active_at_ns{0};
  Handle ports = client.env.device->on_event(
      EventFilter{IBV_EVENT_PORT_ACTIVE}, [&](const Event&) {
        active_at_ns = Clock::now().time_since_epoch().count();
      });
  BOOST_REQUIRE_MESSAGE(client.log.wait_count("up", 1, 20s), client.log.text());

  Sender sender(client);
  BOOST_REQUIRE_MESSAGE(peer.lines.wait_count("received 10", 1, 20s), peer.lines.text());

  run_command("sysctl -qw net.ipv6.conf." + test_netdev2() + ".keep_addr_on_down=1");
  run_command("ip link set " + test_netdev2() + " down");
  std::this_thread::sleep_for(2s);  // the outage under test: a duration on purpose
  plug_in();
  BOOST_REQUIRE_MESSAGE(client.log.wait_count("up", 2, 30s), client.log.text());
  const auto up_again = Clock::now();
  // Traffic on the new connection, then stop and let the last arrive.
  const std::uint64_t after = sender.next();
  BOOST_REQUIRE(eventually([&] { return sender.next() > after + 10; }, 20s));
  const std::uint64_t last = sender.stop();
  BOOST_REQUIRE_MESSAGE(peer.lines.wait_count("received " + std::to_string(last), 1, 20s),
                        peer.lines.text());

  const Clock::time_point active{Clock::duration(active_at_ns.load())};
  BOOST_REQUIRE(active_at_ns.load() != 0);
  long long first_completion_ms = -1;
  for (const auto& at : client.numbered.sent_times()) {
    if (at > active) {
      first_completion_ms = ms_between(active, at);
      break;
    }
  }
  BOOST_TEST_MESSAGE("PORT_ACTIVE to up: " << ms_between(active, up_again)
                     << " ms at most; PORT_ACTIVE to the first completion after it: "
                     << first_completion_ms << " ms");
  BOOST_TEST(first_completion_ms >= 0);

  // One outage each, with as many attempts as it took: PORT_ACTIVE may
  // come before the route back (the harness's policy route, put back after
  // the link) or the neighbour, so a request may be rejected (reason 28)
  // or an accept fail, and the next attempt succeeds.
  BOOST_TEST(one_outage(client.log.starting_with(""), "IBV_EVENT_PORT_ERR"), client.log.text());
  BOOST_TEST_MESSAGE("client: " << joined(client.log.starting_with("")) << "; sends refused: "
                                << sender.refused.starting_with("").size());
  peer.stop(SIGTERM);  // its output all read
  BOOST_TEST(one_outage(peer.states(), "IBV_EVENT_PORT_ERR"), joined(peer.states()));
  BOOST_TEST(peer.lines.count("session 42") == 1u, peer.lines.text());
  // Nothing lost: every number sent arrived (a copy counted, not kept).
  const std::size_t lost = missing(peer, last);
  BOOST_TEST(lost == 0u, peer.lines.text());
  BOOST_TEST_MESSAGE(last << " messages; copies the receiver dropped: "
                          << peer.lines.starting_with("received ").size() - (last - lost));
  BOOST_TEST(peer.lines.starting_with("failure").empty(), peer.lines.text());
  BOOST_TEST(client.env.errors().empty(), client.env.failures.summary());
}

// The server process is killed while the session is idle: the client
// notices within its keepalive's interval x misses (or sooner, by the CM's
// disconnect, when the kernel sends one for the dead process), not before,
// and reconnects to the server started again on the same port.
BOOST_AUTO_TEST_CASE(a_killed_peer_is_noticed_while_idle_and_its_restart_reconnected) {
  constexpr auto kInterval = 300ms;
  constexpr unsigned kMisses = 3;
  auto peer = std::make_unique<Peer>(0);
  const std::uint16_t port = peer->port();
  ClientSide client(port, kInterval);
  BOOST_REQUIRE_MESSAGE(client.log.wait_count("up", 1, 20s), client.log.text());
  // Idle, probes answered: no down meanwhile.
  BOOST_TEST(stays_false_for(
      [&] { return !client.log.starting_with("down").empty() || client.log.count("up") != 1u; },
      kInterval * 4,
      "four keepalive intervals send four probes; a keepalive that took an answered "
      "connection down would do so within interval x misses, three of them"));
  BOOST_TEST(client.log.count("up") == 1u);
  BOOST_TEST(client.session->health().keepalive_stats().answered >= 2u);

  const auto killed = Clock::now();
  peer->stop(SIGKILL);
  BOOST_REQUIRE_MESSAGE(eventually([&] { return !client.log.starting_with("down").empty(); }, 20s),
                        client.log.text());
  const long long noticed_ms = ms_between(killed, Clock::now());
  const std::string cause = client.log.starting_with("down: ").front();
  BOOST_TEST_MESSAGE("the killed peer noticed in " << noticed_ms << " ms (" << cause << ")");
  BOOST_TEST(noticed_ms <= kMisses * kInterval.count() + 1000, cause);

  Peer again(port);
  BOOST_REQUIRE_MESSAGE(client.log.wait_count("up", 2, 30s), client.log.text());
  BOOST_REQUIRE_MESSAGE(again.lines.wait_count("state up", 1, 20s), again.lines.text());
  client.numbered.send(1000);
  BOOST_TEST(again.lines.wait_count("received 1000", 1, 20s), again.lines.text());
  BOOST_TEST(again.lines.count("session 42") == 1u, again.lines.text());
  BOOST_TEST(client.env.errors().empty(), client.env.failures.summary());
}

// The peer goes silent without a word, as a host that dies does (what it
// sends goes to a MAC nobody has: no disconnect, no port event, no error
// completion for seconds): the client's keepalive notices within interval x
// misses (and the time the shell takes), not before (misses - 1) x
// interval. Once the peer is heard again the client
// reconnects, and the server, whose session looked up, takes the request
// naming it as its peer's return.
BOOST_AUTO_TEST_CASE(a_silent_peer_is_noticed_by_the_keepalive_and_taken_back_by_the_server) {
  constexpr auto kInterval = 300ms;
  constexpr unsigned kMisses = 3;
  Peer peer(0);
  ClientSide client(peer.port(), kInterval);
  BOOST_REQUIRE_MESSAGE(client.log.wait_count("up", 1, 20s), client.log.text());
  BOOST_REQUIRE_MESSAGE(peer.lines.wait_count("state up", 1, 20s), peer.lines.text());

  // The peer falls silent somewhere in the shell's run: not before it
  // starts (the lower bound is timed from there), not after it returns
  // (the upper one).
  const auto silencing = Clock::now();
  run_command("ip -6 neigh replace " + cm_host() + " lladdr 02:00:00:00:00:01 dev " +
              test_netdev2() + " nud permanent");
  const auto silenced = Clock::now();
  BOOST_REQUIRE_MESSAGE(eventually([&] { return !client.log.starting_with("down").empty(); }, 20s),
                        client.log.text());
  const auto noticed = Clock::now();
  run_command("ip -6 neigh del " + cm_host() + " dev " + test_netdev2());
  const std::string cause = client.log.starting_with("down: ").front();
  BOOST_TEST_MESSAGE("the silent peer noticed in " << ms_between(silenced, noticed) << " to "
                                                   << ms_between(silencing, noticed) << " ms ("
                                                   << cause << ")");
  BOOST_TEST(cause.rfind("no keepalive answer", 0) == 0u, cause);
  BOOST_TEST(ms_between(silencing, noticed) >=
             static_cast<long long>((kMisses - 1) * kInterval.count()));
  BOOST_TEST(ms_between(silenced, noticed) <=
             static_cast<long long>(kMisses * kInterval.count() + kInterval.count() / 2 + 500));

  BOOST_REQUIRE_MESSAGE(client.log.wait_count("up", 2, 30s),
                        client.log.text() + " | " + peer.lines.text());
  BOOST_REQUIRE_MESSAGE(peer.lines.wait_count("state up", 2, 30s), peer.lines.text());
  client.numbered.send(7);
  BOOST_TEST(peer.lines.wait_count("received 7", 1, 20s), peer.lines.text());
  peer.stop(SIGTERM);
  BOOST_TEST(peer.lines.count("session 42") == 1u, peer.lines.text());
  BOOST_TEST(peer.lines.count("state down: RDMA_CM_EVENT_CONNECT_REQUEST: the peer connects again") +
                     peer.lines.count("state down: RDMA_CM_EVENT_DISCONNECTED") ==
                 1u,
             peer.lines.text());
  BOOST_TEST(client.env.errors().empty(), client.env.failures.summary());
}

// The client's device is deleted under the session mid-traffic (`rdma link
// delete`), and added again: the delete completes (ibev lets the device
// go: its Device and everything on it closed, the CM's id closed, so
// librdmacm's context goes too), the session goes down once, its attempts
// fail while no device carries the address, and the first after the re-add
// opens the new device (the fixture's MakeQp: a Device, protection domain,
// memory region and CQ of its own there) and connects. Every message
// arrives.
BOOST_AUTO_TEST_CASE(a_deleted_device_is_let_go_and_the_session_heals_on_its_re_add) {
  Peer peer(0);
  ClientSide client(peer.port());
  BOOST_REQUIRE_MESSAGE(client.log.wait_count("up", 1, 20s), client.log.text());
  Sender sender(client);
  BOOST_REQUIRE_MESSAGE(peer.lines.wait_count("received 10", 1, 20s), peer.lines.text());
  const std::shared_ptr<Device> old = client.env.device;
  // rxe0 back for what runs after, whatever fails on the way.
  struct ReAdd {
    ~ReAdd() {
      try {
        add_test_device_if_gone();
      } catch (const std::exception&) {
        std::fprintf(stderr, "could not add %s again\n", test_device().c_str());
      }
    }
  } re_add;

  BlockingCommand deleting("rdma link delete " + test_device());
  const auto took = deleting.wait(20s);
  if (!took) {
    sender.stop();
    client.session->close();
    old->close();
    deleting.wait(60s);
    BOOST_FAIL("rdma link delete did not return within 20 s under the session: "
               << client.log.text());
  }
  BOOST_TEST_MESSAGE("rdma link delete returned after " << took->count() << " ms");
  BOOST_TEST((old->loss() == DeviceLoss::kRemoved));
  BOOST_REQUIRE_MESSAGE(eventually([&] { return !client.log.starting_with("down").empty(); }),
                        client.log.text());
  // Attempts fail: no device has the address.
  BOOST_TEST(stays_false_for([&] { return client.log.count("up") != 1u; }, 1s,
                             "attempts come 50 ms after the down, then at most 400 ms apart "
                             "(quick_recovery): one that connected says up within the second"));
  BOOST_TEST(client.log.count("up") == 1u, client.log.text());

  run_command("rdma link add " + test_device() + " type rxe netdev " + test_netdev());
  BOOST_REQUIRE_MESSAGE(client.log.wait_count("up", 2, 30s),
                        client.log.text() + " | " + peer.lines.text());
  const std::uint64_t after = sender.next();
  BOOST_REQUIRE(eventually([&] { return sender.next() > after + 10; }, 20s));
  const std::uint64_t last = sender.stop();
  BOOST_REQUIRE_MESSAGE(peer.lines.wait_count("received " + std::to_string(last), 1, 20s),
                        peer.lines.text());

  const auto devices = client.numbered.devices();
  BOOST_REQUIRE(devices.size() == 2u);
  BOOST_TEST(devices.back() != old);
  BOOST_TEST((devices.back()->loss() == DeviceLoss::kNone));
  BOOST_TEST(client.session->queue_pair()->device() == devices.back());
  const std::string cause = client.log.starting_with("down: ").front();
  BOOST_TEST((cause.find("DEVICE_FATAL") != std::string::npos ||
              cause.find("DEVICE_REMOVAL") != std::string::npos),
             cause);
  BOOST_TEST(one_outage(client.log.starting_with(""), cause), client.log.text());
  BOOST_TEST(missing(peer, last) == 0u, peer.lines.text());
  BOOST_TEST_MESSAGE("client: " << joined(client.log.starting_with("")) << "; " << last
                                << " messages, sends refused: "
                                << sender.refused.starting_with("").size());
  peer.stop(SIGTERM);
  BOOST_TEST(peer.lines.count("session 42") == 1u, peer.lines.text());
  BOOST_TEST(peer.lines.starting_with("failure").empty(), peer.lines.text());
  BOOST_TEST(client.env.errors().empty(), client.env.failures.summary());
}
