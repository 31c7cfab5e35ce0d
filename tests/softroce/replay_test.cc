// Record and replay on a real device: ibev-watch records a flap, a GID change
// and a device's removal and return, done for real by ibev-replay's fault
// schedule; the recording, replayed into this process's own Dispatcher, must
// reach its listener as the same sequence with the same elements. A netem
// done for real is on the netdev until its netem-off. And a schedule's
// qp-fatal, injected, reaches a real QueuePair by its number.
// The binaries' paths come after "--": ibev-watch, then ibev-replay.
#define BOOST_TEST_MODULE ibev_softroce_replay
#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include <ibev/dispatch/replay.h>
#include <ibev/formats/fault_schedule.h>
#include <ibev/formats/recording.h>
#include <ibev/verbs/completion_queue.h>
#include <ibev/verbs/queue_pair.h>

#include "tests/softroce/rdma_fixture.h"
#include "tests/softroce/verbs_fixture.h"
#include "tests/support/testing.h"

using namespace ibev::testing;
using namespace std::chrono_literals;

namespace {

std::string binary(int index) {
  const auto& suite = boost::unit_test::framework::master_test_suite();
  BOOST_REQUIRE_MESSAGE(suite.argc >= 3, "pass ibev-watch and ibev-replay after --");
  return suite.argv[index];
}

// What an event says, for comparing sequences.
struct Said {
  int code;
  ibev::ElementKind kind;
  std::optional<int> port;
  bool operator==(const Said& o) const {
    return code == o.code && kind == o.kind && port == o.port;
  }
};
std::ostream& operator<<(std::ostream& out, const Said& s) {
  return out << ibev::enumerator_name(s.code) << " " << ibev::to_string(s.kind) << " "
             << s.port.value_or(0);
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_recorded_flap_gid_change_and_removal_replays_the_same) {
  const std::string tmp = env_or("TEST_TMPDIR", "/tmp");
  const std::string device = test_device();
  const std::string netdev = test_netdev();
  const std::string recording = tmp + "/recording.jsonl";
  // The address the schedule's gid-change (its line 3) adds, gone however
  // the test ends.
  struct RemoveAddress {
    std::string netdev;
    ~RemoveAddress() { std::system(("ip -6 addr del fd00:ffff::3/128 dev " + netdev).c_str()); }
  } remove_address{netdev};
  // The recording is stdout alone; what it says on stderr is watched.
  Spawned ibev_watch("sh -c 'exec " + binary(1) + " --json 2>&1 >" + recording + "'",
                     tmp + "/ibev_watch.err");
  BOOST_REQUIRE_MESSAGE(ibev_watch.wait_for_text("ibev-watch: watching " + device, 20s),
                        ibev_watch.text());

  // The faults, done for real at their times (ip link, ip addr, rdma link).
  std::ofstream(tmp + "/faults") << "0s     port-down   " << device << " 1\n"
                                 << "500ms  port-up     " << device << " 1\n"
                                 << "1s     gid-change  " << device << " 1\n"
                                 << "1500ms remove      " << device << "\n"
                                 << "2s     add         " << device << " " << netdev << "\n";
  run_command(binary(2) + " --schedule --real " + tmp + "/faults > " + tmp + "/real.out 2>&1");
  {
    // A run that succeeds says only what it did, in its own words: no tool's
    // complaint about a step allowed to fail (the gid-change's removal of an
    // address not there: "RTNETLINK answers: Cannot assign requested address").
    std::ifstream in(tmp + "/real.out");
    const std::regex own(R"(\+\d+\.\d{6} \S+ [a-z-]+: /\S+ .*)");
    std::string line;
    int lines = 0;
    while (std::getline(in, line)) {
      ++lines;
      BOOST_TEST(std::regex_match(line, own), "not ibev-replay's: " << line);
    }
    BOOST_TEST(lines == 5);
  }
  const std::string added = R"("device":")" + device + R"(","change":"added")";
  const auto recorded_text = [&] {
    std::ifstream in(recording);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  eventually([&] { return count_of(recorded_text(), added) >= 2; }, 20s, 20ms);
  BOOST_REQUIRE_MESSAGE(count_of(recorded_text(), added) == 2, recorded_text());
  // What the re-added device raises, recorded too. A duration, not a
  // condition: how many events it raises (its port, its GIDs) is the
  // kernel's to say; those of the next 500 ms are recorded, and the replay
  // below is held to whatever was.
  std::this_thread::sleep_for(500ms);
  ibev_watch.stop();

  std::ifstream file(recording);
  const auto lines = ibev::read_recording(file, recording);
  std::vector<Said> recorded;
  for (const auto& line : lines) {
    if (const auto* event = std::get_if<ibev::RecordedEvent>(&line)) {
      recorded.push_back({event->code, event->kind, event->port});
    }
  }
  BOOST_TEST_MESSAGE("recorded:\n" << recorded_text());
  // Each real fault raised its event.
  for (const int code :
       {IBV_EVENT_PORT_ERR, IBV_EVENT_PORT_ACTIVE, IBV_EVENT_GID_CHANGE, IBV_EVENT_DEVICE_FATAL}) {
    BOOST_TEST(std::count_if(recorded.begin(), recorded.end(),
                             [&](const Said& s) { return s.code == code; }) >= 1,
               ibev::enumerator_name(code) << " recorded");
  }

  // A fresh Dispatcher, the re-added device, a listener; the replay.
  Env env(device);
  Recorder heard;
  ibev::Handle listener = env.device->on_event({}, heard.as("listener"));
  ibev::Replay::Options options;
  options.speed = 0;
  options.device = [&](const std::string& name) {
    return name == device ? env.device->context() : nullptr;
  };
  std::size_t changes = 0;
  options.change = [&](const ibev::RecordedChange&) { ++changes; };
  const ibev::ReplayStats stats = ibev::Replay(env.dispatcher, options).play(lines);
  BOOST_TEST(stats.injected == recorded.size());
  BOOST_TEST(stats.skipped == 0u);
  BOOST_TEST(changes == 3u);  // added at start, removed, added again
  const auto replayed = [](const std::vector<Recorder::Entry>& entries) {
    std::vector<Said> said;
    for (const auto& entry : entries) {
      // Only the replay's: the live device may raise events of its own.
      if (entry.event.synthesized()) {
        said.push_back({entry.event.code(), entry.event.element_kind(), entry.event.port()});
      }
    }
    return said;
  };
  BOOST_TEST(heard.wait_until([&](const std::vector<Recorder::Entry>& entries) {
    return replayed(entries).size() >= recorded.size();
  }));
  BOOST_TEST(replayed(heard.entries()) == recorded, boost::test_tools::per_element());
  BOOST_TEST(env.errors().empty(), env.failures.summary());
}

// A netem done for real puts netem, with the schedule's loss, delay and
// reordering, on the device's netdev (`tc qdisc replace ... root netem`), and
// its netem-off takes it away; a netem-off with no netem there is no failure
// (its `tc qdisc del` is allowed to fail, and says nothing).
BOOST_AUTO_TEST_CASE(a_netem_goes_on_the_netdev_and_its_netem_off_takes_it_away) {
  const std::string tmp = env_or("TEST_TMPDIR", "/tmp");
  const std::string device = test_device();
  const std::string netdev = test_netdev();
  // The netdev's root qdisc put back as the harness made it, however the
  // test ends.
  struct RemoveNetem {
    std::string netdev;
    ~RemoveNetem() { std::system(("tc qdisc del dev " + netdev + " root 2>/dev/null").c_str()); }
  } remove_netem{netdev};
  // ibev-replay --real's output and exit status ("exit N", last).
  const auto real = [&](const std::string& schedule) {
    std::ofstream(tmp + "/netem") << schedule;
    return command_output(binary(2) + " --schedule --real " + tmp + "/netem 2>&1; echo exit $?");
  };
  const auto root_qdisc = [&] { return command_output("tc qdisc show dev " + netdev + " root"); };
  const std::string on = real("0s netem " + device + " loss=20% delay=30ms reorder=10%\n");
  const std::regex done_on(R"(\+0\.000000 \S+ netem: /\S+/tc qdisc replace dev )" + netdev +
                          R"( root netem delay 30000us loss 20% reorder 10%\nexit 0\n)");
  BOOST_TEST(std::regex_match(on, done_on), on);
  const std::string shown = root_qdisc();
  for (const char* said : {"qdisc netem ", "delay 30", "loss 20%", "reorder 10%"}) {
    BOOST_TEST(shown.find(said) != std::string::npos, said << " in: " << shown);
  }
  const std::string off = real("0s netem-off " + device + "\n1ms netem-off " + device + "\n");
  const std::regex done_off(R"((\+0\.00\d000 \S+ netem-off: /\S+/tc qdisc del dev )" + netdev +
                            R"( root\n){2}exit 0\n)");
  BOOST_TEST(std::regex_match(off, done_off), off);
  BOOST_TEST(root_qdisc().find("netem") == std::string::npos, root_qdisc());
}

// A schedule's qp-fatal names the QP by number: injected, it reaches the
// QueuePair made with that number's handler, and the port fault its device's
// listener, in the schedule's order.
BOOST_AUTO_TEST_CASE(an_injected_schedule_reaches_a_queue_pair_by_number) {
  Env env(test_device());
  Recorder heard;
  ibev::QueuePair::Options qp_options;
  qp_options.send_cq = qp_options.recv_cq = plain_cq(env.device);
  auto qp = ibev::QueuePair::create(env.pd, heard.as("qp"), qp_options);
  ibev::Handle listener = env.device->on_event({}, heard.as("listener"));
  std::istringstream schedule("0s qp-fatal " + test_device() + " " + std::to_string(qp->qp_num()) +
                              "\n100ms port-down " + test_device() + " 1\n");
  const auto faults = ibev::read_fault_schedule(schedule, "schedule");
  ibev::Replay::Options options;
  options.speed = 0;
  options.device = [&](const std::string&) { return env.device->context(); };
  BOOST_TEST(ibev::Replay(env.dispatcher, options)
                 .play(ibev::to_recording(faults, ibev::RecordingClock::now()))
                 .injected == 2u);
  // The replay's: the device may raise events of its own meanwhile.
  const auto synthesized = [](const std::vector<Recorder::Entry>& all) {
    std::vector<Recorder::Entry> ours;
    for (const auto& entry : all) {
      if (entry.event.synthesized()) ours.push_back(entry);
    }
    return ours;
  };
  BOOST_TEST(heard.wait_until([&](const std::vector<Recorder::Entry>& all) {
    return synthesized(all).size() >= 2;
  }),
             heard.summary());
  const auto entries = synthesized(heard.entries());
  BOOST_REQUIRE_EQUAL(entries.size(), 2u);
  BOOST_TEST(entries[0].who == "qp");
  BOOST_TEST(entries[0].event.code() == IBV_EVENT_QP_FATAL);
  BOOST_TEST(entries[1].event.code() == IBV_EVENT_PORT_ERR);
  BOOST_TEST(env.errors().empty(), env.failures.summary());
}
