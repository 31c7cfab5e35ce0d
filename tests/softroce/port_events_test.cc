// Smoke test of the soft-RoCE harness: real port events from the kernel. The
// test device's netdev goes down and up and gains an IPv6 address; the async
// fd must yield PORT_ERR, PORT_ACTIVE and GID_CHANGE for port 1, and
// ibv_asyncwatch, running beside it, must print the same events.
#define BOOST_TEST_MODULE ibev_softroce_port_events

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/softroce/rdma_fixture.h"
#include "tests/support/testing.h"

using namespace ibev::testing;
using namespace std::chrono_literals;

namespace {

// "  event_type IBV_EVENT_PORT_ERR (10), port 1" lines of ibv_asyncwatch.
std::vector<Seen> asyncwatch_events(const std::string& text) {
  static const std::regex line(R"(event_type \S+ \((\d+)\), port (\d+))");
  std::vector<Seen> seen;
  for (std::sregex_iterator it(text.begin(), text.end(), line), end; it != end;
       ++it) {
    seen.push_back({std::stoi((*it)[1]), std::stoi((*it)[2])});
  }
  return seen;
}

}  // namespace

BOOST_AUTO_TEST_CASE(link_flap_and_gid_change_raise_port_events) {
  ContextPtr context = open_device(test_device());
  make_async_fd_nonblocking(context.get());
  const std::string tmp = env_or("TEST_TMPDIR", "/tmp");
  Spawned watch("stdbuf -oL ibv_asyncwatch -d " + test_device(),
                tmp + "/asyncwatch.out");
  BOOST_REQUIRE_MESSAGE(watch.wait_for_text("async event FD", 20s),
                        "ibv_asyncwatch did not start: " << watch.text());

  // Nothing is pending before the triggers.
  BOOST_TEST(read_events(context.get(), 200ms, 1s).empty());

  const std::string netdev = test_netdev();
  run_command("ip link set " + netdev + " down");
  const auto down = read_events(context.get(), 1s, 10s);
  run_command("ip link set " + netdev + " up");
  const auto up = read_events(context.get(), 1s, 10s);
  run_command("ip -6 addr add fd00::77/64 dev " + netdev + " nodad");
  const auto gid = read_events(context.get(), 1s, 10s);

  BOOST_TEST(down == (std::vector<Seen>{{IBV_EVENT_PORT_ERR, 1}}),
             boost::test_tools::per_element());
  BOOST_TEST(up == (std::vector<Seen>{{IBV_EVENT_PORT_ACTIVE, 1}}),
             boost::test_tools::per_element());
  BOOST_REQUIRE(!gid.empty());
  for (const Seen& s : gid) BOOST_TEST(s == (Seen{IBV_EVENT_GID_CHANGE, 1}));

  std::vector<Seen> ours = down;
  ours.insert(ours.end(), up.begin(), up.end());
  ours.insert(ours.end(), gid.begin(), gid.end());
  // asyncwatch reads its own context: give it a moment to print the last one.
  eventually([&] { return asyncwatch_events(watch.text()).size() >= ours.size(); }, 5s, 20ms);
  watch.stop();
  BOOST_TEST(asyncwatch_events(watch.text()) == ours,
             boost::test_tools::per_element());
  BOOST_TEST_MESSAGE("ibv_asyncwatch printed:\n" << watch.text());
}
