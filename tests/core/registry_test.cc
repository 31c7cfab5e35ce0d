// The registry: per-type routing, resolve-then-deliver, the release rule,
// failures, counters and bad input.
#define BOOST_TEST_MODULE ibev_core_registry
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <new>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <ibev/core/registry.h>
#include "tests/support/testing.h"

namespace bdata = boost::unit_test::data;
using ibev::Handle;
using ibev::ElementKind;
using ibev::Event;
using ibev::EventFilter;
using ibev::Registry;

namespace {

std::vector<int> all_codes() {
  std::vector<int> codes;
  for (const auto& type : ibev::kEventTypes) codes.push_back(type.type);
  codes.insert(codes.end(), {ibev::kEventTypes.back().type + 1, 42});
  return codes;
}

// Fake rdma-core objects: only their addresses are used.
struct Fixture {
  ibv_context device_a{}, device_b{};
  ibv_cq cq1{}, cq2{};
  ibv_qp qp1{}, qp2{};
  ibv_srq srq1{}, srq2{};
  ibv_wq wq1{}, wq2{};
  Registry registry;
  std::map<std::string, int> calls;
  std::vector<Handle> attachments;

  ibev::Handler count(const std::string& who) {
    return [this, who](const Event&) { ++calls[who]; };
  }

  Fixture() {
    attachments.push_back(registry.attach(&cq1, count("cq1")));
    attachments.push_back(registry.attach(&cq2, count("cq2")));
    attachments.push_back(registry.attach(&qp1, count("qp1")));
    attachments.push_back(registry.attach(&qp2, count("qp2")));
    attachments.push_back(registry.attach(&srq1, count("srq1")));
    attachments.push_back(registry.attach(&srq2, count("srq2")));
    attachments.push_back(registry.attach(&wq1, count("wq1")));
    attachments.push_back(registry.attach(&wq2, count("wq2")));
    attachments.push_back(registry.listen(&device_a, count("a-all")));
    attachments.push_back(
        registry.listen(&device_a, EventFilter().on_port(1), count("a-port1")));
    attachments.push_back(
        registry.listen(&device_a, EventFilter().on_port(2), count("a-port2")));
    attachments.push_back(registry.listen(&device_b, count("b-all")));
    attachments.push_back(registry.on_unclaimed(count("unclaimed")));
  }

  // An event of `code` on device A naming the "1" object or port 1.
  Event event_on_a(int code) {
    const auto* info = ibev::find_event_type(code);
    const ElementKind kind = info ? info->element : ElementKind::kDevice;
    switch (kind) {
      case ElementKind::kCq:
        return Event::synthesize(&device_a, code, &cq1);
      case ElementKind::kQp:
        return Event::synthesize(&device_a, code, &qp1);
      case ElementKind::kSrq:
        return Event::synthesize(&device_a, code, &srq1);
      case ElementKind::kWq:
        return Event::synthesize(&device_a, code, &wq1);
      case ElementKind::kPort:
        return Event::synthesize(&device_a, code, ibev::Port{1});
      case ElementKind::kDevice:
        break;
    }
    return Event::synthesize(&device_a, code, ibev::WholeDevice{});
  }
};

// The exception every bad input of these calls throws.
const auto& expect_invalid = ibev::testing::expect_throw<std::invalid_argument>;

}  // namespace

BOOST_AUTO_TEST_SUITE(routing)

BOOST_DATA_TEST_CASE(each_event_reaches_exactly_its_handlers,
                     bdata::make(all_codes()), code) {
  Fixture f;
  const Event event = f.event_on_a(code);
  std::map<std::string, int> expected;
  switch (event.element_kind()) {
    case ElementKind::kCq:
      expected = {{"cq1", 1}};
      break;
    case ElementKind::kQp:
      expected = {{"qp1", 1}};
      break;
    case ElementKind::kSrq:
      expected = {{"srq1", 1}};
      break;
    case ElementKind::kWq:
      expected = {{"wq1", 1}};
      break;
    case ElementKind::kPort:
      expected = {{"a-all", 1}, {"a-port1", 1}};
      break;
    case ElementKind::kDevice:  // every port's listener hears a device event
      expected = {{"a-all", 1}, {"a-port1", 1}, {"a-port2", 1}};
      break;
  }
  const std::size_t ran = f.registry.route(event);
  BOOST_TEST(ran == expected.size());
  BOOST_TEST(f.calls == expected);

  const auto counts = f.registry.counters(&f.device_a).for_code(code);
  BOOST_TEST(counts.delivered == 1u);
  BOOST_TEST(counts.unclaimed == 0u);
  BOOST_TEST(f.registry.counters(&f.device_b).total().delivered == 0u);
}

BOOST_DATA_TEST_CASE(event_nobody_takes_is_unclaimed_and_counted,
                     bdata::make(all_codes()), code) {
  Fixture f;
  f.attachments.clear();  // every handler and listener released
  int unclaimed = 0;
  Handle observer =
      f.registry.on_unclaimed([&](const Event& e) {
        BOOST_TEST(e.code() == code);
        ++unclaimed;
      });
  BOOST_TEST(f.registry.route(f.event_on_a(code)) == 0u);
  BOOST_TEST(unclaimed == 1);
  BOOST_TEST(f.calls.empty());
  BOOST_TEST(f.registry.counters(&f.device_a).for_code(code).unclaimed == 1u);
}

// The open key: an object attached by its number on a device hears events
// that name it by that number, and only those: not the same number on
// another device, not another kind with the same number, not its address.
BOOST_AUTO_TEST_CASE(an_object_attached_by_number_hears_events_naming_that_number) {
  Fixture f;
  const ibev::ObjectNumber qp17{ElementKind::kQp, 17};
  std::vector<Handle> by_number;
  by_number.push_back(f.registry.attach(&f.device_a, qp17, EventFilter{}, f.count("a-qp17")));
  by_number.push_back(f.registry.attach(&f.device_a, qp17, EventFilter{IBV_EVENT_COMM_EST},
                                        f.count("a-qp17-comm-est")));
  by_number.push_back(f.registry.attach(&f.device_b, qp17, EventFilter{}, f.count("b-qp17")));
  by_number.push_back(f.registry.attach(&f.device_a, ibev::ObjectNumber{ElementKind::kSrq, 17},
                                        EventFilter{}, f.count("a-srq17")));

  BOOST_TEST(f.registry.route(Event::synthesize(&f.device_a, IBV_EVENT_QP_FATAL, qp17)) == 1u);
  BOOST_TEST(f.registry.route(Event::synthesize(&f.device_a, IBV_EVENT_COMM_EST, qp17)) == 2u);
  BOOST_TEST(f.registry.route(Event::synthesize(&f.device_b, IBV_EVENT_QP_FATAL, qp17)) == 1u);
  const std::map<std::string, int> expected{
      {"a-qp17", 2}, {"a-qp17-comm-est", 1}, {"b-qp17", 1}};
  BOOST_TEST(f.calls == expected);

  // An event naming the QP by address reaches those attached by address only.
  BOOST_TEST(f.registry.route(Event::synthesize(&f.device_a, IBV_EVENT_QP_FATAL, &f.qp1)) == 1u);
  BOOST_TEST(f.calls["qp1"] == 1);
  BOOST_TEST(f.calls["a-qp17"] == 2);

  // Released: the number is unclaimed again, and counted so.
  by_number.clear();
  BOOST_TEST(f.registry.route(Event::synthesize(&f.device_a, IBV_EVENT_QP_FATAL, qp17)) == 0u);
  BOOST_TEST(f.calls["unclaimed"] == 1);
  BOOST_TEST(f.registry.counters(&f.device_a).for_code(IBV_EVENT_QP_FATAL).unclaimed == 1u);
}

// Attached both ways at once (what a QueuePair made with a handler is): one
// handler, so one state, hears the events that name the QP by its address
// and those that name it by its number, each once; one release takes it out
// of both, and a second handler on either key is untouched by it.
BOOST_AUTO_TEST_CASE(an_object_attached_both_ways_hears_either_name_through_one_handle) {
  Fixture f;
  const ibev::ObjectNumber qp17{ElementKind::kQp, 17};
  int heard = 0;
  Handle both =
      f.registry.attach(&f.device_a, qp17, &f.qp2, EventFilter{}, [&](const Event&) { ++heard; });
  Handle other = f.registry.attach(&f.device_a, qp17, EventFilter{}, f.count("by-number"));
  BOOST_TEST(f.registry.route(Event::synthesize(&f.device_a, IBV_EVENT_QP_FATAL, &f.qp2)) == 2u);
  BOOST_TEST(f.registry.route(Event::synthesize(&f.device_a, IBV_EVENT_COMM_EST, qp17)) == 2u);
  BOOST_TEST(heard == 2);
  BOOST_TEST(f.calls["qp2"] == 1);       // the Fixture's own, by address
  BOOST_TEST(f.calls["by-number"] == 1);

  both.release();
  BOOST_TEST(f.registry.route(Event::synthesize(&f.device_a, IBV_EVENT_QP_FATAL, &f.qp2)) == 1u);
  BOOST_TEST(f.registry.route(Event::synthesize(&f.device_a, IBV_EVENT_COMM_EST, qp17)) == 1u);
  BOOST_TEST(heard == 2);
  BOOST_TEST(f.calls["qp2"] == 2);
  BOOST_TEST(f.calls["by-number"] == 2);
}

// A device forgotten (closed) and one opened later at its address (a re-added
// device, whose QP numbers start over): the old device's number handlers
// never hear the new one's events, though their handles are still held.
BOOST_AUTO_TEST_CASE(a_forgotten_device_s_number_handlers_never_hear_its_successor) {
  Fixture f;
  const ibev::ObjectNumber qp17{ElementKind::kQp, 17};
  Handle old_device_s = f.registry.attach(&f.device_a, qp17, EventFilter{}, f.count("old"));
  f.registry.forget(&f.device_a);
  BOOST_TEST(f.registry.route(Event::synthesize(&f.device_a, IBV_EVENT_QP_FATAL, qp17)) == 0u);
  Handle new_device_s = f.registry.attach(&f.device_a, qp17, EventFilter{}, f.count("new"));
  BOOST_TEST(f.registry.route(Event::synthesize(&f.device_a, IBV_EVENT_QP_FATAL, qp17)) == 1u);
  BOOST_TEST(f.calls.count("old") == 0u);
  BOOST_TEST(f.calls["new"] == 1);
}

BOOST_AUTO_TEST_CASE(listeners_run_in_registration_order) {
  Registry registry;
  ibv_context device{};
  std::vector<int> order;
  std::vector<Handle> held;
  for (int i = 0; i < 5; ++i) {
    held.push_back(
        registry.listen(&device, [&order, i](const Event&) { order.push_back(i); }));
  }
  registry.route(Event::synthesize(&device, IBV_EVENT_PORT_ACTIVE, ibev::Port{1}));
  BOOST_TEST(order == (std::vector<int>{0, 1, 2, 3, 4}));
}

// ibev's own last listener (DeviceClients hears a device's loss there) runs
// after every listener, even one registered later, and neither claims the
// event nor counts it: with no other listener the event is unclaimed, its
// observers hear it first, and route() says nobody took it.
BOOST_AUTO_TEST_CASE(a_last_listener_runs_after_the_rest_and_claims_nothing) {
  Registry registry;
  ibv_context device{};
  std::vector<std::string> order;
  Handle last = registry.listen_last(&device, EventFilter{IBV_EVENT_DEVICE_FATAL},
                                     [&](const Event&) { order.push_back("last"); });
  Handle observer = registry.on_unclaimed([&](const Event&) { order.push_back("unclaimed"); });
  const auto fatal = [&] {
    return Event::synthesize(&device, IBV_EVENT_DEVICE_FATAL, ibev::WholeDevice{});
  };
  BOOST_TEST(registry.route(fatal()) == 0u);
  BOOST_TEST(order == (std::vector<std::string>{"unclaimed", "last"}));
  BOOST_TEST(registry.counters(&device).for_code(IBV_EVENT_DEVICE_FATAL).unclaimed == 1u);

  order.clear();
  Handle listener = registry.listen(&device, [&](const Event&) { order.push_back("listener"); });
  BOOST_TEST(registry.route(fatal()) == 1u);
  BOOST_TEST(order == (std::vector<std::string>{"listener", "last"}));
  BOOST_TEST(registry.counters(&device).for_code(IBV_EVENT_DEVICE_FATAL).delivered == 1u);

  // Not for object events, and its filter is checked as a listener's.
  expect_invalid([&] {
    (void)registry.listen_last(&device, EventFilter{IBV_EVENT_QP_FATAL}, [](const Event&) {});
  }, "Registry::listen_last");
}

// A closed device's address may be a re-added device's next: its old
// listeners must not hear the newcomer.
BOOST_AUTO_TEST_CASE(a_forgotten_device_s_listeners_hear_nothing_more) {
  Registry registry;
  ibv_context device{};
  int old_heard = 0;
  int new_heard = 0;
  Handle old_listener = registry.listen(&device, [&](const Event&) { ++old_heard; });
  const Event port_active = Event::synthesize(&device, IBV_EVENT_PORT_ACTIVE, ibev::Port{1});
  const ibev::Delivery resolved_before = registry.resolve(port_active);
  registry.route(port_active);
  registry.forget(&device);
  BOOST_TEST(registry.counters(&device).total().delivered == 0u);
  Handle new_listener = registry.listen(&device, [&](const Event&) { ++new_heard; });
  registry.route(port_active);
  BOOST_TEST(old_heard == 1);
  BOOST_TEST(new_heard == 1);
  registry.deliver(resolved_before);  // resolved before: still its listeners'
  BOOST_TEST(old_heard == 2);
  old_listener.release();  // inert, harmless
  registry.forget(&device);
  registry.forget(&device);  // twice, or never seen: nothing happens
}

BOOST_AUTO_TEST_CASE(type_filters_select) {
  Registry registry;
  ibv_context device{};
  ibv_srq srq{};
  int port_changes = 0, limits = 0, srq_all = 0;
  Handle a = registry.listen(&device, EventFilter{IBV_EVENT_PORT_ERR, IBV_EVENT_PORT_ACTIVE},
                             [&](const Event&) { ++port_changes; });
  Handle b = registry.attach(&srq, EventFilter{IBV_EVENT_SRQ_LIMIT_REACHED},
                             [&](const Event&) { ++limits; });
  Handle c = registry.attach(&srq, [&](const Event&) { ++srq_all; });
  registry.route(Event::synthesize(&device, IBV_EVENT_PORT_ERR, ibev::Port{1}));
  registry.route(Event::synthesize(&device, IBV_EVENT_GID_CHANGE, ibev::Port{1}));
  registry.route(Event::synthesize(&device, IBV_EVENT_SRQ_ERR, &srq));
  registry.route(Event::synthesize(&device, IBV_EVENT_SRQ_LIMIT_REACHED, &srq));
  BOOST_TEST(port_changes == 1);
  BOOST_TEST(limits == 1);
  BOOST_TEST(srq_all == 2);
}

// Codes after IBV_EVENT_WQ_FATAL come from newer kernels and rdma-core
// (IBV_EVENT_DEVICE_SPEED_CHANGE is 20 from rdma-core 62 on); a listener can
// ask for exactly them, by code, and hears nothing else.
BOOST_DATA_TEST_CASE(a_listener_can_subscribe_to_codes_newer_than_this_build,
                     bdata::make({20, 21, 63, 64, 100000}), code) {
  Registry registry;
  ibv_context device{};
  std::vector<int> heard;
  Handle newer = registry.listen(&device, EventFilter::of_codes({code}),
                                 [&](const Event& e) { heard.push_back(e.code()); });
  registry.route(Event::synthesize(&device, code, ibev::OpaqueElement{7}));
  registry.route(Event::synthesize(&device, code + 1, ibev::OpaqueElement{7}));
  registry.route(Event::synthesize(&device, IBV_EVENT_PORT_ERR, ibev::Port{1}));
  registry.route(Event::synthesize(&device, IBV_EVENT_DEVICE_FATAL, ibev::WholeDevice{}));
  BOOST_TEST(heard == std::vector<int>{code});
}

BOOST_AUTO_TEST_CASE(a_newer_code_by_its_enum_value_is_accepted_too) {
  // As code written against rdma-core >= 62 spells it.
  const EventFilter filter{IBV_EVENT_PORT_ERR, static_cast<ibv_event_type>(20)};
  BOOST_TEST(filter.has_type(20));
  BOOST_TEST(filter.has_type(IBV_EVENT_PORT_ERR));
  BOOST_TEST(!filter.has_type(19));
  BOOST_TEST(filter.types() == (std::vector<int>{IBV_EVENT_PORT_ERR, 20}));
  BOOST_TEST(EventFilter::of_codes({100000, 3, 64, 3}).types() ==
             (std::vector<int>{3, 64, 100000}));
}

BOOST_AUTO_TEST_CASE(an_object_hears_its_events_after_a_sibling_leaves) {
  Registry registry;
  ibv_context device{};
  ibv_qp qp{};
  int first = 0, second = 0;
  Handle a = registry.attach(&qp, [&](const Event&) { ++first; });
  Handle b = registry.attach(&qp, [&](const Event&) { ++second; });
  registry.route(Event::synthesize(&device, IBV_EVENT_COMM_EST, &qp));
  a.release();
  BOOST_TEST(!a.active());
  BOOST_TEST(b.active());
  registry.route(Event::synthesize(&device, IBV_EVENT_COMM_EST, &qp));
  BOOST_TEST(first == 1);
  BOOST_TEST(second == 2);
}

// One object, several handlers, released one by one from the first, the
// last or the middle: each event reaches exactly the handlers still held,
// through the one-handler and the several-handler forms of an object's set
// and back, and a handler attached after the last release is heard alone.
BOOST_DATA_TEST_CASE(handlers_of_one_object_leave_in_any_order,
                     bdata::make({1, 2, 3, 4}) * bdata::make({"first", "last", "middle"}), count,
                     order) {
  Registry registry;
  ibv_context device{};
  ibv_cq cq{};
  ibv_qp neighbour{};  // in the same tables: must hear nothing of the CQ's
  int neighbour_heard = 0;
  Handle other = registry.attach(&neighbour, [&](const Event&) { ++neighbour_heard; });
  std::vector<int> heard(static_cast<std::size_t>(count));
  std::vector<Handle> handles;
  for (int i = 0; i < count; ++i) {
    handles.push_back(registry.attach(&cq, [&heard, i](const Event&) { ++heard[i]; }));
  }
  std::vector<int> held(static_cast<std::size_t>(count), 1);
  for (int left = count; left > 0; --left) {
    registry.route(Event::synthesize(&device, IBV_EVENT_CQ_ERR, &cq));
    for (int i = 0; i < count; ++i) {
      BOOST_TEST(heard[i] == (held[i] ? 1 : 0), "handler " << i << " with " << left << " held");
      heard[i] = 0;
    }
    std::vector<int> live;
    for (int i = 0; i < count; ++i) {
      if (held[i]) live.push_back(i);
    }
    const std::string which = order;
    const int leaving = which == "first"  ? live.front()
                        : which == "last" ? live.back()
                                          : live[live.size() / 2];
    handles[leaving].release();
    held[leaving] = 0;
  }
  BOOST_TEST(registry.route(Event::synthesize(&device, IBV_EVENT_CQ_ERR, &cq)) == 0u);
  int late = 0;
  Handle again = registry.attach(&cq, [&](const Event&) { ++late; });
  registry.route(Event::synthesize(&device, IBV_EVENT_CQ_ERR, &cq));
  BOOST_TEST(late == 1);
  for (int h : heard) BOOST_TEST(h == 0);
  BOOST_TEST(neighbour_heard == 0);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(resolve_then_deliver)

BOOST_AUTO_TEST_CASE(handler_attached_after_resolve_does_not_hear_it) {
  Registry registry;
  ibv_context device{};
  ibv_qp qp{};
  int calls = 0, listener_calls = 0, unclaimed = 0;
  Handle observer = registry.on_unclaimed([&](const Event&) { ++unclaimed; });
  const auto qp_delivery =
      registry.resolve(Event::synthesize(&device, IBV_EVENT_QP_FATAL, &qp));
  const auto port_delivery = registry.resolve(
      Event::synthesize(&device, IBV_EVENT_PORT_ERR, ibev::Port{1}));
  Handle late = registry.attach(&qp, [&](const Event&) { ++calls; });
  Handle late_listener =
      registry.listen(&device, [&](const Event&) { ++listener_calls; });
  BOOST_TEST(registry.deliver(qp_delivery) == 0u);
  BOOST_TEST(registry.deliver(port_delivery) == 0u);
  BOOST_TEST(calls == 0);
  BOOST_TEST(listener_calls == 0);
  BOOST_TEST(unclaimed == 2);
}

BOOST_AUTO_TEST_CASE(handler_released_after_resolve_does_not_hear_it) {
  Registry registry;
  ibv_context device{};
  ibv_qp qp{};
  int calls = 0, unclaimed = 0;
  Handle observer = registry.on_unclaimed([&](const Event&) { ++unclaimed; });
  Handle handler = registry.attach(&qp, [&](const Event&) { ++calls; });
  const auto delivery =
      registry.resolve(Event::synthesize(&device, IBV_EVENT_QP_FATAL, &qp));
  handler.release();
  BOOST_TEST(registry.deliver(delivery) == 0u);
  BOOST_TEST(calls == 0);
  BOOST_TEST(unclaimed == 1);  // not lost
}

BOOST_AUTO_TEST_CASE(reused_address_never_hears_the_old_objects_event) {
  // The dispatcher's case: an event for QP A is resolved and acked, QP A is
  // destroyed, a new QP lands at the same address before delivery.
  Registry registry;
  ibv_context device{};
  ibv_qp slot{};  // one address, two objects' lifetimes
  int old_calls = 0, new_calls = 0;
  Handle old_handler =
      registry.attach(&slot, [&](const Event&) { ++old_calls; });
  const auto delivery =
      registry.resolve(Event::synthesize(&device, IBV_EVENT_QP_FATAL, &slot));
  old_handler.release();  // old QP destroyed
  Handle new_handler =
      registry.attach(&slot, [&](const Event&) { ++new_calls; });
  registry.deliver(delivery);
  BOOST_TEST(old_calls == 0);
  BOOST_TEST(new_calls == 0);
  registry.route(Event::synthesize(&device, IBV_EVENT_QP_FATAL, &slot));
  BOOST_TEST(new_calls == 1);
}

BOOST_AUTO_TEST_CASE(moved_from_delivery_is_rejected) {
  Registry registry;
  ibv_context device{};
  auto delivery = registry.resolve(
      Event::synthesize(&device, IBV_EVENT_PORT_ERR, ibev::Port{1}));
  auto taken = std::move(delivery);
  expect_invalid([&] { registry.deliver(delivery); }, "moved from");
  BOOST_TEST(registry.deliver(taken) == 0u);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(release_rule)

BOOST_AUTO_TEST_CASE(release_waits_for_a_running_handler) {
  Registry registry;
  ibv_context device{};
  ibv_qp qp{};
  std::mutex mutex;
  std::condition_variable cv;
  bool entered = false, may_leave = false;
  std::atomic<bool> handler_done{false}, release_returned{false};

  Handle handler = registry.attach(&qp, [&](const Event&) {
    std::unique_lock<std::mutex> lock(mutex);
    entered = true;
    cv.notify_all();
    cv.wait(lock, [&] { return may_leave; });
    handler_done = true;
  });
  std::thread deliverer([&] {
    registry.route(Event::synthesize(&device, IBV_EVENT_COMM_EST, &qp));
  });
  {
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [&] { return entered; });
  }
  std::thread releaser([&] {
    handler.release();
    // Must not be reached before the handler returned.
    BOOST_TEST(handler_done.load());
    release_returned = true;
  });
  // release() does not return while the handler is held.
  BOOST_TEST(ibev::testing::stays_false_for(
      [&] { return release_returned.load(); }, std::chrono::milliseconds(50),
      "a release() that did not wait for the held handler returns within microseconds"));
  {
    std::lock_guard<std::mutex> lock(mutex);
    may_leave = true;
  }
  cv.notify_all();
  releaser.join();
  deliverer.join();
  BOOST_TEST(release_returned.load());
}

BOOST_AUTO_TEST_CASE(release_from_inside_the_handler_does_not_deadlock) {
  Registry registry;
  ibv_context device{};
  ibv_cq cq{};
  int calls = 0;
  Handle self;
  self = registry.attach(&cq, [&](const Event&) {
    ++calls;
    self.release();
  });
  registry.route(Event::synthesize(&device, IBV_EVENT_CQ_ERR, &cq));
  registry.route(Event::synthesize(&device, IBV_EVENT_CQ_ERR, &cq));
  BOOST_TEST(calls == 1);
  BOOST_TEST(!self.active());
}

BOOST_AUTO_TEST_CASE(listener_released_by_a_sibling_during_delivery_is_skipped) {
  Registry registry;
  ibv_context device{};
  int second_calls = 0;
  Handle second;
  Handle first = registry.listen(&device, [&](const Event&) { second.release(); });
  second = registry.listen(&device, [&](const Event&) { ++second_calls; });
  BOOST_TEST(registry.route(Event::synthesize(&device, IBV_EVENT_PORT_ERR,
                                              ibev::Port{1})) == 1u);
  BOOST_TEST(second_calls == 0);
}

BOOST_AUTO_TEST_CASE(attachment_may_outlive_the_registry) {
  Handle survivor;
  ibv_qp qp{};
  {
    Registry registry;
    survivor = registry.attach(&qp, [](const Event&) {});
  }
  survivor.release();  // must not touch the destroyed registry
  BOOST_TEST(!survivor.active());
}

BOOST_AUTO_TEST_CASE(move_assignment_releases_the_old_handler) {
  Registry registry;
  ibv_context device{};
  ibv_qp qp{};
  int a = 0, b = 0;
  Handle handle = registry.attach(&qp, [&](const Event&) { ++a; });
  handle = registry.attach(&qp, [&](const Event&) { ++b; });
  registry.route(Event::synthesize(&device, IBV_EVENT_COMM_EST, &qp));
  BOOST_TEST(a == 0);
  BOOST_TEST(b == 1);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(failures)

BOOST_AUTO_TEST_CASE(throwing_handler_does_not_stop_delivery) {
  std::vector<std::string> reported;
  Registry registry([&](const ibev::Failure& f) {
    BOOST_TEST((f.kind == ibev::Failure::Kind::kHandlerThrew));
    BOOST_TEST(*f.event_code == IBV_EVENT_PORT_ERR);
    reported.push_back(f.what);
  });
  ibv_context device{};
  int before = 0, after = 0;
  Handle a = registry.listen(&device, [&](const Event&) { ++before; });
  Handle b = registry.listen(
      &device, [](const Event&) { throw std::runtime_error("handler broke"); });
  Handle c = registry.listen(&device, [&](const Event&) { ++after; });
  Handle d = registry.listen(&device, [](const Event&) { throw 7; });
  for (int i = 0; i < 3; ++i) {
    BOOST_TEST(registry.route(Event::synthesize(&device, IBV_EVENT_PORT_ERR,
                                                ibev::Port{1})) == 4u);
  }
  BOOST_TEST(before == 3);
  BOOST_TEST(after == 3);
  BOOST_REQUIRE(reported.size() == 6u);
  BOOST_TEST(reported[0] == "handler broke");
  BOOST_TEST(reported[1] == "an exception not derived from std::exception");
  const auto counts = registry.counters(&device).for_code(IBV_EVENT_PORT_ERR);
  BOOST_TEST(counts.handler_failures == 6u);
  BOOST_TEST(counts.delivered == 3u);
}

// A sink that throws loses nothing else: the failure is counted, the other
// handlers run, and what the sink could not take goes to stderr.
BOOST_AUTO_TEST_CASE(throwing_object_handler_is_counted_even_when_the_sink_throws) {
  Registry registry([](const ibev::Failure&) { throw std::runtime_error("sink broke"); });
  ibv_context device{};
  ibv_qp qp{};
  int second = 0;
  Handle a = registry.attach(
      &qp, [](const Event&) { throw std::runtime_error("qp handler broke"); });
  Handle b = registry.attach(&qp, [&](const Event&) { ++second; });
  registry.route(Event::synthesize(&device, IBV_EVENT_QP_FATAL, &qp));
  BOOST_TEST(second == 1);
  const auto counters = registry.counters(&device);
  BOOST_TEST(counters.for_code(IBV_EVENT_QP_FATAL).handler_failures == 1u);
  BOOST_TEST(counters.failures() == 1u);
}

// The errno a Failure carries for an exception caught where nobody can catch
// it (a resolve in the dispatching loop): not ENOMEM for everything.
BOOST_AUTO_TEST_CASE(an_exception_s_errno_says_what_it_was) {
  BOOST_TEST(ibev::errno_of(std::bad_alloc()) == ENOMEM);
  BOOST_TEST(ibev::errno_of(std::system_error(EBUSY, std::generic_category(), "x")) == EBUSY);
  BOOST_TEST(ibev::errno_of(std::system_error(0, std::generic_category(), "x")) == EIO);
  BOOST_TEST(ibev::errno_of(std::invalid_argument("x")) == EINVAL);
  BOOST_TEST(ibev::errno_of(std::out_of_range("x")) == EINVAL);
  BOOST_TEST(ibev::errno_of(std::runtime_error("x")) == EIO);
  BOOST_TEST(ibev::errno_of(std::system_error(std::make_error_code(std::future_errc::no_state))) ==
             EIO);
}

// One record for every kind of failure: what a verb's failure carries.

BOOST_AUTO_TEST_CASE(reported_failures_reach_the_sink_with_errno_and_are_counted) {
  std::vector<ibev::Failure> seen;
  Registry registry([&](const ibev::Failure& f) { seen.push_back(f); });
  ibv_context device{};
  ibv_cq cq{};
  ibev::Failure failure = ibev::Failure::verb_failed("ibv_poll_cq", -EIO);
  failure.device = &device;
  failure.object = &cq;
  registry.report(failure);
  ibev::Failure threw =
      ibev::Failure::handler_threw(std::string(ibev::kCompletionHandler), "boom");
  threw.device = &device;
  registry.report(threw);
  // Another handler with no event (a drain's done, a device client) is a
  // failure of the device, not a completion handler's.
  ibev::Failure other = ibev::Failure::handler_threw("drain's done", "boom");
  other.device = &device;
  registry.report(other);
  BOOST_REQUIRE(seen.size() == 3u);
  BOOST_TEST(seen[0].error == std::error_code(EIO, std::generic_category()));
  BOOST_TEST(ibev::describe(seen[0]).find("ibv_poll_cq") != std::string::npos);
  const auto counters = registry.counters(&device);
  BOOST_TEST(counters.failures() == 3u);
  BOOST_TEST(counters.completion_handler_failures() == 1u);
  BOOST_TEST(counters.total().handler_failures == 0u);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(counters)

BOOST_AUTO_TEST_CASE(unknown_codes_beyond_the_tracked_range_share_a_bucket) {
  Registry registry;
  ibv_context device{};
  registry.route(Event::synthesize(&device, 1000, ibev::WholeDevice{}));
  registry.route(Event::synthesize(&device, 2000, ibev::WholeDevice{}));
  registry.route(Event::synthesize(&device, 31, ibev::WholeDevice{}));
  const auto snapshot = registry.counters(&device);
  BOOST_TEST(snapshot.for_code(1000).unclaimed == 2u);
  BOOST_TEST(snapshot.for_code(31).unclaimed == 1u);
  BOOST_TEST(snapshot.total().unclaimed == 3u);
}

BOOST_AUTO_TEST_CASE(unseen_device_reads_zero) {
  Registry registry;
  ibv_context device{};
  BOOST_TEST(registry.counters(&device).total().delivered == 0u);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(bad_input)

BOOST_AUTO_TEST_CASE(null_objects_and_handlers) {
  Registry registry;
  ibv_context device{};
  ibv_qp qp{};
  auto noop = [](const Event&) {};
  expect_invalid([&] { (void)registry.attach(static_cast<ibv_qp*>(nullptr), noop); },
                 "Registry::attach(ibv_qp*): the object is null");
  expect_invalid([&] { (void)registry.attach(&qp, ibev::Handler{}); },
                 "the handler is empty");
  expect_invalid([&] { (void)registry.listen(nullptr, noop); },
                 "Registry::listen: the device is null");
  expect_invalid([&] { (void)registry.listen(&device, ibev::Handler{}); },
                 "the handler is empty");
  expect_invalid([&] { (void)registry.on_unclaimed(ibev::Handler{}); },
                 "the handler is empty");
  ibv_async_event raw{};
  raw.event_type = IBV_EVENT_PORT_ERR;
  raw.element.port_num = 1;
  expect_invalid([&] { (void)registry.resolve(Event::from_async(nullptr, raw)); },
                 "names no device");
  expect_invalid(
      [&] { (void)registry.attach(nullptr, ibev::ObjectNumber{ElementKind::kQp, 1}, {}, noop); },
      "the device is null");
  expect_invalid(
      [&] { (void)registry.attach(&device, ibev::ObjectNumber{ElementKind::kPort, 1}, {}, noop); },
      "is not an object with a number");
  expect_invalid(
      [&] { (void)registry.attach(&device, ibev::ObjectNumber{ElementKind::kQp, 1}, {}, {}); },
      "the handler is empty");
  expect_invalid(
      [&] {
        (void)registry.attach(&device, ibev::ObjectNumber{ElementKind::kQp, 1},
                              EventFilter{IBV_EVENT_SRQ_ERR}, noop);
      },
      "never reaches a qp handler");
  // Both ways at once: either key's faults.
  expect_invalid(
      [&] {
        (void)registry.attach(&device, ibev::ObjectNumber{ElementKind::kQp, 1}, nullptr, {}, noop);
      },
      "Registry::attach(ibv_context*, ObjectNumber, address): the object is null");
  expect_invalid(
      [&] {
        (void)registry.attach(&device, ibev::ObjectNumber{ElementKind::kQp, 1},
                              reinterpret_cast<char*>(&qp) + 1, {}, noop);
      },
      "the object's address is not 8-aligned");
  expect_invalid(
      [&] {
        (void)registry.attach(nullptr, ibev::ObjectNumber{ElementKind::kQp, 1}, &qp, {}, noop);
      },
      "the device is null");
  expect_invalid(
      [&] {
        (void)registry.attach(&device, ibev::ObjectNumber{ElementKind::kQp, 1}, &qp, {}, {});
      },
      "the handler is empty");
}

// Keys pack an object's kind into its address's low bits (rdma-core objects
// are 8-aligned): an unaligned address is refused at attach, and an event
// naming one is nobody's, even where address | kind would spell a neighbour's
// key (a CQ at qp1 + 1 would read as qp1, a QP).
BOOST_AUTO_TEST_CASE(unaligned_objects_are_refused_and_never_alias_a_neighbour) {
  Fixture f;
  auto* odd_qp = reinterpret_cast<ibv_qp*>(reinterpret_cast<char*>(&f.qp2) + 1);
  expect_invalid([&] { (void)f.registry.attach(odd_qp, [](const Event&) {}); },
                 "Registry::attach(ibv_qp*): the object's address is not 8-aligned");
  auto* alias = reinterpret_cast<ibv_cq*>(reinterpret_cast<char*>(&f.qp1) + 1);
  f.registry.deliver(f.registry.resolve(Event::synthesize(&f.device_a, IBV_EVENT_CQ_ERR, alias)));
  BOOST_TEST(f.calls["qp1"] == 0);
  BOOST_TEST(f.calls["unclaimed"] == 1);
}

BOOST_AUTO_TEST_CASE(filters_for_the_wrong_kind_of_object) {
  Registry registry;
  ibv_context device{};
  ibv_qp qp{};
  ibv_cq cq{};
  auto noop = [](const Event&) {};
  expect_invalid(
      [&] { (void)registry.attach(&qp, EventFilter{IBV_EVENT_CQ_ERR}, noop); },
      "IBV_EVENT_CQ_ERR is a cq event and never reaches a qp handler");
  expect_invalid(
      [&] { (void)registry.attach(&cq, EventFilter{IBV_EVENT_PORT_ERR}, noop); },
      "IBV_EVENT_PORT_ERR is a port event");
  expect_invalid(
      [&] { (void)registry.attach(&cq, EventFilter().on_port(1), noop); },
      "a port filter means nothing");
  expect_invalid(
      [&] {
        (void)registry.listen(&device, EventFilter{IBV_EVENT_QP_FATAL}, noop);
      },
      "IBV_EVENT_QP_FATAL is a qp event; it reaches only that object's handlers");
}

BOOST_AUTO_TEST_CASE(empty_and_invalid_filters) {
  expect_invalid([] { EventFilter empty{std::initializer_list<ibv_event_type>{}}; },
                 "empty set of event types");
  expect_invalid([] { EventFilter::of_codes({}); }, "empty set of event types");
  expect_invalid([] { EventFilter().on_port(0); }, "port numbers start at 1");
}

// No event has a negative code: a filter naming one would register a handler
// (or a wait) that can never fire, so it is refused however it is spelled.
BOOST_DATA_TEST_CASE(a_negative_event_code_is_refused,
                     boost::unit_test::data::make({-1, -2, std::numeric_limits<int>::min()}),
                     code) {
  const std::string says = "event code " + std::to_string(code) + " is negative";
  expect_invalid([code] { EventFilter::of_codes({code}); }, says);
  expect_invalid([code] { EventFilter::of_codes({IBV_EVENT_PORT_ERR, code}); }, says);
  // Not as an ibv_event_type: a negative value is outside that enum's range
  // (UBSan says so), so no defined program spells one.
}

BOOST_AUTO_TEST_CASE(newer_codes_are_device_events_not_object_events) {
  Registry registry;
  ibv_qp qp{};
  expect_invalid(
      [&] {
        (void)registry.attach(&qp, EventFilter::of_codes({20}), [](const Event&) {});
      },
      "event code 20 is a device event and never reaches a qp handler");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(executors)

// A queue standing in for an application's executor.
struct ManualExecutor {
  std::vector<ibev::Task> tasks;
  ibev::Executor executor() {
    return [this](ibev::Task task) { tasks.push_back(std::move(task)); };
  }
  void run_all() {
    auto ready = std::move(tasks);
    tasks.clear();
    for (auto& task : ready) task();
  }
};

// Resolve and delivery stay where deliver() is called; only the handler's
// call moves, and it sees the event as resolved, in order.
BOOST_AUTO_TEST_CASE(handlers_with_an_executor_run_there_in_order) {
  Registry registry;
  ManualExecutor executor;
  ibv_context device{};
  ibv_qp qp{};
  std::vector<int> heard;
  Handle listener = registry.listen(&device, EventFilter{},
                                    [&](const Event& e) { heard.push_back(e.code()); },
                                    executor.executor());
  Handle handler = registry.attach(&qp, EventFilter{},
                                   [&](const Event& e) { heard.push_back(e.code()); },
                                   executor.executor());
  BOOST_TEST(registry.route(Event::synthesize(&device, IBV_EVENT_PORT_ERR, ibev::Port{1})) == 1u);
  BOOST_TEST(registry.route(Event::synthesize(&device, IBV_EVENT_QP_FATAL, &qp)) == 1u);
  BOOST_TEST(heard.empty());
  BOOST_TEST(executor.tasks.size() == 2u);
  executor.run_all();
  BOOST_TEST(heard == (std::vector<int>{IBV_EVENT_PORT_ERR, IBV_EVENT_QP_FATAL}));
}

// The release rule holds on the executor: a handler released before its task
// runs is never called, so its captures may be gone by then.
BOOST_AUTO_TEST_CASE(a_handler_released_before_its_task_runs_is_not_called) {
  Registry registry;
  ManualExecutor executor;
  ibv_context device{};
  int calls = 0;
  Handle listener = registry.listen(&device, EventFilter{}, [&](const Event&) { ++calls; },
                                    executor.executor());
  registry.route(Event::synthesize(&device, IBV_EVENT_PORT_ERR, ibev::Port{1}));
  listener.release();
  executor.run_all();
  BOOST_TEST(calls == 0);
}

// A handler that throws on its executor is reported like any other.
BOOST_AUTO_TEST_CASE(a_throw_on_the_executor_reaches_the_sink) {
  std::vector<ibev::Failure> seen;
  Registry registry([&](const ibev::Failure& f) { seen.push_back(f); });
  ManualExecutor executor;
  ibv_context device{};
  Handle listener = registry.listen(
      &device, EventFilter{}, [](const Event&) { throw std::runtime_error("late"); },
      executor.executor());
  registry.route(Event::synthesize(&device, IBV_EVENT_PORT_ERR, ibev::Port{1}));
  executor.run_all();
  BOOST_REQUIRE(seen.size() == 1u);
  BOOST_TEST(seen[0].what == "late");
  BOOST_TEST(registry.counters(&device).for_code(IBV_EVENT_PORT_ERR).handler_failures == 1u);
}

// An executor that refuses the task, whatever it throws, is reported with the
// event's device and code; the event counts as unclaimed, and nothing
// terminates the process (a throw not derived from std::exception did).
BOOST_AUTO_TEST_CASE(an_executor_that_refuses_is_reported_whatever_it_throws) {
  std::vector<ibev::Failure> seen;
  Registry registry([&](const ibev::Failure& f) { seen.push_back(f); });
  ibv_context device{};
  ibv_qp qp{};
  Handle handler = registry.attach(
      &qp, EventFilter{}, [](const Event&) {}, [](ibev::Task) { throw 42; });
  BOOST_TEST(registry.route(Event::synthesize(&device, IBV_EVENT_QP_FATAL, &qp)) == 0u);
  BOOST_REQUIRE(seen.size() == 1u);
  BOOST_TEST(seen[0].verb == "executor");
  BOOST_TEST(seen[0].what.find("not derived from std::exception") != std::string::npos);
  BOOST_TEST(seen[0].device == &device);
  BOOST_TEST(seen[0].event_code.value_or(-1) == IBV_EVENT_QP_FATAL);
  BOOST_TEST(registry.counters(&device).for_code(IBV_EVENT_QP_FATAL).unclaimed == 1u);
}

// A handler that throws on its executor after the Registry is gone is still
// said (on stderr), never dropped, and touches nothing of the Registry.
BOOST_AUTO_TEST_CASE(a_throw_on_the_executor_after_the_registry_is_gone_is_still_said) {
  ManualExecutor executor;
  ibv_context device{};
  Handle listener;
  {
    Registry registry([](const ibev::Failure&) { BOOST_ERROR("the sink is gone"); });
    listener = registry.listen(
        &device, EventFilter{}, [](const Event&) { throw std::runtime_error("orphaned"); },
        executor.executor());
    registry.route(Event::synthesize(&device, IBV_EVENT_PORT_ERR, ibev::Port{1}));
  }
  std::FILE* const said = std::tmpfile();
  BOOST_REQUIRE(said != nullptr);
  std::fflush(stderr);
  const int saved = ::dup(STDERR_FILENO);
  ::dup2(::fileno(said), STDERR_FILENO);
  executor.run_all();
  std::fflush(stderr);
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  std::rewind(said);
  std::string text(4096, '\0');
  text.resize(std::fread(text.data(), 1, text.size(), said));
  std::fclose(said);
  BOOST_TEST(text.find("handler threw: event handler") != std::string::npos, text);
  BOOST_TEST(text.find("orphaned") != std::string::npos, text);
}

BOOST_AUTO_TEST_SUITE_END()
