// When a recovering connection tries again and when it gives up
// (core/recovery.h): the backoff doubles to its cap and jitter only ever
// shortens it, within its share; the damping window fails the down after
// max_recoveries recoveries and forgets recoveries older than the window; an
// outage gives up after give_up_after; a bad policy is refused by name.
#define BOOST_TEST_MODULE ibev_recovery
#include <ibev/core/recovery.h>

#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <functional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

using ibev::RecoveryDecision;
using ibev::RecoveryPolicy;
using ibev::RecoverySchedule;
using namespace std::chrono_literals;
namespace bdata = boost::unit_test::data;
using Clock = RecoverySchedule::Clock;

namespace {

RecoveryPolicy no_jitter() {
  RecoveryPolicy policy;
  policy.first_delay = 100ms;
  policy.max_delay = 1000ms;
  policy.jitter = 0.0;
  return policy;
}

long long delay_of(const RecoveryDecision& decision) {
  BOOST_REQUIRE_MESSAGE(decision.delay.has_value(), "gave up: " + decision.why);
  return decision.delay->count();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(recovery)

// Without jitter: 100, 200, 400, 800, then the cap, however many attempts.
BOOST_AUTO_TEST_CASE(the_backoff_doubles_to_its_cap) {
  RecoverySchedule schedule(no_jitter(), 1);
  const Clock::time_point t0;
  std::vector<long long> delays{delay_of(schedule.went_down(t0))};
  for (int i = 0; i < 40; ++i) delays.push_back(delay_of(schedule.attempt_failed(t0 + 1ms)));
  const std::vector<long long> first{100, 200, 400, 800, 1000, 1000};
  BOOST_TEST(std::vector<long long>(delays.begin(), delays.begin() + 6) == first,
             boost::test_tools::per_element());
  BOOST_TEST(delays.back() == 1000);
  BOOST_TEST(schedule.attempts() == 40u);
}

// With jitter j each delay lies in (base x (1 - j), base]; over many seeds
// the delays spread over that range rather than sitting on one value.
BOOST_DATA_TEST_CASE(jitter_only_shortens_within_its_share, bdata::make({0.1, 0.5, 1.0}), jitter) {
  RecoveryPolicy policy = no_jitter();
  policy.jitter = jitter;
  long long lowest = 1000, highest = 0;
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    RecoverySchedule schedule(policy, seed);
    const Clock::time_point t0;
    const long long first = delay_of(schedule.went_down(t0));
    const long long second = delay_of(schedule.attempt_failed(t0));
    BOOST_TEST(first <= 100);
    BOOST_TEST(first >= static_cast<long long>(100 * (1 - jitter)));
    BOOST_TEST(second <= 200);
    BOOST_TEST(second >= static_cast<long long>(200 * (1 - jitter)));
    lowest = std::min(lowest, first);
    highest = std::max(highest, first);
  }
  BOOST_TEST(highest - lowest >= static_cast<long long>(100 * jitter / 2));
}

// The same seed draws the same delays: a run can be replayed.
BOOST_AUTO_TEST_CASE(a_seed_replays_its_delays) {
  RecoveryPolicy policy = no_jitter();
  policy.jitter = 0.5;
  RecoverySchedule a(policy, 42), b(policy, 42);
  const Clock::time_point t0;
  BOOST_TEST(delay_of(a.went_down(t0)) == delay_of(b.went_down(t0)));
  for (int i = 0; i < 5; ++i) BOOST_TEST(delay_of(a.attempt_failed(t0)) == delay_of(b.attempt_failed(t0)));
}

namespace {
struct Storm {
  unsigned max_recoveries;
  int spacing_ms;  // between one recovery and the next down
  int downs;       // how many times the connection goes down
  int recovered;   // how many of them recover before one is damped (downs: none is)
  friend std::ostream& operator<<(std::ostream& out, const Storm& s) {
    return out << s.max_recoveries << " in 3000 ms, a down every " << s.spacing_ms << " ms";
  }
};
// A window of 3 s. Downs closer together than window / max_recoveries are
// damped after max_recoveries; farther apart, the oldest has left the window.
const Storm kStorms[] = {
    {3, 300, 10, 3},   // 10 errors in 3 s: 3 recoveries, the 4th down fails
    {1, 300, 10, 1},
    {3, 1100, 10, 10},  // at most 3 within any 3 s: never damped
    {3, 900, 10, 3},    // 4 downs within 2.7 s: damped
};
}  // namespace

BOOST_DATA_TEST_CASE(the_damping_window_fails_a_storm, bdata::make(kStorms), storm) {
  RecoveryPolicy policy = no_jitter();
  policy.max_recoveries = storm.max_recoveries;
  policy.window = 3000ms;
  RecoverySchedule schedule(policy, 7);
  Clock::time_point now;
  int recovered = 0;
  for (int i = 0; i < storm.downs; ++i) {
    const RecoveryDecision decision = schedule.went_down(now);
    if (!decision.delay) {
      BOOST_TEST(decision.why.find("recoveries in 3000 ms (damped)") != std::string::npos,
                 decision.why);
      break;
    }
    schedule.recovered(now + 10ms);
    ++recovered;
    now += std::chrono::milliseconds(storm.spacing_ms);
  }
  BOOST_TEST(recovered == storm.recovered);
}

// An outage whose attempts keep failing (a port that never comes back) gives
// up once it has lasted give_up_after, and overdue() says so for a timer.
BOOST_AUTO_TEST_CASE(an_outage_gives_up_after_its_time) {
  RecoveryPolicy policy = no_jitter();
  policy.give_up_after = 2000ms;
  RecoverySchedule schedule(policy, 3);
  const Clock::time_point t0;
  BOOST_TEST(!schedule.overdue(t0 + 5s));  // no outage: nothing is overdue
  delay_of(schedule.went_down(t0));
  delay_of(schedule.attempt_failed(t0 + 1999ms));
  BOOST_TEST(!schedule.overdue(t0 + 1999ms));
  const auto why = schedule.overdue(t0 + 2000ms);
  BOOST_REQUIRE(why.has_value());
  BOOST_TEST(*why == "not recovered in 2000 ms (1 attempts failed)");
  const RecoveryDecision last = schedule.attempt_failed(t0 + 2000ms);
  BOOST_TEST(!last.delay.has_value());
  BOOST_TEST(last.why == "not recovered in 2000 ms (2 attempts failed)");
  // Given up, the outage is over: the next down begins a new one.
  BOOST_TEST(schedule.attempts() == 0u);
  BOOST_TEST(delay_of(schedule.went_down(t0 + 3s)) == 100);
}

// ended() closes an outage without counting it as a recovery.
BOOST_AUTO_TEST_CASE(an_ended_outage_is_no_recovery) {
  RecoveryPolicy policy = no_jitter();
  policy.max_recoveries = 1;
  RecoverySchedule schedule(policy, 3);
  const Clock::time_point t0;
  for (int i = 0; i < 5; ++i) {
    delay_of(schedule.went_down(t0 + std::chrono::milliseconds(i)));
    schedule.ended();
  }
  schedule.recovered(t0 + 10ms);
  BOOST_TEST(!schedule.went_down(t0 + 20ms).delay.has_value());
}

namespace {
struct Bad {
  const char* message;
  std::function<void(RecoveryPolicy&)> edit;
  friend std::ostream& operator<<(std::ostream& out, const Bad& b) { return out << b.message; }
};
const Bad kBad[] = {
    {"first_delay is not above 0", [](RecoveryPolicy& p) { p.first_delay = 0ms; }},
    {"first_delay is not above 0", [](RecoveryPolicy& p) { p.first_delay = -5ms; }},
    {"max_delay is below first_delay", [](RecoveryPolicy& p) { p.max_delay = 50ms; }},
    {"jitter is outside [0, 1]", [](RecoveryPolicy& p) { p.jitter = -0.1; }},
    {"jitter is outside [0, 1]", [](RecoveryPolicy& p) { p.jitter = 1.5; }},
    {"max_recoveries is 0", [](RecoveryPolicy& p) { p.max_recoveries = 0; }},
    {"window is not above 0", [](RecoveryPolicy& p) { p.window = 0ms; }},
    {"give_up_after is not above 0", [](RecoveryPolicy& p) { p.give_up_after = -1ms; }},
};
}  // namespace

BOOST_DATA_TEST_CASE(a_bad_policy_is_refused_by_name, bdata::make(kBad), bad) {
  RecoveryPolicy policy;
  bad.edit(policy);
  try {
    RecoverySchedule schedule(policy, 0);
    BOOST_FAIL("accepted");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(std::string(e.what()).find(bad.message) != std::string::npos, e.what());
    BOOST_TEST(std::string(e.what()).rfind("RecoveryPolicy: ", 0) == 0u, e.what());
  }
}

BOOST_AUTO_TEST_SUITE_END()
