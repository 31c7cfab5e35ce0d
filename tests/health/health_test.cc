// A connection's health (health/health.h): which events, completions and CM
// events are causes, every state's answer to every move, and one transition per change
// however many causes come.
#define BOOST_TEST_MODULE ibev_health
#include <ibev/health/health.h>

#include <ibev/cm/cm_event_type.h>

#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

using ibev::ConnectionState;
using ibev::HealthCause;
using ibev::HealthChange;
using ibev::HealthSource;
using ibev::HealthState;
namespace bdata = boost::unit_test::data;

namespace {

HealthCause application(const std::string& what) {
  return HealthCause{HealthSource::kApplication, 0, 0, what};
}

// Every code rdma-core names (0..19), one a newer kernel may send, one nobody does.
std::vector<int> event_codes() {
  std::vector<int> codes;
  for (int code = 0; code <= 21; ++code) codes.push_back(code);
  codes.push_back(1000);
  return codes;
}

const std::set<int> kDownEvents{IBV_EVENT_QP_FATAL,     IBV_EVENT_QP_REQ_ERR,
                                IBV_EVENT_QP_ACCESS_ERR, IBV_EVENT_PATH_MIG_ERR,
                                IBV_EVENT_PORT_ERR,     IBV_EVENT_DEVICE_FATAL};

enum class Move { kCause, kRecovering, kUp, kFail };

struct Row {
  ConnectionState from;
  Move move;
  std::optional<ConnectionState> to;  // none: no transition
  friend std::ostream& operator<<(std::ostream& out, const Row& row) {
    return out << row.from << " move " << static_cast<int>(row.move);
  }
};

using S = ConnectionState;
const Row kRows[] = {
    {S::kUp, Move::kCause, S::kDown},
    {S::kUp, Move::kRecovering, std::nullopt},
    {S::kUp, Move::kUp, std::nullopt},
    {S::kUp, Move::kFail, S::kFailed},
    {S::kDown, Move::kCause, std::nullopt},
    {S::kDown, Move::kRecovering, S::kRecovering},
    {S::kDown, Move::kUp, S::kUp},
    {S::kDown, Move::kFail, S::kFailed},
    {S::kRecovering, Move::kCause, S::kDown},
    {S::kRecovering, Move::kRecovering, std::nullopt},
    {S::kRecovering, Move::kUp, S::kUp},
    {S::kRecovering, Move::kFail, S::kFailed},
    {S::kFailed, Move::kCause, std::nullopt},
    {S::kFailed, Move::kRecovering, std::nullopt},
    {S::kFailed, Move::kUp, std::nullopt},
    {S::kFailed, Move::kFail, std::nullopt},
};

std::optional<HealthChange> apply(HealthState& health, Move move) {
  switch (move) {
    case Move::kCause:
      return health.cause(application("cause"));
    case Move::kRecovering:
      return health.recovering();
    case Move::kUp:
      return health.up();
    case Move::kFail:
      return health.fail(application("given up"));
  }
  return std::nullopt;
}

}  // namespace

BOOST_DATA_TEST_CASE(exactly_the_fatal_and_error_events_are_causes, bdata::make(event_codes()),
                     code) {
  const bool down = kDownEvents.count(code) != 0;
  BOOST_TEST(ibev::is_down_event(code) == down);
  const std::optional<HealthCause> cause = HealthCause::of_event(code);
  BOOST_TEST(cause.has_value() == down);
  if (cause) {
    BOOST_TEST((cause->source == HealthSource::kAsyncEvent));
    BOOST_TEST(cause->code == code);
    BOOST_TEST(cause->what.find("IBV_EVENT_") == 0u, cause->what);
  }
}

// IBV_WC_SUCCESS (0) through IBV_WC_TM_RNDV_INCOMPLETE (23): every status but
// a success and a flush is a cause, and names its work request.
BOOST_DATA_TEST_CASE(every_error_completion_but_a_flush_is_a_cause, bdata::xrange(0, 24),
                     status) {
  ibv_wc wc{};
  wc.status = static_cast<ibv_wc_status>(status);
  wc.wr_id = 77;
  const std::optional<HealthCause> cause = HealthCause::of_completion(wc);
  const bool expected = status != IBV_WC_SUCCESS && status != IBV_WC_WR_FLUSH_ERR;
  BOOST_TEST(cause.has_value() == expected);
  if (cause) {
    BOOST_TEST((cause->source == HealthSource::kCompletion));
    BOOST_TEST(cause->code == status);
    BOOST_TEST(cause->wr_id == 77u);
    BOOST_TEST(cause->what.find("(wr_id 77)") != std::string::npos, cause->what);
  }
}

// RDMA_CM_EVENT_ADDR_RESOLVED (0) through TIMEWAIT_EXIT (15), and two codes
// a newer librdmacm may send.
BOOST_DATA_TEST_CASE(the_cm_events_that_end_a_connection_are_causes, bdata::xrange(0, 18), code) {
  const std::set<int> ends{RDMA_CM_EVENT_CONNECT_ERROR, RDMA_CM_EVENT_UNREACHABLE,
                           RDMA_CM_EVENT_REJECTED,      RDMA_CM_EVENT_DISCONNECTED,
                           RDMA_CM_EVENT_DEVICE_REMOVAL, RDMA_CM_EVENT_TIMEWAIT_EXIT};
  const std::optional<HealthCause> cause = ibev::health_cause_of_cm_event(code);
  BOOST_TEST(cause.has_value() == (ends.count(code) != 0));
  if (cause) {
    BOOST_TEST((cause->source == HealthSource::kCmEvent));
    BOOST_TEST(cause->code == code);
    BOOST_TEST(cause->what == ibev::describe_cm_event_code(code));
  }
}

BOOST_DATA_TEST_CASE(every_state_answers_every_move, bdata::make(kRows), row) {
  HealthState health(row.from);
  const std::optional<HealthChange> change = apply(health, row.move);
  BOOST_TEST(change.has_value() == row.to.has_value());
  if (change) {
    BOOST_TEST(change->from == row.from);
    BOOST_TEST(change->to == *row.to);
  }
  BOOST_TEST(health.state() == row.to.value_or(row.from));
}

// Causes keep coming while the connection is down (the flushes of an error
// completion's QP, the port's and the device's news): the application hears
// one change, with the first cause, and every cause is kept.
BOOST_AUTO_TEST_CASE(one_transition_per_change_however_many_causes) {
  HealthState health;
  const auto first = health.cause(application("first"));
  BOOST_REQUIRE(first.has_value());
  BOOST_TEST(first->cause.what == "first");
  BOOST_TEST(!health.cause(application("second")).has_value());
  BOOST_TEST(!health.cause(application("third")).has_value());
  BOOST_TEST(health.causes().size() == 3u);

  const auto recovering = health.recovering();
  BOOST_REQUIRE(recovering.has_value());
  BOOST_TEST(recovering->cause.what == "first");  // what it recovers from

  // The attempt failed: down again, for that reason.
  const auto again = health.cause(application("attempt failed"));
  BOOST_REQUIRE(again.has_value());
  BOOST_TEST((again->from == S::kRecovering && again->to == S::kDown));
  BOOST_TEST(again->cause.what == "attempt failed");

  const auto up = health.up();
  BOOST_REQUIRE(up.has_value());
  BOOST_TEST(up->cause.what == "first");
  BOOST_TEST(health.causes().empty());  // a new outage starts a new list
}

BOOST_AUTO_TEST_CASE(failed_is_for_good_and_says_why) {
  HealthState health;
  static_cast<void>(health.cause(application("port down")));
  const auto failed = health.fail(application("3 recoveries in 3 s"));
  BOOST_REQUIRE(failed.has_value());
  BOOST_TEST(failed->cause.what == "3 recoveries in 3 s");
  for (Move move : {Move::kCause, Move::kRecovering, Move::kUp, Move::kFail}) {
    BOOST_TEST(!apply(health, move).has_value());
  }
  BOOST_TEST(health.state() == S::kFailed);
  BOOST_TEST(health.causes().front().what == "port down");
}
