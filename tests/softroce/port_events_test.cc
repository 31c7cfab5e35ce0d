// Smoke test of the soft-RoCE harness: real port events from the kernel. The
// test device's netdev goes down and up and gains an IPv6 address; the async
// fd must yield PORT_ERR, PORT_ACTIVE and GID_CHANGE for port 1, and
// ibv_asyncwatch, running beside it, must print the same events.
#define BOOST_TEST_MODULE ibev_softroce_port_events
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/softroce/rdma_fixture.h"

extern char** environ;

using namespace ibev::testing;
using namespace std::chrono_literals;

namespace {

// ibv_asyncwatch on the test device, its output line-buffered into a file.
class AsyncWatch {
 public:
  explicit AsyncWatch(const std::string& output) : output_(output) {
    const std::string command = "exec stdbuf -oL ibv_asyncwatch -d " +
                                test_device() + " > " + output + " 2>&1";
    const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
    BOOST_REQUIRE_EQUAL(posix_spawn(&pid_, "/bin/sh", nullptr, nullptr,
                                    const_cast<char**>(argv), environ),
                        0);
    // Ready once it has printed its async fd.
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (text().find("async event FD") == std::string::npos) {
      BOOST_REQUIRE_MESSAGE(std::chrono::steady_clock::now() < deadline,
                            "ibv_asyncwatch did not start: " << text());
      std::this_thread::sleep_for(20ms);
    }
  }
  ~AsyncWatch() { stop(); }

  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  std::string text() const {
    std::ifstream in(output_);
    std::stringstream all;
    all << in.rdbuf();
    return all.str();
  }

  // "  event_type IBV_EVENT_PORT_ERR (10), port 1"
  std::vector<Seen> events() const {
    static const std::regex line(R"(event_type \S+ \((\d+)\), port (\d+))");
    std::vector<Seen> seen;
    const std::string all = text();
    for (std::sregex_iterator it(all.begin(), all.end(), line), end;
         it != end; ++it) {
      seen.push_back({std::stoi((*it)[1]), std::stoi((*it)[2])});
    }
    return seen;
  }

 private:
  std::string output_;
  pid_t pid_ = -1;
};

}  // namespace

BOOST_AUTO_TEST_CASE(link_flap_and_gid_change_raise_port_events) {
  ContextPtr context = open_device(test_device());
  make_async_fd_nonblocking(context.get());
  const std::string tmp = env_or("TEST_TMPDIR", "/tmp");
  AsyncWatch watch(tmp + "/asyncwatch.out");

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
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (watch.events().size() < ours.size() &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  watch.stop();
  BOOST_TEST(watch.events() == ours, boost::test_tools::per_element());
  BOOST_TEST_MESSAGE("ibv_asyncwatch printed:\n" << watch.text());
}
