// Smoke test of the harness's second device: rxe0 and rxe1 sit on the two ends
// of a veth pair, so taking rxe0's end down drops the carrier of both, and
// each device reports it on its own async fd. rxe0's end also loses (and on
// up regains) its IPv6 link-local address, which changes its GID table: it
// reports GID_CHANGE beside the port event; rxe1 keeps its addresses. On up,
// rxe0 reports PORT_ACTIVE twice (admin up, then carrier up: rxe 6.1 does not
// de-duplicate); rxe1, whose admin state never changed, once.
#define BOOST_TEST_MODULE ibev_softroce_two_devices
#include <boost/test/unit_test.hpp>
#include <string>
#include <vector>

#include "tests/softroce/rdma_fixture.h"

using namespace ibev::testing;
using namespace std::chrono_literals;

namespace {

// `port_event` (exactly once for the peer, at least once for the end that was
// switched), and nothing but GID table changes beside it on the switched end.
void expect_port_event(const std::vector<Seen>& events, int port_event,
                       bool switched_end, const std::string& device) {
  int port_events = 0;
  for (const Seen& seen : events) {
    BOOST_TEST_MESSAGE(device << ": " << seen);
    BOOST_TEST(seen.port == 1);
    if (seen.code == port_event) {
      ++port_events;
    } else {
      BOOST_TEST((switched_end && seen.code == IBV_EVENT_GID_CHANGE),
                 device << " reported " << seen);
    }
  }
  BOOST_TEST((switched_end ? port_events >= 1 : port_events == 1),
             device << " reported " << port_events << " "
                                      << ibv_event_type_str(
                                             static_cast<ibv_event_type>(port_event)));
}

}  // namespace

BOOST_AUTO_TEST_CASE(veth_flap_reaches_both_devices) {
  ContextPtr first = open_device(test_device());
  ContextPtr second = open_device(test_device2());
  make_async_fd_nonblocking(first.get());
  make_async_fd_nonblocking(second.get());
  BOOST_TEST(read_events(first.get(), 200ms, 1s).empty());
  BOOST_TEST(read_events(second.get(), 200ms, 1s).empty());

  run_command("ip link set " + test_netdev() + " down");
  expect_port_event(read_events(first.get(), 1s, 10s), IBV_EVENT_PORT_ERR,
                    true, test_device());
  expect_port_event(read_events(second.get(), 1s, 10s), IBV_EVENT_PORT_ERR,
                    false, test_device2());

  run_command("ip link set " + test_netdev() + " up");
  expect_port_event(read_events(first.get(), 1s, 10s), IBV_EVENT_PORT_ACTIVE,
                    true, test_device());
  expect_port_event(read_events(second.get(), 1s, 10s), IBV_EVENT_PORT_ACTIVE,
                    false, test_device2());
}
