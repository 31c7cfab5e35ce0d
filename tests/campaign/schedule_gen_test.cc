// The fault campaign's schedules (tests/campaign/schedule_gen.h): every one
// generated is valid and reads back from its file; one seed makes the same
// schedules; every fault comes up (netem bursts, listener outages and peer
// outages only when the bounds allow them, never a listener's and a peer's
// in one schedule); a failure shrinks to the least schedule that fails (one
// short flap, one netem burst, its gap, length and netem at their lowest,
// or one listener or peer outage at its shortest); a file that is no such
// schedule is told apart.
#define BOOST_TEST_MODULE ibev_campaign_schedule_gen
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>
#include <rapidcheck/boost_test.h>

#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/campaign/schedule_gen.h"

using ibev::Fault;
using namespace ibev::campaign;
using namespace std::chrono_literals;

namespace {

const std::vector<Target> kTargets{{"rxe0", "d0", 1}, {"rxe1", "v1", 1}};

// The listener's device: the server's, which is no target (as the
// campaign's runner has it).
const char kListener[] = "srv1";
// The peer process's device: the server's too in the runner; another here,
// so that each outage is seen on its own device.
const char kPeer[] = "srv2";

Bounds all_faults() {
  Bounds bounds;
  bounds.remove = true;
  bounds.netem = true;
  bounds.listener = true;
  bounds.listener_device = kListener;
  bounds.peer = true;
  bounds.peer_device = kPeer;
  return bounds;
}

std::string text(const std::vector<Fault>& faults) {
  std::ostringstream out;
  ibev::write_fault_schedule(out, faults);
  return out.str();
}

template <typename Property>
rc::detail::TestResult run(Property property, std::uint64_t seed, int cases) {
  Counting listener;
  return check(property, seed, cases, listener);
}

}  // namespace

RC_BOOST_PROP(every_schedule_is_valid_and_reads_back_from_its_file, ()) {
  const auto faults = *schedules(kTargets, all_faults());
  RC_ASSERT(invalid(faults, kTargets, all_faults()) == "");
  std::istringstream in(text(faults));
  const auto back = ibev::read_fault_schedule(in, "generated");
  RC_ASSERT(text(back) == text(faults));
}

// A campaign's seed is its reproduction: the same seed, the same schedules.
BOOST_AUTO_TEST_CASE(one_seed_makes_the_same_schedules) {
  const auto made = [](std::uint64_t seed) {
    std::vector<std::string> texts;
    run([&texts] { texts.push_back(text(*schedules(kTargets, all_faults()))); }, seed, 20);
    return texts;
  };
  const auto first = made(7);
  BOOST_TEST(first.size() == 20u);
  BOOST_TEST(first == made(7), boost::test_tools::per_element());
  BOOST_TEST(first != made(8));
}

// Every kind of fault, on every target, and schedules of every length up to
// the bound: a generator that never made one would leave it untested.
BOOST_AUTO_TEST_CASE(every_fault_every_target_and_every_length_comes_up) {
  std::set<std::string> seen;
  std::set<std::size_t> lengths;
  bool long_flap = false;
  std::set<std::string> server_outages;  // "listener-close short", "peer-kill long", ...
  std::set<std::string> netems;  // which of a netem's keys came together
  const Bounds bounds = all_faults();
  run(
      [&] {
        const auto faults = *schedules(kTargets, bounds);
        std::size_t episodes = 0;
        for (std::size_t i = 0; i < faults.size(); ++i, ++episodes) {
          seen.insert(std::string(ibev::to_string(faults[i].kind)) + " " + faults[i].device);
          if (faults[i].kind == Fault::Kind::kPortDown) {
            long_flap |= faults[i + 1].at - faults[i].at >= bounds.long_outage_min;
          }
          if (faults[i].kind == Fault::Kind::kNetem) {
            const ibev::NetemSpec& netem = faults[i].netem;
            netems.insert(std::string(netem.loss ? "loss" : "") + (netem.delay ? " delay" : "") +
                          (netem.reorder ? " reorder" : ""));
          }
          const bool server = faults[i].kind == Fault::Kind::kListenerClose ||
                              faults[i].kind == Fault::Kind::kPeerKill;
          if (server) {
            const auto length = faults[i + 1].at - faults[i].at;
            const std::string kind(ibev::to_string(faults[i].kind));
            if (length < bounds.short_outage_max) server_outages.insert(kind + " short");
            if (length >= bounds.long_outage_min) server_outages.insert(kind + " long");
          }
          if (faults[i].kind == Fault::Kind::kPortDown || faults[i].kind == Fault::Kind::kRemove ||
              faults[i].kind == Fault::Kind::kNetem || server) {
            ++i;
            seen.insert(std::string(ibev::to_string(faults[i].kind)) + " " + faults[i].device);
          }
        }
        lengths.insert(episodes);
      },
      1, 300);
  for (const char* device : {"rxe0", "rxe1"}) {
    for (const char* kind : {"port-down", "port-up", "gid-change", "qp-fatal", "remove", "add",
                             "netem", "netem-off"}) {
      BOOST_TEST(seen.count(std::string(kind) + " " + device) == 1u, kind << " " << device);
    }
  }
  BOOST_TEST(long_flap);
  // The listener's and the peer's faults each on its device only, of short
  // and long outages.
  const std::pair<std::string, std::string> server_faults[] = {{"listener-close", kListener},
                                                               {"listener-open", kListener},
                                                               {"peer-kill", kPeer},
                                                               {"peer-start", kPeer}};
  for (const auto& [kind, device] : server_faults) {
    std::set<std::string> devices;
    for (const std::string& fault : seen) {
      if (fault.rfind(kind + " ", 0) == 0) devices.insert(fault.substr(kind.size() + 1));
    }
    BOOST_TEST((devices == std::set<std::string>{device}), kind);
  }
  BOOST_TEST((server_outages == std::set<std::string>{"listener-close long", "listener-close short",
                                                      "peer-kill long", "peer-kill short"}));
  // Loss alone, with a delay, and with both: never a reorder with no delay.
  BOOST_TEST((netems == std::set<std::string>{"loss", "loss delay", "loss delay reorder"}));
  for (std::size_t n = 0; n <= bounds.max_episodes; ++n) BOOST_TEST(lengths.count(n) == 1u, n);
  BOOST_TEST(*lengths.rbegin() == bounds.max_episodes);
}

// A property that fails whenever a port goes down (as a recovery bug would
// show only across a flap): RapidCheck finds it and shrinks the schedule to
// one flap of the first target, its gap and outage at their lowest. The
// last failing schedule the property saw is the shrunk one.
BOOST_AUTO_TEST_CASE(a_failure_shrinks_to_the_least_schedule_that_fails) {
  Bounds bounds = all_faults();
  bounds.min_gap = 20ms;
  std::vector<Fault> last_failing;
  int runs = 0;
  const auto fails_on_a_port_down = [&] {
    ++runs;
    const auto faults = *schedules(kTargets, bounds);
    for (const Fault& fault : faults) {
      if (fault.kind == Fault::Kind::kPortDown) {
        last_failing = faults;
        RC_FAIL("a port went down");
      }
    }
  };
  const auto result = run(fails_on_a_port_down, 3, 100);
  BOOST_REQUIRE(result.is<rc::detail::FailureResult>());
  BOOST_TEST(text(last_failing) == "20ms port-down rxe0 1\n70ms port-up rxe0 1\n");
  BOOST_TEST_MESSAGE("found and shrunk in " << runs << " runs");

  // Its reproduce string runs that case again, and shrinks it the same way,
  // with no search.
  const std::vector<Fault> shrunk = last_failing;
  last_failing.clear();
  runs = 0;
  Counting listener;
  const auto again = check(fails_on_a_port_down, 0, 100, listener,
                           reproduce_string(result.get<rc::detail::FailureResult>()));
  BOOST_REQUIRE(again.is<rc::detail::FailureResult>());
  BOOST_TEST(text(last_failing) == text(shrunk));
  BOOST_TEST_MESSAGE("reproduced in " << runs << " runs (the shrink path's)");
}

// Bounds as they were (netem false) make no netem burst: a campaign that
// does not opt in is not given netem faults it cannot undo.
BOOST_AUTO_TEST_CASE(no_netem_burst_unless_the_bounds_allow_one) {
  BOOST_TEST(!Bounds{}.netem);
  Bounds bounds = all_faults();
  bounds.netem = false;
  std::size_t netems = 0;
  run(
      [&] {
        for (const Fault& fault : *schedules(kTargets, bounds)) {
          netems += fault.kind == Fault::Kind::kNetem || fault.kind == Fault::Kind::kNetemOff;
        }
      },
      1, 300);
  BOOST_TEST(netems == 0u);
  std::istringstream in("0s netem rxe0 loss=10%\n0.5s netem-off rxe0\n");
  const auto burst = ibev::read_fault_schedule(in, "burst");
  BOOST_TEST(invalid(burst, kTargets, all_faults()) == "");
  BOOST_TEST(invalid(burst, kTargets, bounds) == "fault 1: no netem in these bounds");
}

namespace {
struct Mildest {
  const char* name;
  Fault::Kind kind;  // the property fails at the first fault of this kind
  const char* shrunk;
  friend std::ostream& operator<<(std::ostream& out, const Mildest& m) { return out << m.name; }
};
const Mildest kMildest[] = {
    // One burst of the first target, at its lowest gap, length and loss,
    // with no delay and no reordering.
    {"packets lost", Fault::Kind::kNetem, "20ms netem rxe0 loss=1%\n120ms netem-off rxe0\n"},
    // One outage at its lowest gap and length.
    {"the listener closed", Fault::Kind::kListenerClose,
     "20ms listener-close srv1\n70ms listener-open srv1\n"},
    {"the peer killed", Fault::Kind::kPeerKill, "20ms peer-kill srv2\n120ms peer-start srv2\n"},
};
}  // namespace

// A property that fails whenever a fault of one kind comes shrinks to the
// mildest schedule with one.
BOOST_DATA_TEST_CASE(a_failure_shrinks_to_the_mildest_fault_of_its_kind,
                     boost::unit_test::data::make(kMildest),
                     mildest) {
  Bounds bounds = all_faults();
  bounds.min_gap = 20ms;
  std::vector<Fault> last_failing;
  const auto result = run(
      [&] {
        const auto faults = *schedules(kTargets, bounds);
        for (const Fault& fault : faults) {
          if (fault.kind == mildest.kind) {
            last_failing = faults;
            RC_FAIL(mildest.name);
          }
        }
      },
      5, 100);
  BOOST_REQUIRE(result.template is<rc::detail::FailureResult>());
  BOOST_TEST(text(last_failing) == mildest.shrunk);
}

namespace {
// A server outage's kind: its switch in Bounds, its device, its faults, a
// schedule of one, and what invalid() says of it in bounds without it.
struct ServerSide {
  const char* name;
  bool Bounds::*allowed;
  std::string Bounds::*device;
  Fault::Kind start, end;
  const char* outage;
  const char* refused;
  friend std::ostream& operator<<(std::ostream& out, const ServerSide& s) { return out << s.name; }
};
const ServerSide kServerSides[] = {
    {"listener", &Bounds::listener, &Bounds::listener_device, Fault::Kind::kListenerClose,
     Fault::Kind::kListenerOpen, "0s listener-close srv1\n0.5s listener-open srv1\n",
     "fault 1: no listener outage in these bounds"},
    {"peer", &Bounds::peer, &Bounds::peer_device, Fault::Kind::kPeerKill, Fault::Kind::kPeerStart,
     "0s peer-kill srv2\n0.5s peer-start srv2\n", "fault 1: no peer outage in these bounds"},
};
}  // namespace

// Bounds as they were (listener and peer false) make no such outage, and a
// schedule with one is not theirs; without one kind the other still comes
// (alone in the bounds); outages with no device to act on are refused.
BOOST_DATA_TEST_CASE(no_server_outage_unless_the_bounds_allow_one,
                     boost::unit_test::data::make(kServerSides), side) {
  BOOST_TEST(!(Bounds{}.*side.allowed));
  Bounds bounds = all_faults();
  bounds.*side.allowed = false;
  std::size_t outages = 0;
  std::size_t others = 0;  // the other kind's
  run(
      [&] {
        for (const Fault& fault : *schedules(kTargets, bounds)) {
          outages += fault.kind == side.start || fault.kind == side.end;
          others += fault.kind == Fault::Kind::kListenerClose ||
                    fault.kind == Fault::Kind::kPeerKill;
        }
      },
      1, 300);
  BOOST_TEST(outages == 0u);
  BOOST_TEST(others > 0u);
  std::istringstream in(side.outage);
  const auto outage = ibev::read_fault_schedule(in, "outage");
  BOOST_TEST(invalid(outage, kTargets, all_faults()) == "");
  BOOST_TEST(invalid(outage, kTargets, bounds) == side.refused);
  Bounds nowhere = all_faults();
  (nowhere.*side.device).clear();
  BOOST_CHECK_THROW(schedules(kTargets, nowhere), std::invalid_argument);
}

namespace {
struct Bad {
  const char* schedule;
  const char* why;
};
std::ostream& operator<<(std::ostream& out, const Bad& b) { return out << b.schedule; }
const Bad kBad[] = {
    {"0s port-up rxe0 1\n", "fault 1: a port-up with nothing before it"},
    {"0s port-down rxe0 1\n", "fault 1: not followed by its port-up"},
    {"0s port-down rxe0 1\n0.1s port-up rxe1 1\n", "not followed by its port-up"},
    {"0s port-down rxe0 1\n0.7s port-up rxe0 1\n", "its outage is out of bounds"},
    {"0s remove rxe0\n0.1s add rxe0 v1\n", "not followed by its add"},
    {"2s gid-change rxe0 1\n", "fault 1: its gap is out of bounds"},
    {"0s gid-change rxe0 2\n", "not the target's port"},
    {"0s qp-fatal rxe0 0x11\n", "a qp-fatal names the workload's QP: 0"},
    {"0s gid-change rxe2 1\n", "rxe2 is no target"},
    {"0.5ms gid-change rxe0 1\n", "not a whole ms"},
    {"0s qp-fatal rxe0 0\n0s qp-fatal rxe0 0\n0s qp-fatal rxe0 0\n0s qp-fatal rxe0 0\n"
     "0s qp-fatal rxe0 0\n",
     "more than 4 episodes"},
    {"0s netem-off rxe0\n", "fault 1: a netem-off with nothing before it"},
    {"0s netem rxe0 loss=10%\n", "fault 1: not followed by its netem-off"},
    {"0s netem rxe0 loss=10%\n0.5s netem-off rxe1\n", "not followed by its netem-off"},
    {"0s netem rxe0 loss=10%\n0.5s gid-change rxe0 1\n", "not followed by its netem-off"},
    {"0s netem rxe0 loss=10%\n0.05s netem-off rxe0\n", "its burst's length is out of bounds"},
    {"0s netem rxe0 loss=10%\n1.6s netem-off rxe0\n", "its burst's length is out of bounds"},
    {"0s netem rxe0 loss=10%\n0.5005s netem-off rxe0\n", "not a whole ms"},
    {"0s netem rxe0 delay=10ms\n0.5s netem-off rxe0\n", "its loss is not a whole % in bounds"},
    {"0s netem rxe0 loss=0%\n0.5s netem-off rxe0\n", "its loss is not a whole % in bounds"},
    {"0s netem rxe0 loss=51%\n0.5s netem-off rxe0\n", "its loss is not a whole % in bounds"},
    {"0s netem rxe0 loss=1.5%\n0.5s netem-off rxe0\n", "its loss is not a whole % in bounds"},
    {"0s netem rxe0 loss=1% delay=101ms\n0.5s netem-off rxe0\n",
     "its delay is not whole ms in bounds"},
    {"0s netem rxe0 loss=1% delay=0ms\n0.5s netem-off rxe0\n",
     "its delay is not whole ms in bounds"},
    {"0s netem rxe0 loss=1% delay=1.5ms\n0.5s netem-off rxe0\n",
     "its delay is not whole ms in bounds"},
    {"0s netem rxe0 loss=1% delay=5ms reorder=26%\n0.5s netem-off rxe0\n",
     "its reorder is not a whole % in bounds"},
    {"0s netem rxe0 loss=1% delay=5ms reorder=0%\n0.5s netem-off rxe0\n",
     "its reorder is not a whole % in bounds"},
    {"0s netem rxe2 loss=1%\n0.5s netem-off rxe2\n", "rxe2 is no target"},
    {"0s netem rxe0 loss=1%\n0.5s netem-off rxe0\n1.6s gid-change rxe0 1\n",
     "fault 3: its gap is out of bounds"},
    {"0s listener-open srv1\n", "fault 1: a listener-open with nothing before it"},
    {"0s listener-close srv1\n", "fault 1: not followed by its listener-open"},
    {"0s listener-close srv1\n0.5s listener-open rxe1\n", "not followed by its listener-open"},
    {"0s listener-close srv1\n0.1s port-down rxe0 1\n0.3s port-up rxe0 1\n"
     "1s listener-open srv1\n",
     "fault 1: not followed by its listener-open"},
    {"0s listener-close rxe1\n0.5s listener-open rxe1\n", "rxe1 is not the listener's device"},
    {"0s listener-close srv1\n0.049s listener-open srv1\n", "fault 1: its outage is out of bounds"},
    {"0s listener-close srv1\n2.001s listener-open srv1\n", "its outage is out of bounds"},
    {"0s listener-close srv1\n0.5005s listener-open srv1\n", "not a whole ms"},
    {"0.5005s listener-close srv1\n1s listener-open srv1\n", "fault 1: not a whole ms"},
    {"1.1s listener-close srv1\n1.5s listener-open srv1\n", "fault 1: its gap is out of bounds"},
    {"0s listener-close srv1\n0.5s listener-open srv1\n1.6s gid-change rxe0 1\n",
     "fault 3: its gap is out of bounds"},
    {"0s peer-start srv2\n", "fault 1: a peer-start with nothing before it"},
    {"0s peer-kill srv2\n", "fault 1: not followed by its peer-start"},
    {"0s peer-kill srv2\n0.5s peer-start rxe1\n", "not followed by its peer-start"},
    {"0s peer-kill srv2\n0.5s listener-open srv2\n", "not followed by its peer-start"},
    {"0s peer-kill srv2\n0.1s port-down rxe0 1\n0.3s port-up rxe0 1\n1s peer-start srv2\n",
     "fault 1: not followed by its peer-start"},
    {"0s peer-kill srv1\n0.5s peer-start srv1\n", "fault 1: srv1 is not the peer's device"},
    {"0s peer-kill srv2\n0.099s peer-start srv2\n", "fault 1: its outage is out of bounds"},
    {"0s peer-kill srv2\n2.001s peer-start srv2\n", "its outage is out of bounds"},
    {"0s peer-kill srv2\n0.5005s peer-start srv2\n", "not a whole ms"},
    {"1.1s peer-kill srv2\n1.5s peer-start srv2\n", "fault 1: its gap is out of bounds"},
    // The runner's peer process cannot close its listener: one kind a
    // schedule, whichever comes first.
    {"0s listener-close srv1\n0.5s listener-open srv1\n0.6s peer-kill srv2\n1s peer-start srv2\n",
     "fault 3: a listener outage and a peer outage in one schedule"},
    {"0s peer-kill srv2\n0.5s peer-start srv2\n0.6s listener-close srv1\n1s listener-open srv1\n",
     "fault 3: a listener outage and a peer outage in one schedule"},
};
}  // namespace

BOOST_DATA_TEST_CASE(a_schedule_it_could_not_make_is_told_apart, boost::unit_test::data::make(kBad),
                     b) {
  std::istringstream in(b.schedule);
  const auto why = invalid(ibev::read_fault_schedule(in, "bad"), kTargets, all_faults());
  BOOST_TEST(why.find(b.why) != std::string::npos, why);
}
