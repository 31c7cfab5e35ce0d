// Async events end to end, on soft-RoCE, through Device, CQ, QP and SRQ
// handlers: the six types rxe raises, triggered for real; the fourteen it
// never raises, injected on real objects. Each must reach exactly the right
// object's handler, or the right device's listeners, and nobody else.
// Runs with two devices (rxe0 on v0, rxe1 on v1, a veth pair).
#define BOOST_TEST_MODULE ibev_softroce_events
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <set>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "tests/softroce/rdma_fixture.h"
#include "tests/softroce/verbs_fixture.h"
#include "tests/support/testing.h"
#include <ibev/verbs/work_queue.h>

namespace bdata = boost::unit_test::data;
using namespace ibev;
using namespace ibev::testing;
using namespace std::chrono_literals;

namespace {

// Two of each object on rxe0, every handler recording under its own name,
// a listener on each device; QPs a1 -> b1 connected, b1 on srq1.
struct World {
  Env env{test_device()};
  Recorder heard;
  std::shared_ptr<CompletionQueue> cq1, cq2;
  std::shared_ptr<SharedReceiveQueue> srq1, srq2;
  std::shared_ptr<QueuePair> a1, b1, qp2;
  std::array<char, 64 * 32> buffer{};
  std::shared_ptr<MemoryRegion> mr;
  std::vector<Handle> listeners;

  World() {
    CompletionQueue::Options one_entry;
    one_entry.cqe = 1;  // overflows on the second completion: CQ_ERR
    cq1 = CompletionQueue::create_polled(env.device, heard.as("cq1"), one_entry);
    cq2 = CompletionQueue::create_polled(env.device, heard.as("cq2"));
    srq1 = SharedReceiveQueue::create(env.pd, heard.as("srq1"));
    srq2 = SharedReceiveQueue::create(env.pd, heard.as("srq2"));
    auto recv_cq = plain_cq(env.device, 256);
    QueuePair::Options a_options{cq1, recv_cq, nullptr, IBV_QPT_RC, {16, 16, 1, 1, 0}, false, std::nullopt};
    QueuePair::Options b_options{recv_cq, recv_cq, srq1, IBV_QPT_RC, {16, 16, 1, 1, 0}, false, std::nullopt};
    QueuePair::Options other{cq2, cq2, nullptr, IBV_QPT_RC, {16, 16, 1, 1, 0}, false, std::nullopt};
    a1 = QueuePair::create(env.pd, heard.as("a1"), a_options);
    b1 = QueuePair::create(env.pd, heard.as("b1"), b_options);
    qp2 = QueuePair::create(env.pd, heard.as("qp2"), other);
    connect_rc_pair(*a1, *b1);
    mr = MemoryRegion::create(env.pd, buffer.data(), buffer.size(),
                              IBV_ACCESS_LOCAL_WRITE);
    listeners.push_back(env.device->on_event({}, heard.as("rxe0 listener")));
  }

  char* slot(int i) { return buffer.data() + 64 * i; }

  // Exactly `who` heard exactly `code` (count times, or at least once when
  // count is 0), and nobody heard anything else.
  void expect_only(const std::string& who, int code, std::size_t count = 1) {
    BOOST_TEST_MESSAGE("heard: " << heard.summary());
    const auto all = heard.entries();
    std::size_t mine = 0;
    for (const auto& e : all) {
      BOOST_TEST(e.who == who, e.who << " heard " << e.event.name());
      BOOST_TEST(e.event.code() == code, who << " heard " << e.event.name());
      mine += e.who == who ? 1 : 0;
    }
    if (count == 0) {
      BOOST_TEST(mine >= 1u);
    } else {
      BOOST_TEST(mine == count);
    }
  }

  // What expect_only() fails on, looked at while more may still come:
  // someone else heard something, or `who` heard another code or more than
  // `count` times (no bound when count is 0).
  bool heard_beyond(const std::string& who, int code, std::size_t count = 1) {
    std::size_t mine = 0;
    for (const auto& e : heard.entries()) {
      if (e.who != who || e.event.code() != code) return true;
      ++mine;
    }
    return count != 0 && mine > count;
  }
};

// Why half a second shows that nothing more comes.
constexpr const char* kTogether =
    "rxe raises what one change causes together: a stray or a second event follows the first "
    "within milliseconds";

}  // namespace

BOOST_AUTO_TEST_SUITE(raised_by_the_kernel)

BOOST_AUTO_TEST_CASE(cq_err_reaches_only_the_overflowing_cq) {
  World w;
  for (int i = 0; i < 4; ++i) post_srq_recv(*w.srq1, *w.mr, w.slot(10 + i), 100 + i);
  for (int i = 0; i < 4; ++i) post_send(*w.a1, *w.mr, w.slot(i), i);
  BOOST_REQUIRE(w.heard.wait_for("cq1", 1));
  // No stray event to anyone else.
  BOOST_TEST(stays_false_for([&] { return w.heard_beyond("cq1", IBV_EVENT_CQ_ERR, 0); }, 500ms,
                             kTogether));
  w.expect_only("cq1", IBV_EVENT_CQ_ERR, 0);
  BOOST_TEST(w.heard.from("cq1")[0].event.cq() == w.cq1->get());
  BOOST_TEST(w.env.errors().empty());
}

BOOST_AUTO_TEST_CASE(srq_limit_reaches_only_that_srq) {
  World w;
  for (int i = 0; i < 8; ++i) post_srq_recv(*w.srq1, *w.mr, w.slot(10 + i), 100 + i);
  w.srq1->arm_limit(4);
  // One send at a time, each completed on a1's one-entry CQ by polling, so
  // that the CQ never overflows: only the SRQ limit is at stake here.
  for (int i = 0; i < 5; ++i) {
    post_send(*w.a1, *w.mr, w.slot(i), i);
    const auto done = poll_completions(w.cq1->get(), 1, 10s);
    BOOST_REQUIRE_EQUAL(done.size(), 1u);
  }
  BOOST_REQUIRE(w.heard.wait_for("srq1", 1));
  // No second limit event, no stray one.
  BOOST_TEST(stays_false_for(
      [&] { return w.heard_beyond("srq1", IBV_EVENT_SRQ_LIMIT_REACHED); }, 500ms, kTogether));
  w.expect_only("srq1", IBV_EVENT_SRQ_LIMIT_REACHED);  // one-shot
  BOOST_TEST(w.heard.from("srq1")[0].event.srq() == w.srq1->get());
}

BOOST_AUTO_TEST_CASE(sq_drained_reaches_only_that_qp) {
  World w;
  w.a1->drain_send_queue();
  BOOST_REQUIRE(w.heard.wait_for("a1", 1));
  // No second SQ_DRAINED, no stray event.
  BOOST_TEST(stays_false_for([&] { return w.heard_beyond("a1", IBV_EVENT_SQ_DRAINED); }, 500ms,
                             kTogether));
  w.expect_only("a1", IBV_EVENT_SQ_DRAINED);
  BOOST_TEST(w.heard.from("a1")[0].event.qp() == w.a1->get());
}

BOOST_AUTO_TEST_CASE(gid_change_reaches_the_device_listeners_only) {
  World w;
  run_command("ip -6 addr add fd00::99/64 dev " + test_netdev() + " nodad");
  BOOST_REQUIRE(w.heard.wait_for("rxe0 listener", 1));
  // No object handler hears the change.
  BOOST_TEST(stays_false_for(
      [&] { return w.heard_beyond("rxe0 listener", IBV_EVENT_GID_CHANGE); }, 500ms, kTogether));
  w.expect_only("rxe0 listener", IBV_EVENT_GID_CHANGE);
  BOOST_TEST(w.heard.from("rxe0 listener")[0].event.port().value() == 1);
  run_command("ip -6 addr del fd00::99/64 dev " + test_netdev());
  BOOST_REQUIRE(w.heard.wait_for("rxe0 listener", 2));
}

// Two devices on one dispatcher. Taking the far end (v1) down drops rxe0's
// carrier once (PORT_ERR, then PORT_ACTIVE on up); rxe1, whose own netdev
// went down, also sees its GID table change. Each device's events reach its
// own listeners only, and no object handler.
BOOST_AUTO_TEST_CASE(port_events_of_two_devices_reach_their_own_listeners) {
  World w;
  auto second = Device::open(w.env.dispatcher, test_device2());
  Handle port_only = w.env.device->on_event(
      EventFilter{IBV_EVENT_PORT_ERR, IBV_EVENT_PORT_ACTIVE}.on_port(1),
      w.heard.as("rxe0 port listener"));
  Handle on_second = second->on_event({}, w.heard.as("rxe1 listener"));

  run_command("ip link set " + test_netdev2() + " down");
  BOOST_REQUIRE(w.heard.wait_for("rxe0 port listener", 1));
  BOOST_REQUIRE(w.heard.wait_for("rxe1 listener", 1));
  run_command("ip link set " + test_netdev2() + " up");
  BOOST_REQUIRE(w.heard.wait_for("rxe0 port listener", 2));
  const auto rxe1_up_heard = [](const std::vector<Recorder::Entry>& entries) {
    for (const auto& e : entries) {
      if (e.who == "rxe1 listener" && e.event.code() == IBV_EVENT_PORT_ACTIVE) return true;
    }
    return false;
  };
  BOOST_REQUIRE_MESSAGE(w.heard.wait_until(rxe1_up_heard), "heard: " << w.heard.summary());
  // Nothing beyond the flap reaches rxe0's listeners, no object handler
  // hears anything.
  BOOST_TEST(stays_false_for(
      [&] {
        std::size_t rxe0 = 0, rxe0_port = 0;
        for (const auto& e : w.heard.entries()) {
          if (e.who == "rxe0 listener") {
            ++rxe0;
          } else if (e.who == "rxe0 port listener") {
            ++rxe0_port;
          } else if (e.who != "rxe1 listener") {
            return true;
          }
        }
        return rxe0 > 2u || rxe0_port > 2u;
      },
      1s,
      "the flap's events came with the link's down and up, already heard: more from it "
      "would follow within milliseconds"));
  BOOST_TEST_MESSAGE("heard: " << w.heard.summary());

  std::vector<int> rxe0_codes, rxe0_port_codes;
  bool rxe1_down = false, rxe1_up = false;
  for (const auto& e : w.heard.entries()) {
    BOOST_TEST((e.who == "rxe0 listener" || e.who == "rxe0 port listener" ||
                e.who == "rxe1 listener"),
               e.who << " heard " << e.event.name());
    BOOST_TEST(e.event.port().value_or(-1) == 1);
    if (e.who == "rxe1 listener") {
      BOOST_TEST(e.event.device() == second->context());
      rxe1_down |= e.event.code() == IBV_EVENT_PORT_ERR;
      rxe1_up |= e.event.code() == IBV_EVENT_PORT_ACTIVE;
      BOOST_TEST((e.event.code() == IBV_EVENT_PORT_ERR ||
                  e.event.code() == IBV_EVENT_PORT_ACTIVE ||
                  e.event.code() == IBV_EVENT_GID_CHANGE));
    } else {
      BOOST_TEST(e.event.device() == w.env.device->context());
      (e.who == "rxe0 listener" ? rxe0_codes : rxe0_port_codes)
          .push_back(e.event.code());
    }
  }
  const std::vector<int> flap{IBV_EVENT_PORT_ERR, IBV_EVENT_PORT_ACTIVE};
  BOOST_TEST(rxe0_codes == flap, boost::test_tools::per_element());
  BOOST_TEST(rxe0_port_codes == flap, boost::test_tools::per_element());
  BOOST_TEST(rxe1_down);
  BOOST_TEST(rxe1_up);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(injected)

// The fourteen types rxe never raises.
const std::vector<int> kNeverRaised{
    IBV_EVENT_QP_FATAL,   IBV_EVENT_QP_REQ_ERR,   IBV_EVENT_QP_ACCESS_ERR,
    IBV_EVENT_COMM_EST,   IBV_EVENT_PATH_MIG,     IBV_EVENT_PATH_MIG_ERR,
    IBV_EVENT_DEVICE_FATAL, IBV_EVENT_LID_CHANGE, IBV_EVENT_PKEY_CHANGE,
    IBV_EVENT_SM_CHANGE,  IBV_EVENT_SRQ_ERR,      IBV_EVENT_QP_LAST_WQE_REACHED,
    IBV_EVENT_CLIENT_REREGISTER, IBV_EVENT_WQ_FATAL};

// The six types rxe raises, each with its case in suite raised_by_the_kernel above.
const std::vector<int> kRaised{IBV_EVENT_CQ_ERR,     IBV_EVENT_SRQ_LIMIT_REACHED,
                               IBV_EVENT_SQ_DRAINED, IBV_EVENT_GID_CHANGE,
                               IBV_EVENT_PORT_ERR,   IBV_EVENT_PORT_ACTIVE};

// This file's coverage: raised and injected together are every type ibev
// classifies, each once.
BOOST_AUTO_TEST_CASE(raised_and_injected_types_are_every_type_each_once) {
  std::vector<int> covered = kRaised;
  covered.insert(covered.end(), kNeverRaised.begin(), kNeverRaised.end());
  std::sort(covered.begin(), covered.end());
  std::vector<int> every;
  for (const auto& type : ibev::kEventTypes) every.push_back(type.type);
  BOOST_TEST(covered == every, boost::test_tools::per_element());
}

BOOST_DATA_TEST_CASE(reach_exactly_their_handlers, bdata::make(kNeverRaised), code) {
  World w;
  // rxe has no WQs (see below): WQ_FATAL names a stand-in with a handler.
  ibv_wq stand_in_wq{};
  Handle wq_handler = w.env.registry.attach(&stand_in_wq, w.heard.as("wq"));

  std::string expected;
  switch (find_event_type(code)->element) {
    case ElementKind::kQp:
      w.env.dispatcher.inject(w.env.device->context(), code, w.b1->get());
      expected = "b1";
      break;
    case ElementKind::kSrq:
      w.env.dispatcher.inject(w.env.device->context(), code, w.srq1->get());
      expected = "srq1";
      break;
    case ElementKind::kWq:
      w.env.dispatcher.inject(w.env.device->context(), code, &stand_in_wq);
      expected = "wq";
      break;
    case ElementKind::kPort:
      w.env.dispatcher.inject(w.env.device->context(), code, Port{1});
      expected = "rxe0 listener";
      break;
    case ElementKind::kDevice:
      w.env.dispatcher.inject(w.env.device->context(), code, WholeDevice{});
      expected = "rxe0 listener";
      break;
    case ElementKind::kCq:
      BOOST_FAIL("CQ_ERR is raised by rxe, not injected here");
  }
  BOOST_REQUIRE(w.heard.wait_for(expected, 1));
  // A sentinel through the same queue: everything injected before it is done.
  w.env.dispatcher.inject(w.env.device->context(), IBV_EVENT_COMM_EST, w.qp2->get());
  BOOST_REQUIRE(w.heard.wait_for("qp2", 1));
  const auto all = w.heard.entries();
  BOOST_REQUIRE_EQUAL(all.size(), 2u);
  BOOST_TEST(all[0].who == expected);
  BOOST_TEST(all[0].event.code() == code);
  BOOST_TEST(all[0].event.synthesized());
}

// The open key end to end: an event naming a QP by its number, as a DevX
// source would (rxe has none: injected), reaches that QP's handler, with the
// number; the same number on the other device reaches nobody of this one.
BOOST_AUTO_TEST_CASE(an_event_injected_by_qp_number_reaches_the_qps_handler) {
  World w;
  auto second = Device::open(w.env.dispatcher, test_device2());
  Handle on_second = second->on_event({}, w.heard.as("rxe1 listener"));
  std::atomic<int> unclaimed_on_second{0};
  Handle observer = w.env.dispatcher.registry().on_unclaimed([&](const Event& event) {
    if (event.device() == second->context()) ++unclaimed_on_second;
  });
  const ObjectNumber b1{ElementKind::kQp, w.b1->qp_num()};
  w.env.dispatcher.inject(second->context(), IBV_EVENT_QP_FATAL, b1);
  w.env.dispatcher.inject(w.env.device->context(), IBV_EVENT_QP_FATAL, b1);
  BOOST_REQUIRE(w.heard.wait_for("b1", 1));
  // A sentinel through the same queue: everything injected before it is done.
  w.env.dispatcher.inject(w.env.device->context(), IBV_EVENT_COMM_EST, w.qp2->get());
  BOOST_REQUIRE(w.heard.wait_for("qp2", 1));
  const auto all = w.heard.entries();
  BOOST_REQUIRE_EQUAL(all.size(), 2u);
  BOOST_TEST(all[0].who == "b1");
  BOOST_TEST(all[0].event.code() == IBV_EVENT_QP_FATAL);
  BOOST_REQUIRE(all[0].event.object_number().has_value());
  BOOST_TEST(all[0].event.object_number()->number == w.b1->qp_num());
  BOOST_TEST(unclaimed_on_second.load() == 1);

  // Closed, the QP's number is nobody's.
  const std::uint32_t number = w.b1->qp_num();
  w.b1->close();
  w.env.dispatcher.inject(w.env.device->context(), IBV_EVENT_QP_FATAL,
                          ObjectNumber{ElementKind::kQp, number});
  w.env.dispatcher.inject(w.env.device->context(), IBV_EVENT_COMM_EST, w.qp2->get());
  BOOST_REQUIRE(w.heard.wait_for("qp2", 2));
  BOOST_TEST(w.heard.from("b1").size() == 1u);
}

BOOST_AUTO_TEST_CASE(work_queues_are_refused_clearly_on_rxe) {
  Env env{test_device()};
  auto cq = plain_cq(env.device);
  try {
    (void)WorkQueue::create(env.pd, cq, [](const Event&) {});
    BOOST_ERROR("rxe created a WQ; this test's premise changed");
  } catch (const std::system_error& e) {
    BOOST_TEST(e.code().value() == EOPNOTSUPP);
    BOOST_TEST(std::string(e.what()).find("ibv_create_wq") != std::string::npos);
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(lifetimes)

// An event injected for a QP that is then destroyed, with a new object
// registered at the same address before delivery: the newcomer must not hear
// it. The newcomer is attached at the old address directly, as
// QueuePair::create attaches a QP the allocator happens to put there; waiting
// for the allocator to reuse the address made the test depend on malloc (and
// ASan's quarantine never reuses it).
BOOST_AUTO_TEST_CASE(a_reused_address_never_hears_the_old_objects_event) {
  Env env{test_device()};
  env.dispatcher.stop();  // deliver by hand, after the swap
  Recorder heard;
  Handle unclaimed = env.registry.on_unclaimed(heard.as("unclaimed"));
  auto cq = plain_cq(env.device);
  QueuePair::Options options{cq, cq, nullptr, IBV_QPT_RC, {4, 4, 1, 1, 0}, false, std::nullopt};

  auto old_qp = QueuePair::create(env.pd, heard.as("old"), options);
  ibv_qp* const address = old_qp->get();
  env.dispatcher.inject(env.device->context(), IBV_EVENT_QP_FATAL, address);
  old_qp.reset();
  Handle newcomer = env.registry.attach(address, heard.as("new"));
  while (env.dispatcher.run_once(200ms) > 0) {
  }
  BOOST_TEST(heard.from("new").empty());
  BOOST_TEST(heard.from("old").empty());
  BOOST_TEST(heard.from("unclaimed").size() == 1u);

  // And the newcomer does hear what is raised for it from now on.
  env.dispatcher.inject(env.device->context(), IBV_EVENT_QP_FATAL, address);
  while (env.dispatcher.run_once(200ms) > 0) {
  }
  BOOST_TEST(heard.from("new").size() == 1u);
}

BOOST_AUTO_TEST_CASE(events_raised_while_stopped_arrive_after_restart) {
  World w;
  w.env.dispatcher.stop();
  w.a1->drain_send_queue();
  // rxe raises SQ_DRAINED meanwhile, and the stopped dispatcher delivers it
  // to nobody (it stays queued in the kernel).
  BOOST_TEST(stays_false_for([&] { return !w.heard.entries().empty(); }, 300ms,
                             "rxe raises SQ_DRAINED within milliseconds of the drain, and a "
                             "running dispatcher hands it over as soon"));
  BOOST_TEST(w.heard.entries().empty());
  w.env.dispatcher.start();
  BOOST_REQUIRE(w.heard.wait_for("a1", 1));
  w.expect_only("a1", IBV_EVENT_SQ_DRAINED);
  // It was acked before delivery: destroying the QP does not wait.
  BOOST_TEST(finishes_within([&] { w.a1.reset(); }, 10s));
}

BOOST_AUTO_TEST_CASE(a_throwing_handler_does_not_stop_later_events) {
  Env env{test_device()};
  Recorder heard;
  auto cq = plain_cq(env.device);
  QueuePair::Options options{cq, cq, nullptr, IBV_QPT_RC, {4, 4, 1, 1, 0}, false, std::nullopt};
  auto thrower = QueuePair::create(
      env.pd, [](const Event&) { throw std::runtime_error("handler broke"); },
      options);
  auto a = QueuePair::create(env.pd, heard.as("a"), options);
  auto b = QueuePair::create(env.pd, heard.as("b"), options);
  connect_rc_pair(*a, *b);
  env.dispatcher.inject(env.device->context(), IBV_EVENT_QP_FATAL, thrower->get());
  a->drain_send_queue();  // a real event after the failure
  BOOST_REQUIRE(heard.wait_for("a", 1));
  BOOST_TEST(heard.from("a")[0].event.code() == IBV_EVENT_SQ_DRAINED);
  const auto failures = env.errors();
  BOOST_REQUIRE(failures.size() == 1u);
  BOOST_TEST(failures[0].find("handler broke") != std::string::npos, failures[0]);
  BOOST_TEST(env.registry.counters(env.device->context())
                 .for_code(IBV_EVENT_QP_FATAL)
                 .handler_failures == 1u);
}

// Each child keeps its parents alive: dropping the device's, domain's and
// CQ's handles first leaves them working for the QP, and all of them go with
// the QP's last handle.
BOOST_AUTO_TEST_CASE(parents_dropped_first_stay_alive_for_their_children) {
  Dispatcher dispatcher;
  dispatcher.start();
  Recorder heard;
  auto device = Device::open(dispatcher, test_device());
  auto pd = ProtectionDomain::create(device);
  auto cq = plain_cq(device);
  QueuePair::Options options{cq, cq, nullptr, IBV_QPT_RC, {4, 4, 1, 1, 0}, false, std::nullopt};
  auto qp = QueuePair::create(pd, heard.as("qp"), std::move(options));
  const std::weak_ptr<Device> weak_device = device;
  const std::weak_ptr<CompletionQueue> weak_cq = cq;
  ibv_context* const context = device->context();

  device.reset();
  pd.reset();
  cq.reset();
  BOOST_TEST(!weak_device.expired());
  BOOST_TEST(!weak_cq.expired());
  dispatcher.inject(context, IBV_EVENT_COMM_EST, qp->get());
  BOOST_TEST(heard.wait_for("qp", 1));

  qp.reset();
  BOOST_TEST(weak_cq.expired());
  BOOST_TEST(weak_device.expired());
}

BOOST_AUTO_TEST_CASE(opening_a_missing_device_says_so) {
  Dispatcher dispatcher;
  try {
    (void)Device::open(dispatcher, "no-such-device");
    BOOST_ERROR("opened a device that does not exist");
  } catch (const std::system_error& e) {
    BOOST_TEST(e.code().value() == ENODEV);
    BOOST_TEST(std::string(e.what()).find("ibv_open_device") != std::string::npos);
  }
}

BOOST_AUTO_TEST_SUITE_END()
