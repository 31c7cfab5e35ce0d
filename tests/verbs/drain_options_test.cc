// A drain refuses DrainOptions it cannot honour before it touches the QP:
// a time not above zero would move the QP to ERR only to time out (or, for
// a negative one, fail in the Dispatcher's call_after with an error that
// names neither the drain nor the field).
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <ostream>
#include <stdexcept>
#include <string>

#include <ibev/verbs/queue_pair.h>

namespace bdata = boost::unit_test::data;
using namespace std::chrono_literals;

namespace {

struct BadTime {
  const char* name;
  ibev::DrainOptions options;
  const char* says;  // what the error must name
};
std::ostream& operator<<(std::ostream& out, const BadTime& bad) { return out << bad.name; }

ibev::DrainOptions with(std::chrono::milliseconds timeout,
                        std::chrono::milliseconds last_wqe_timeout) {
  ibev::DrainOptions options;
  options.timeout = timeout;
  options.last_wqe_timeout = last_wqe_timeout;
  return options;
}

const BadTime kBadTimes[] = {
    {"a negative timeout", with(-1ms, 500ms), "DrainOptions::timeout is -1 ms"},
    {"a zero timeout", with(0ms, 500ms), "DrainOptions::timeout is 0 ms"},
    {"a negative last_wqe_timeout", with(5000ms, -5ms), "DrainOptions::last_wqe_timeout is -5 ms"},
    {"a zero last_wqe_timeout", with(5000ms, 0ms), "DrainOptions::last_wqe_timeout is 0 ms"},
};

}  // namespace

BOOST_AUTO_TEST_SUITE(drain_options)

BOOST_DATA_TEST_CASE(a_time_not_above_zero_is_refused_naming_the_verb_and_the_field,
                     bdata::make(kBadTimes), bad) {
  try {
    ibev::detail::check_drain_options(bad.options, "QueuePair::drain_send");
    BOOST_FAIL("accepted");
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    BOOST_TEST(what.find("QueuePair::drain_send: ") == 0u, what);
    BOOST_TEST(what.find(bad.says) != std::string::npos, what);
  }
}

BOOST_AUTO_TEST_CASE(the_defaults_and_one_millisecond_are_taken) {
  BOOST_CHECK_NO_THROW(ibev::detail::check_drain_options({}, "QueuePair::drain"));
  BOOST_CHECK_NO_THROW(ibev::detail::check_drain_options(with(1ms, 1ms), "QueuePair::drain"));
}

BOOST_AUTO_TEST_SUITE_END()
