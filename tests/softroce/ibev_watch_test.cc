// ibev-watch on a real device: against ibv_asyncwatch, both running while the
// netdev flaps and gains an IPv6 address, they must report the same events
// in the same order; then SIGTERM: ibev-watch exits 0 after printing its
// counts. Also its option forms and its word for a device it may not open.
// The binary's path comes after "--" on the command line.
#define BOOST_TEST_MODULE ibev_softroce_ibev_watch
#include <sys/wait.h>

#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <fstream>
#include <iterator>
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
  std::this_thread::sleep_for(500ms);  // proves an absence: neither prints anything more
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

namespace {

// Runs `command` through /bin/sh, its stdout and stderr into one text;
// returns the exit status.
int run_capturing(const std::string& command, std::string& output) {
  const std::string file = env_or("TEST_TMPDIR", "/tmp") + "/captured.out";
  const int status = std::system((command + " >" + file + " 2>&1").c_str());
  std::ifstream in(file);
  output.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

// rdma-core's option forms: -dNAME glued, short options combined; a device
// named twice is watched once, so each event is printed once.
BOOST_AUTO_TEST_CASE(short_forms_and_a_device_named_twice) {
  const std::string tmp = env_or("TEST_TMPDIR", "/tmp");
  const std::string device = test_device();
  Spawned ibev_watch(ibev_watch_path() + " -jc -d" + device + " --device=" + device,
                     tmp + "/ibev_watch_short.out");
  BOOST_REQUIRE_MESSAGE(ibev_watch.wait_for_text("ibev-watch: watching " + device + " (", 20s),
                        "ibev-watch: " << ibev_watch.text());
  run_command("ip link set " + test_netdev() + " down");
  BOOST_REQUIRE(ibev_watch.wait_for_text("IBV_EVENT_PORT_ERR", 20s));
  std::this_thread::sleep_for(500ms);  // proves an absence: not watched twice
  const int status = ibev_watch.stop();
  run_command("ip link set " + test_netdev() + " up");
  // rxe may raise PORT_ERR more than once for one down (admin, carrier); a
  // device watched twice would print each of them twice and count twice.
  const std::string text = ibev_watch.text();
  const auto count = [&](const std::regex& pattern) {
    return std::distance(std::sregex_iterator(text.begin(), text.end(), pattern),
                         std::sregex_iterator());
  };
  const long lines = count(std::regex(R"re("event":"IBV_EVENT_PORT_ERR","code")re"));
  std::smatch counted;
  const std::regex count_line(R"re(\{"count":(\d+),"device":"[^"]+","event":"IBV_EVENT_PORT_ERR"\})re");
  BOOST_TEST(count(count_line) == 1, text);
  BOOST_REQUIRE_MESSAGE(std::regex_search(text, counted, count_line), text);
  BOOST_TEST(lines == std::stol(counted[1]), text);
  BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 0), "status " << status);
}

// A device the user may not open is told apart from a missing device and from
// a kernel without RDMA: exit 2 and a message naming permission.
BOOST_AUTO_TEST_CASE(no_permission_is_said_plainly) {
  // uverbs nodes are 0666 by default; take that away for the test.
  run_command("chmod 0600 /dev/infiniband/uverbs*");
  std::string output;
  const int status = run_capturing(
      "setpriv --reuid=65534 --regid=65534 --clear-groups " + ibev_watch_path() +
          " -d " + test_device(),
      output);
  run_command("chmod 0666 /dev/infiniband/uverbs*");
  BOOST_TEST(status == 2, output);
  BOOST_TEST(output.find("no permission to open " + test_device()) != std::string::npos,
             output);

  const int missing = run_capturing(ibev_watch_path() + " -d nosuchdevice", output);
  BOOST_TEST(missing == 2);
  BOOST_TEST(output.find("no RDMA device named nosuchdevice") != std::string::npos);
}

// Never pins a device: a delete while it runs returns, both changes are
// printed, and the re-added device is watched again (its events printed).
BOOST_AUTO_TEST_CASE(a_delete_and_a_re_add_while_it_runs) {
  const std::string tmp = env_or("TEST_TMPDIR", "/tmp");
  const std::string device = test_device();
  Spawned ibev_watch(ibev_watch_path() + " --json --count", tmp + "/ibev_watch_replug.out");
  BOOST_REQUIRE_MESSAGE(ibev_watch.wait_for_text("ibev-watch: watching " + device, 20s),
                        "ibev-watch: " << ibev_watch.text());
  BOOST_TEST(ibev_watch.text().find("and devices added later") != std::string::npos);

  BlockingCommand deleting("rdma link delete " + device);
  if (!deleting.wait(20s)) {
    ibev_watch.stop();  // lets the kernel finish
    deleting.wait(60s);
    BOOST_FAIL("rdma link delete did not return while ibev-watch ran:\n" << ibev_watch.text());
  }
  const std::string removed = R"("device":")" + device + R"(","change":"removed")";
  BOOST_REQUIRE_MESSAGE(ibev_watch.wait_for_text(removed, 20s), ibev_watch.text());

  run_command("rdma link add " + device + " type rxe netdev " + test_netdev());
  const std::string added = R"("device":")" + device + R"(","change":"added")";
  const auto added_twice = [&] {
    const std::string text = ibev_watch.text();
    const auto first = text.find(added);
    return first != std::string::npos && text.find(added, first + 1) != std::string::npos;
  };
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!added_twice() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  BOOST_REQUIRE_MESSAGE(added_twice(), ibev_watch.text());
  run_command("ip link set " + test_netdev() + " down");
  run_command("ip link set " + test_netdev() + " up");
  BOOST_TEST(ibev_watch.wait_for_text("IBV_EVENT_PORT_ACTIVE", 20s), ibev_watch.text());
  const int status = ibev_watch.stop();
  const std::string text = ibev_watch.text();
  BOOST_TEST(text.find(R"("loss":"removed","synthesized":true)") != std::string::npos, text);
  // The counts span both lives of the device: the synthesized DEVICE_FATAL
  // of the first, the port events of the second.
  BOOST_TEST(text.find(R"({"count":1,"device":")" + device + R"(","event":"IBV_EVENT_DEVICE_FATAL"})") !=
                 std::string::npos,
             text);
  BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 0), "status " << status);
}
