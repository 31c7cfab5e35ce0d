// Fault schedules for the fault campaign (issue #50), generated and shrunk
// with RapidCheck: valid by construction, over the faults the devices under
// test can take.
//
// A schedule is a run of episodes, one after the other, each after a gap:
// a port flap (port-down, then port-up after a short or a long outage), a
// gid-change, a device removed and added back over its netdev, a qp-fatal,
// a netem burst (netem, then netem-off after a while: the netdev's packets
// lost, late and reordered meanwhile), a listener outage (listener-close,
// then listener-open after a while, on the device the workload's CM
// listener is on: new connect requests rejected meanwhile), a peer outage
// (peer-kill, then peer-start after a while, on the device of the
// workload's peer process, the server: killed with SIGKILL, its
// connections gone with it, and started again). So a port-up always
// follows its port-down, an add the remove of its device, a netem-off its
// netem, a listener-open its listener-close, a peer-start its peer-kill,
// and a device is never acted on while it is removed. A schedule holds
// listener outages or peer outages, never both: the runner's peer process
// cannot close its listener. A qp-fatal
// names no QP of its own (number 0): the runner injects it into the
// workload's QP of the moment, whose number a schedule cannot know.
//
// Shrinking (RapidCheck's, of the episode list and each episode's numbers)
// drops episodes and shortens gaps, outages and bursts toward their lower
// bounds, a burst's loss toward its least and its delay and reordering
// toward none, a listener or peer outage toward its shortest: a failure
// shrinks to fewer, quicker, milder faults.
//
// Thread-safety: values and generators only; any thread.
#ifndef IBEV_TESTS_CAMPAIGN_SCHEDULE_GEN_H_
#define IBEV_TESTS_CAMPAIGN_SCHEDULE_GEN_H_

#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ibev/formats/fault_schedule.h>
#include <rapidcheck.h>
#include <rapidcheck/detail/Configuration.h>
#include <rapidcheck/detail/TestListener.h>

namespace ibev::campaign {

// A device the faults may act on: its port, and the netdev it is re-added
// over.
struct Target {
  std::string device;
  std::string netdev;
  std::uint32_t port = 1;
};

// What a schedule may hold, and its bounds (ms, both ends included).
struct Bounds {
  std::size_t max_episodes = 4;
  std::chrono::milliseconds min_gap{0}, max_gap{1000};  // before each episode
  std::chrono::milliseconds short_outage_min{50}, short_outage_max{500};
  std::chrono::milliseconds long_outage_min{1000}, long_outage_max{3000};
  bool gid_change = true;
  bool qp_fatal = true;
  bool remove = false;  // a device removed and added back
  // A netem burst: loss always, a delay (whole ms) or none, reordering only
  // with a delay (netem's rule); netem-off after the burst's length.
  bool netem = false;
  std::chrono::milliseconds netem_min{100}, netem_max{1500};  // the burst's length
  int netem_loss_min = 1, netem_loss_max = 50;                 // %, whole
  std::chrono::milliseconds netem_delay_max{100};              // 0: none
  int netem_reorder_max = 25;                                  // %, whole; 0: none
  // A listener outage: the CM listener on `listener_device` (a device the
  // faults need not otherwise act on: the server's) closed, and listening
  // again after the outage's length. Needs a listener_device.
  bool listener = false;
  std::string listener_device;
  std::chrono::milliseconds listener_min{50}, listener_max{2000};  // the outage's length
  // A peer outage: the peer process on `peer_device` (the server's, like
  // listener_device) killed with SIGKILL, and started again, listening on
  // the same port, after the outage's length. Needs a peer_device. With
  // `listener` too, each schedule holds one of the two kinds of outage.
  bool peer = false;
  std::string peer_device;
  std::chrono::milliseconds peer_min{100}, peer_max{2000};  // the outage's length
};

// Schedules over `targets` (not empty) within `bounds`. Throws
// std::invalid_argument for no target, listener outages with no
// listener_device, or peer outages with no peer_device.
rc::Gen<std::vector<Fault>> schedules(std::vector<Target> targets, Bounds bounds);

// Empty when `faults` is a schedule `schedules(targets, bounds)` could have
// made, else why not: what the runner's --schedule mode checks of a file, and
// what the generator's test checks of each schedule it makes.
std::string invalid(const std::vector<Fault>& faults, const std::vector<Target>& targets,
                    const Bounds& bounds);

// A RapidCheck run that prints nothing of its own (the campaign says what
// it found) and counts what it did: cases run, shrinks tried and taken.
class Counting : public rc::detail::TestListener {
 public:
  void onTestCaseFinished(const rc::detail::CaseDescription&) override { ++cases; }
  void onShrinkTried(const rc::detail::CaseDescription&, bool accepted) override {
    ++shrinks_tried;
    shrinks_taken += accepted ? 1 : 0;
  }
  void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}

  int cases = 0;
  int shrinks_tried = 0;
  int shrinks_taken = 0;
};

// What reproduce_string() wrote; throws std::invalid_argument for anything
// else.
rc::detail::Reproduce parse_reproduce(const std::string& text);

// Runs `property` for `cases` cases from `seed` (sizes up to 100), or, when
// `reproduce` is not empty (a string reproduce_string() gave), the one case
// it names, shrunk as it was. Bounded: the cases, and shrinking by the
// property (a runner stops failing past its budget).
template <typename Property>
rc::detail::TestResult check(Property&& property, std::uint64_t seed, int cases,
                             Counting& listener, const std::string& reproduce = "") {
  rc::detail::TestParams params;
  params.seed = seed;
  params.maxSuccess = cases;
  rc::detail::TestMetadata metadata;
  metadata.id = "campaign";
  metadata.description = "fault campaign";
  return rc::detail::checkProperty(
      rc::detail::toProperty(std::forward<Property>(property)), metadata, params, listener,
      reproduce.empty() ? std::unordered_map<std::string, rc::detail::Reproduce>{}
                        : std::unordered_map<std::string, rc::detail::Reproduce>{
                              {metadata.id, parse_reproduce(reproduce)}});
}

// What reproduces a failure of check() (RapidCheck's own record of it, in
// hex): pass it back as `reproduce`, with the same property.
std::string reproduce_string(const rc::detail::FailureResult& failure);

// For RapidCheck's counterexamples: the fault as a schedule's line.
void showValue(const Fault& fault, std::ostream& out);

}  // namespace ibev::campaign

namespace ibev {
// Found by argument-dependent lookup of Fault's namespace.
inline void showValue(const Fault& fault, std::ostream& out) { campaign::showValue(fault, out); }
}  // namespace ibev

#endif  // IBEV_TESTS_CAMPAIGN_SCHEDULE_GEN_H_
