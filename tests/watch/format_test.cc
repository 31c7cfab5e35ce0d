// ibev-watch's lines and the recording format it prints with --json: what
// each field says, for every kind of element.
#define BOOST_TEST_MODULE ibev_watch_format
#include <boost/test/unit_test.hpp>
#include <cstring>
#include <string>

#include <ibev/formats/recording.h>

#include "apps/ibev_watch/format.h"

using ibev::Event;
using ibev::watch::Clock;

namespace {

// 2026-11-21T12:00:00.123456Z
Clock::time_point noon() {
  return Clock::time_point(std::chrono::seconds(1795262400) + std::chrono::microseconds(123456));
}

ibv_context* device() {
  static ibv_context context{};
  return &context;
}

}  // namespace

BOOST_AUTO_TEST_CASE(time_is_iso8601_utc_with_microseconds) {
  BOOST_TEST(ibev::iso8601_utc(noon()) == "2026-11-21T12:00:00.123456Z");
}

BOOST_AUTO_TEST_CASE(port_event) {
  ibv_async_event raw{};
  raw.event_type = IBV_EVENT_PORT_ERR;
  raw.element.port_num = 1;
  const Event event = Event::from_async(device(), raw);
  BOOST_TEST(ibev::watch::format_human(event, "rxe0", noon()) ==
             "2026-11-21T12:00:00.123456Z rxe0 port 1 IBV_EVENT_PORT_ERR (port error) error");
  const std::string expected = R"({"time":"2026-11-21T12:00:00.123456Z","device":"rxe0",)"
                               R"("event":"IBV_EVENT_PORT_ERR","code":10,"scope":"port","port":1,)"
                               R"("severity":"error"})";
  BOOST_TEST(ibev::recording_line(event, "rxe0", noon()) == expected);
}

BOOST_AUTO_TEST_CASE(object_event_names_the_object) {
  ibv_qp qp{};
  const Event event = Event::synthesize(device(), IBV_EVENT_QP_FATAL, &qp);
  const std::string human = ibev::watch::format_human(event, "mlx5_0", noon());
  BOOST_TEST(human.find(" mlx5_0 qp 0x") != std::string::npos);
  BOOST_TEST(
      human.find("IBV_EVENT_QP_FATAL (local work queue catastrophic error) fatal [synthesized]") !=
      std::string::npos);
  const std::string json = ibev::recording_line(event, "mlx5_0", noon());
  const std::string object_field = R"("scope":"qp","object":"0x)";
  const std::string synthesized_field = R"("synthesized":true})";
  BOOST_TEST(json.find(object_field) != std::string::npos);
  BOOST_TEST(json.find(synthesized_field) != std::string::npos);
}

BOOST_AUTO_TEST_CASE(an_object_named_by_number_shows_its_number) {
  const Event event = Event::synthesize(device(), IBV_EVENT_QP_FATAL,
                                        ibev::ObjectNumber{ibev::ElementKind::kQp, 17});
  const std::string human = ibev::watch::format_human(event, "mlx5_0", noon());
  BOOST_TEST(human.find(" mlx5_0 qp #17 IBV_EVENT_QP_FATAL ") != std::string::npos, human);
  const std::string json = ibev::recording_line(event, "mlx5_0", noon());
  BOOST_TEST(json.find(R"("scope":"qp","number":17,)") != std::string::npos, json);
}

BOOST_AUTO_TEST_CASE(device_and_unknown_events) {
  const Event fatal = Event::synthesize(device(), IBV_EVENT_DEVICE_FATAL, ibev::WholeDevice{});
  BOOST_TEST(ibev::watch::format_human(fatal, "rxe0", noon())
                 .find(" rxe0 device IBV_EVENT_DEVICE_FATAL (local catastrophic error) fatal") !=
             std::string::npos);
  ibv_async_event raw{};
  const int code = 42;
  std::memcpy(&raw.event_type, &code, sizeof code);
  const Event unknown = Event::from_async(device(), raw);
  const std::string expected =
      R"j({"time":"2026-11-21T12:00:00.123456Z","device":"rxe0",)j"
      R"j("event":"unknown(42)","code":42,"scope":"device","severity":"unknown"})j";
  BOOST_TEST(ibev::recording_line(unknown, "rxe0", noon()) == expected);
}

BOOST_AUTO_TEST_CASE(json_strings_are_escaped) {
  const std::string expected = R"("a\"b\\c\n\u0001")";
  BOOST_TEST(ibev::json_string("a\"b\\c\n\x01") == expected);
}

// A removed device: its DEVICE_FATAL says why, and the change is a line.
BOOST_AUTO_TEST_CASE(a_lost_device_and_devices_coming_and_going) {
  auto* context = reinterpret_cast<ibv_context*>(0x1000);
  const auto lost = ibev::Event::device_lost(context, ibev::DeviceLoss::kRemoved);
  BOOST_TEST(ibev::watch::format_human(lost, "rxe0", noon()) ==
             "2026-11-21T12:00:00.123456Z rxe0 device IBV_EVENT_DEVICE_FATAL (local catastrophic "
             "error) fatal [removed] [synthesized]");
  BOOST_TEST(
      ibev::recording_line(lost, "rxe0", noon()).find(R"("loss":"removed","synthesized":true})") !=
      std::string::npos);
  BOOST_TEST(ibev::watch::format_change_human("rxe0", "uverbs0", false, ibev::DeviceLoss::kRemoved,
                                              noon()) ==
             "2026-11-21T12:00:00.123456Z rxe0 device removed (uverbs0, removed)");
  BOOST_TEST(
      ibev::recording_change_line("rxe0", "uverbs1", true, ibev::DeviceLoss::kNone, noon()) ==
      R"({"time":"2026-11-21T12:00:00.123456Z","device":"rxe0","change":"added","node":"uverbs1"})");
}
