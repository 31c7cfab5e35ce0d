// When a recovering connection tries again and when it gives up
// (health/recovery.h): the backoff doubles to its cap and jitter only ever
// shortens it, within its share; the damping window fails the down after
// max_recoveries recoveries and forgets recoveries older than the window; an
// outage gives up after give_up_after; a bad policy is refused by name.
// The ladder (RecoveryLadder) turns what happened into one action each,
// stamped with its step: every rung of an outage, replayed without threads.
#define BOOST_TEST_MODULE ibev_recovery
#include <ibev/health/recovery.h>

#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <functional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

using ibev::ConnectionState;
using ibev::RecoveryAction;
using ibev::RecoveryDecision;
using ibev::RecoveryInput;
using ibev::RecoveryLadder;
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

// --- The ladder ---

namespace {

using In = RecoveryInput::Kind;
using Do = RecoveryAction::Kind;

RecoveryLadder ladder(RecoveryLadder::Mode mode = RecoveryLadder::Mode::kResetInPlace,
                      RecoveryPolicy policy = no_jitter()) {
  return RecoveryLadder(policy, 1, mode, true);
}

// What the ladder said, as a test reads it: "wait 100", "drain", "fail: why".
std::string said(const RecoveryAction& action) {
  std::string out(ibev::to_string(action.kind));
  if (action.kind == Do::kWait) {
    out += action.delay ? " " + std::to_string(action.delay->count()) : std::string(" port");
    if (action.outage_began) out += " timed";
  }
  if (action.kind == Do::kFail) out += ": " + action.why;
  return out;
}

}  // namespace

// One outage in place, top to bottom: down, wait, drain, reset, recovering,
// up; the up counts in the damping window.
BOOST_AUTO_TEST_CASE(an_outage_in_place_climbs_the_ladder) {
  RecoveryLadder l = ladder();
  const Clock::time_point t0;
  const auto down = l.changed(ConnectionState::kDown, t0);
  const RecoveryAction wait = l.next({In::kWentDown, down, true}, t0);
  BOOST_TEST(said(wait) == "wait 100 timed");
  BOOST_TEST(wait.step == down);
  const RecoveryAction drain = l.next({In::kWaited, wait.step}, t0 + 100ms);
  BOOST_TEST(said(drain) == "drain");
  BOOST_TEST(said(l.next({In::kDrained, drain.step}, t0 + 110ms)) == "reset");
  const auto recovering = l.changed(ConnectionState::kRecovering, t0 + 110ms);
  BOOST_TEST(recovering > drain.step);
  BOOST_TEST(l.attempt_number() == 1u);
  l.changed(ConnectionState::kUp, t0 + 120ms, true);
  BOOST_TEST(!l.current(recovering));  // the attempt's step is over
}

// An attempt that fails (a cause while recovering) is followed by the next,
// farther apart; one that failed before recovering (its drain) likewise.
BOOST_AUTO_TEST_CASE(a_failed_attempt_waits_longer) {
  RecoveryLadder l = ladder();
  const Clock::time_point t0;
  auto at = l.changed(ConnectionState::kDown, t0);
  auto wait = l.next({In::kWentDown, at, true}, t0);
  auto drain = l.next({In::kWaited, wait.step}, t0);
  l.next({In::kDrained, drain.step}, t0);
  l.changed(ConnectionState::kRecovering, t0);
  at = l.changed(ConnectionState::kDown, t0 + 1ms);  // the attempt's connect threw
  wait = l.next({In::kAttemptFailed, at, true}, t0 + 1ms);
  BOOST_TEST(said(wait) == "wait 200");
  BOOST_TEST(l.attempt_number() == 2u);
  drain = l.next({In::kWaited, wait.step}, t0 + 201ms);
  BOOST_TEST(said(drain) == "drain");
  at = l.failed_early();  // the drain failed
  BOOST_TEST(!l.current(drain.step));
  BOOST_TEST(said(l.next({In::kAttemptFailed, at, true}, t0 + 202ms)) == "wait 400");
}

// Every answer asked at an earlier step is ignored: a late timer, a late
// drain, a second timer for the same wait, a supervision overtaken.
BOOST_AUTO_TEST_CASE(a_stale_answer_does_nothing) {
  RecoveryLadder l = ladder();
  const Clock::time_point t0;
  const auto at = l.changed(ConnectionState::kDown, t0);
  const auto wait = l.next({In::kWentDown, at, true}, t0);
  BOOST_TEST(said(l.next({In::kWentDown, at, true}, t0)) == "nothing");  // supervised once
  const auto drain = l.next({In::kWaited, wait.step}, t0);
  BOOST_TEST(said(l.next({In::kWaited, wait.step}, t0)) == "nothing");  // a second timer
  l.changed(ConnectionState::kUp, t0);  // the application brought it up meanwhile
  BOOST_TEST(said(l.next({In::kDrained, drain.step}, t0)) == "nothing");
  BOOST_TEST(said(l.next({In::kOverdue}, t0 + 1h)) == "nothing");
  l.close();
  BOOST_TEST(said(l.next({In::kWentDown, l.step(), true}, t0)) == "nothing");
}

// In place, a down port holds the attempt until PORT_ACTIVE, which starts
// the wait the backoff chose; a QP to be replaced goes on every max_delay,
// and PORT_ACTIVE is the way back at once.
BOOST_AUTO_TEST_CASE(a_down_port_holds_the_wait) {
  const Clock::time_point t0;
  RecoveryLadder in_place = ladder();
  auto at = in_place.changed(ConnectionState::kDown, t0);
  BOOST_TEST(said(in_place.next({In::kWentDown, at, false}, t0)) == "wait port timed");
  BOOST_TEST(said(in_place.next({In::kPortActive}, t0 + 5s)) == "wait 100");
  BOOST_TEST(said(in_place.next({In::kPortActive}, t0 + 5s)) == "nothing");  // rxe raises it twice

  RecoveryLadder replaced = ladder(RecoveryLadder::Mode::kReconnect);
  at = replaced.changed(ConnectionState::kDown, t0);
  BOOST_TEST(said(replaced.next({In::kWentDown, at, false}, t0)) == "wait 1000 timed");
  BOOST_TEST(said(replaced.next({In::kPortActive}, t0 + 5s)) == "wait 0");
}

// The way back during an attempt: the attempt is into a dead link, aborted,
// and the next one waits for nothing; while down and not yet supervised,
// the supervision waits for nothing.
BOOST_AUTO_TEST_CASE(the_way_back_aborts_an_attempt_and_hurries_the_next) {
  const Clock::time_point t0;
  RecoveryLadder l = ladder(RecoveryLadder::Mode::kReconnect);
  auto at = l.changed(ConnectionState::kDown, t0);
  auto wait = l.next({In::kWentDown, at, true}, t0);
  auto drain = l.next({In::kWaited, wait.step}, t0);
  BOOST_TEST(said(l.next({In::kDrained, drain.step}, t0)) == "reconnect");
  l.changed(ConnectionState::kRecovering, t0);
  BOOST_TEST(said(l.next({In::kRetryNow}, t0)) == "abort");
  at = l.changed(ConnectionState::kDown, t0);  // the abort's cause
  BOOST_TEST(said(l.next({In::kAttemptFailed, at, true}, t0)) == "wait 0");

  RecoveryLadder first = RecoveryLadder(no_jitter(), 1, RecoveryLadder::Mode::kReconnect, false);
  at = first.first_attempt();
  BOOST_TEST(said(first.next({In::kWentDown, at, true}, t0)) == "wait 0 timed");
}

// The way back while an attempt waits starts it at once, and the one after
// it too should it fail; then the backoff again. The hurry ends with the
// outage (0.9.0 carried it into the next outage's first attempt).
BOOST_AUTO_TEST_CASE(the_way_back_hurries_this_outage_only) {
  const Clock::time_point t0;
  RecoveryLadder l = ladder();
  auto at = l.changed(ConnectionState::kDown, t0);
  const auto wait = l.next({In::kWentDown, at, true}, t0);
  BOOST_TEST(said(wait) == "wait 100 timed");
  const auto now = l.next({In::kRetryNow}, t0 + 10ms);
  BOOST_TEST(said(now) == "wait 0");
  BOOST_TEST(said(l.next({In::kWaited, wait.step}, t0 + 10ms)) == "drain");  // either timer
  BOOST_TEST(said(l.next({In::kWaited, now.step}, t0 + 10ms)) == "nothing");  // starts it once
  at = l.failed_early();
  BOOST_TEST(said(l.next({In::kAttemptFailed, at, true}, t0 + 20ms)) == "wait 0");
  at = l.failed_early();
  BOOST_TEST(said(l.next({In::kAttemptFailed, at, true}, t0 + 30ms)) == "wait 400");
  // Hurried, then up: the next outage waits its first delay.
  l.next({In::kRetryNow}, t0 + 40ms);
  l.changed(ConnectionState::kUp, t0 + 50ms, true);
  at = l.changed(ConnectionState::kDown, t0 + 60ms);
  BOOST_TEST(said(l.next({In::kWentDown, at, true}, t0 + 60ms)) == "wait 100 timed");
}

// The way back before supervision outranks a port that still reads down
// (it would start the wait held for PORT_ACTIVE); during the drain or the
// reset it aborts nothing (nothing is into the dead link yet) but hurries
// the next attempt, should this one fail.
BOOST_AUTO_TEST_CASE(the_way_back_is_kept_until_it_can_act) {
  const Clock::time_point t0;
  RecoveryLadder l = ladder();
  auto at = l.changed(ConnectionState::kDown, t0);
  BOOST_TEST(said(l.next({In::kRetryNow}, t0)) == "nothing");
  const auto wait = l.next({In::kWentDown, at, false}, t0);
  BOOST_TEST(said(wait) == "wait 0 timed");
  const auto drain = l.next({In::kWaited, wait.step}, t0);
  BOOST_TEST(said(l.next({In::kRetryNow}, t0)) == "nothing");  // draining
  BOOST_TEST(said(l.next({In::kDrained, drain.step}, t0)) == "reset");
  BOOST_TEST(said(l.next({In::kRetryNow}, t0)) == "nothing");  // resetting, not yet recovering
  l.changed(ConnectionState::kRecovering, t0);
  at = l.changed(ConnectionState::kDown, t0 + 1ms);  // its connect threw
  BOOST_TEST(said(l.next({In::kAttemptFailed, at, true}, t0 + 1ms)) == "wait 0");
}

// The ladder fails an outage by its clock (give_up_after) and a storm by
// the damping window; the first up of a connection made down is no recovery.
BOOST_AUTO_TEST_CASE(the_ladder_gives_up_as_the_schedule_says) {
  RecoveryPolicy policy = no_jitter();
  policy.give_up_after = 2000ms;
  policy.max_recoveries = 1;
  const Clock::time_point t0;
  RecoveryLadder l(policy, 1, RecoveryLadder::Mode::kResetInPlace, false);
  auto at = l.changed(ConnectionState::kDown, t0);
  l.next({In::kWentDown, at, false}, t0);
  BOOST_TEST(said(l.next({In::kOverdue}, t0 + 1999ms)) == "nothing");
  BOOST_TEST(said(l.next({In::kOverdue}, t0 + 2000ms)) ==
             "fail: not recovered in 2000 ms (0 attempts failed)");
  l.changed(ConnectionState::kUp, t0 + 3s, true);  // the first up: not counted
  at = l.changed(ConnectionState::kDown, t0 + 4s);
  BOOST_TEST(said(l.next({In::kWentDown, at, true}, t0 + 4s)) == "wait 100 timed");
  l.changed(ConnectionState::kUp, t0 + 4100ms, true);  // counted: 1 of 1
  at = l.changed(ConnectionState::kDown, t0 + 4200ms);
  BOOST_TEST(said(l.next({In::kWentDown, at, true}, t0 + 4200ms)) ==
             "fail: down again after 1 recoveries in 3000 ms (damped)");
}

BOOST_AUTO_TEST_SUITE_END()
