// ibev-watch against ibv_asyncwatch on the same device: both run while the
// netdev flaps and gains an IPv6 address, and they must report the same
// events in the same order. Then SIGTERM: ibev-watch exits 0 after printing
// its counts. The binary's path comes after "--" on the command line.
#define BOOST_TEST_MODULE ibev_softroce_ibev_watch
#include <sys/wait.h>

#include <boost/test/unit_test.hpp>
#include <map>
#include <regex>
#include <thread>
#include <string>
#include <vector>

#include "tests/softroce/rdma_fixture.h"

using namespace ibev::testing;
using namespace std::chrono_literals;

namespace {

std::string ibev_watch_path() {
  const auto& suite = boost::unit_test::framework::master_test_suite();
  BOOST_REQUIRE_MESSAGE(suite.argc >= 2, "pass the ibev-watch binary after --");
  return suite.argv[1];
}

std::vector<Seen> matches(const std::string& text, const std::regex& pattern) {
  std::vector<Seen> seen;
  for (std::sregex_iterator it(text.begin(), text.end(), pattern), end; it != end;
       ++it) {
    seen.push_back({std::stoi((*it)[1]), std::stoi((*it)[2])});
  }
  return seen;
}

// {"time":...,"device":"rxe0","event":"IBV_EVENT_PORT_ERR","code":10,"scope":"port","port":1,...}
const std::regex kIbevLine(R"re("device":"rxe0","event":"[^"]+","code":(\d+),"scope":"port","port":(\d+))re");
// "  event_type IBV_EVENT_PORT_ERR (10), port 1"
const std::regex kAsyncwatchLine(R"(event_type \S+ \((\d+)\), port (\d+))");

}  // namespace

BOOST_AUTO_TEST_CASE(agrees_with_ibv_asyncwatch) {
  const std::string tmp = env_or("TEST_TMPDIR", "/tmp");
  const std::string device = test_device();
  Spawned asyncwatch("stdbuf -oL ibv_asyncwatch -d " + device, tmp + "/asyncwatch.out");
  Spawned ibev_watch(ibev_watch_path() + " --json --count -d " + device,
                     tmp + "/ibev_watch.out");
  BOOST_REQUIRE_MESSAGE(asyncwatch.wait_for_text("async event FD", 20s),
                        "ibv_asyncwatch: " << asyncwatch.text());
  BOOST_REQUIRE_MESSAGE(ibev_watch.wait_for_text("ibev-watch: watching " + device, 20s),
                        "ibev-watch: " << ibev_watch.text());

  const std::string netdev = test_netdev();
  run_command("ip link set " + netdev + " down");
  run_command("ip link set " + netdev + " up");
  run_command("ip -6 addr add fd00::55/64 dev " + netdev + " nodad");

  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while ((matches(asyncwatch.text(), kAsyncwatchLine).size() < 3 ||
          matches(ibev_watch.text(), kIbevLine).size() < 3) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  std::this_thread::sleep_for(500ms);  // nothing more should come
  const int status = ibev_watch.stop();
  asyncwatch.stop();
  BOOST_TEST_MESSAGE("ibev-watch printed:\n" << ibev_watch.text());
  BOOST_TEST_MESSAGE("ibv_asyncwatch printed:\n" << asyncwatch.text());

  const auto theirs = matches(asyncwatch.text(), kAsyncwatchLine);
  const auto ours = matches(ibev_watch.text(), kIbevLine);
  BOOST_TEST(theirs.size() >= 3u);
  BOOST_TEST(ours == theirs, boost::test_tools::per_element());
  BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 0), "status " << status);

  // --count agrees with the lines.
  std::map<std::string, int> lines, counted;
  const std::regex event_name(R"re("device":"rxe0","event":"([^"]+)","code")re");
  const std::string text = ibev_watch.text();
  for (std::sregex_iterator it(text.begin(), text.end(), event_name), end; it != end; ++it) {
    ++lines[(*it)[1]];
  }
  const std::regex count_line(R"re(\{"count":(\d+),"device":"rxe0","event":"([^"]+)"\})re");
  for (std::sregex_iterator it(text.begin(), text.end(), count_line), end; it != end; ++it) {
    counted[(*it)[2]] = std::stoi((*it)[1]);
  }
  BOOST_TEST(counted == lines);
}
