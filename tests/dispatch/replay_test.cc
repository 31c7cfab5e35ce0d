// Replaying a recording into a Dispatcher: its listeners and objects hear the
// recorded sequence, element by element; what has no live target is skipped
// and counted; timing is the recording's, scaled, or none; stop() ends a
// replay waiting out a long gap; bad options and a wrong target are refused.
#define BOOST_TEST_MODULE ibev_replay
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cmath>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <ibev/dispatch/dispatcher.h>
#include <ibev/dispatch/replay.h>
#include <ibev/formats/recording.h>

#include "tests/support/testing.h"

using ibev::Event;
using ibev::Replay;
using ibev::testing::eventually;
using namespace std::chrono_literals;

namespace {

// Written by a recording process, for device "rxe0" (its own context).
ibv_context recorded_device;
ibv_qp recorded_qp;

ibev::RecordingClock::time_point at(std::chrono::microseconds offset) {
  return ibev::RecordingClock::time_point(std::chrono::seconds(1795262400) + offset);
}

std::vector<ibev::RecordedLine> recording(const std::vector<std::string>& lines) {
  std::string text = ibev::recording_header(at(0us)) + "\n";
  for (const auto& line : lines) text += line + "\n";
  std::istringstream in(text);
  return ibev::read_recording(in, "test.jsonl");
}

std::string line(const Event& event, std::chrono::microseconds offset,
                 const char* device = "rxe0") {
  return ibev::recording_line(event, device, at(offset));
}

struct Heard {
  int code;
  ibev::ElementKind kind;
  std::optional<int> port;
  bool operator==(const Heard& o) const {
    return code == o.code && kind == o.kind && port == o.port;
  }
};
std::ostream& operator<<(std::ostream& out, const Heard& h) {
  return out << h.code << '/' << ibev::to_string(h.kind) << '/' << h.port.value_or(0);
}

// The replaying process: its own device and QP, listened to and attached.
struct Fixture {
  Fixture() { dispatcher.start(); }
  ~Fixture() { dispatcher.stop(); }

  std::vector<Heard> heard() {
    std::lock_guard<std::mutex> lock(mutex);
    return events;
  }
  ibev::Handler record() {
    return [this](const Event& e) {
      std::lock_guard<std::mutex> lock(mutex);
      events.push_back({e.code(), e.element_kind(), e.port()});
    };
  }

  ibev::Dispatcher dispatcher;
  ibv_context device{};
  ibv_qp qp{};
  std::mutex mutex;
  std::vector<Heard> events;
  ibev::Handle listener = dispatcher.registry().listen(&device, record());
  ibev::Handle by_address = dispatcher.registry().attach(&qp, record());
  ibev::Handle by_number = dispatcher.registry().attach(
      &device, ibev::ObjectNumber{ibev::ElementKind::kQp, 0x11}, {}, record());
  Replay::Options options() {
    Replay::Options o;
    o.speed = 0;
    o.device = [this](const std::string& name) { return name == "rxe0" ? &device : nullptr; };
    return o;
  }
};

}  // namespace

BOOST_FIXTURE_TEST_SUITE(replay, Fixture)

BOOST_AUTO_TEST_CASE(listeners_and_objects_hear_the_recorded_sequence) {
  const auto lines = recording({
      line(Event::synthesize(&recorded_device, IBV_EVENT_PORT_ERR, ibev::Port{1}), 0us),
      line(Event::synthesize(&recorded_device, IBV_EVENT_GID_CHANGE, ibev::Port{2}), 10us),
      line(Event::synthesize(&recorded_device, IBV_EVENT_QP_FATAL,
                             ibev::ObjectNumber{ibev::ElementKind::kQp, 0x11}),
           20us),
      line(Event::device_lost(&recorded_device, ibev::DeviceLoss::kRemoved), 30us),
      line(Event::synthesize(&recorded_device, IBV_EVENT_PORT_ACTIVE, ibev::Port{1}), 40us),
  });
  const ibev::ReplayStats stats = Replay(dispatcher, options()).play(lines);
  BOOST_TEST(stats.injected == 5u);
  BOOST_TEST(stats.skipped == 0u);
  const std::vector<Heard> expected = {
      {IBV_EVENT_PORT_ERR, ibev::ElementKind::kPort, 1},
      {IBV_EVENT_GID_CHANGE, ibev::ElementKind::kPort, 2},
      {IBV_EVENT_QP_FATAL, ibev::ElementKind::kQp, std::nullopt},
      {IBV_EVENT_DEVICE_FATAL, ibev::ElementKind::kDevice, std::nullopt},
      {IBV_EVENT_PORT_ACTIVE, ibev::ElementKind::kPort, 1},
  };
  BOOST_TEST(eventually([&] { return heard().size() >= expected.size(); }));
  BOOST_TEST(heard() == expected, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(what_has_no_live_target_is_skipped_and_changes_are_told) {
  const auto lines = recording({
      line(Event::synthesize(&recorded_device, IBV_EVENT_PORT_ERR, ibev::Port{1}), 0us, "mlx5_9"),
      // An address means nothing here: skipped unless resolved.
      line(Event::synthesize(&recorded_device, IBV_EVENT_QP_FATAL, &recorded_qp), 10us),
      ibev::recording_change_line("rxe0", "uverbs0", false, ibev::DeviceLoss::kRemoved, at(20us)),
      line(Event::synthesize(&recorded_device, IBV_EVENT_PORT_ACTIVE, ibev::Port{1}), 30us),
  });
  std::vector<bool> changes;
  Replay::Options o = options();
  o.change = [&](const ibev::RecordedChange& change) { changes.push_back(change.added); };
  const ibev::ReplayStats stats = Replay(dispatcher, o).play(lines);
  BOOST_TEST(stats.injected == 1u);
  BOOST_TEST(stats.skipped == 2u);
  BOOST_TEST(stats.changes == 1u);
  BOOST_TEST(changes == std::vector<bool>{false});
  BOOST_TEST(eventually([&] { return !heard().empty(); }));
  BOOST_TEST(heard().front().code == IBV_EVENT_PORT_ACTIVE);

  // Resolved to the live QP, the address-only event reaches it.
  o.object = [this](const ibev::RecordedEvent&) -> std::optional<Replay::Target> {
    return Replay::Target(ibev::Element(&qp));
  };
  BOOST_TEST(Replay(dispatcher, o).play(lines).injected == 2u);
  BOOST_TEST(eventually([&] { return heard().size() == 3u; }));
  BOOST_TEST(heard()[1].code == IBV_EVENT_QP_FATAL);
}

// Gaps are the recording's divided by speed: never shorter, and a recorded
// minute at speed 1000 far from a minute (60 ms; 10 s allows a slow host).
BOOST_AUTO_TEST_CASE(gaps_are_scaled_by_speed) {
  const auto lines = recording({
      line(Event::synthesize(&recorded_device, IBV_EVENT_PORT_ERR, ibev::Port{1}), 0us),
      line(Event::synthesize(&recorded_device, IBV_EVENT_PORT_ACTIVE, ibev::Port{1}), 60s),
  });
  Replay::Options o = options();
  o.speed = 1000;
  const auto started = std::chrono::steady_clock::now();
  Replay(dispatcher, o).play(lines);
  const auto took = std::chrono::steady_clock::now() - started;
  BOOST_TEST((took >= 60ms));
  BOOST_TEST((took < 10s));
}

// The origin is what the replay's start stands for: a schedule's 0, not its
// first fault (which comes 50 ms in).
BOOST_AUTO_TEST_CASE(the_origin_shifts_the_first_wait) {
  const auto lines = recording(
      {line(Event::synthesize(&recorded_device, IBV_EVENT_PORT_ERR, ibev::Port{1}), 50ms)});
  Replay::Options o = options();
  o.speed = 1;
  o.origin = at(0us);
  const auto started = std::chrono::steady_clock::now();
  Replay(dispatcher, o).play(lines);
  BOOST_TEST((std::chrono::steady_clock::now() - started >= 50ms));
}

// A recorded hour at speed 0 is no wait; at speed 1, stop() ends it at once.
BOOST_AUTO_TEST_CASE(speed_0_does_not_wait_and_stop_ends_a_wait) {
  const auto lines = recording({
      line(Event::synthesize(&recorded_device, IBV_EVENT_PORT_ERR, ibev::Port{1}), 0us),
      line(Event::synthesize(&recorded_device, IBV_EVENT_PORT_ACTIVE, ibev::Port{1}), 1h),
  });
  BOOST_TEST(Replay(dispatcher, options()).play(lines).injected == 2u);

  Replay::Options o = options();
  o.speed = 1;
  Replay replay(dispatcher, o);
  ibev::ReplayStats stats;
  std::thread playing([&] { stats = replay.play(lines); });
  BOOST_TEST(eventually([&] { return heard().size() == 3u; }));  // 2 above, then the first
  replay.stop();
  playing.join();
  BOOST_TEST(stats.stopped);
  BOOST_TEST(stats.injected == 1u);
  BOOST_TEST(replay.play(lines).stopped);  // stopped for good
}

BOOST_AUTO_TEST_CASE(bad_options_and_a_wrong_target_are_refused) {
  Replay::Options o = options();
  o.device = nullptr;
  ibev::testing::expect_throw<std::invalid_argument>([&] { Replay(dispatcher, o); },
                                                     "no Options::device");
  for (const double speed : {-1.0, std::nan(""), HUGE_VAL, 1e-300, 1e7}) {
    o = options();
    o.speed = speed;
    ibev::testing::expect_throw<std::invalid_argument>([&] { Replay(dispatcher, o); },
                                                       "is not 0 (no waits) nor from 1e-6 to 1e6");
  }
  o = options();
  ibv_cq cq{};
  o.object = [&](const ibev::RecordedEvent&) -> std::optional<Replay::Target> {
    return Replay::Target(ibev::Element(&cq));  // a CQ for a QP's event
  };
  const auto lines =
      recording({line(Event::synthesize(&recorded_device, IBV_EVENT_QP_FATAL, &recorded_qp), 0us)});
  ibev::testing::expect_throw<std::invalid_argument>(
      [&] { Replay(dispatcher, o).play(lines); },
      "Replay::play: IBV_EVENT_QP_FATAL of rxe0 (event 1)");
}

BOOST_AUTO_TEST_SUITE_END()
