// The recording format (formats/recording.h): what ibev-watch --json writes
// reads back the same, element by element; a newer version and every kind of
// malformed line are refused, naming the file and line.
#define BOOST_TEST_MODULE ibev_recording
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <variant>

#include <ibev/formats/recording.h>

using ibev::ElementKind;
using ibev::Event;
using ibev::RecordedEvent;

namespace {

ibv_context* device() {
  static ibv_context context{};
  return &context;
}

// 2026-11-21T12:00:00.123456Z
ibev::RecordingClock::time_point noon() {
  return ibev::RecordingClock::time_point(std::chrono::seconds(1795262400) +
                                          std::chrono::microseconds(123456));
}

std::vector<ibev::RecordedLine> read(const std::string& text) {
  std::istringstream in(text);
  return ibev::read_recording(in, "rec.jsonl");
}

ibv_qp qp;

struct Case {
  const char* name;
  Event event;
  ElementKind kind;
  std::optional<int> port;
  bool has_object;
  std::optional<std::uint32_t> number;
};
std::ostream& operator<<(std::ostream& out, const Case& c) { return out << c.name; }

const Case kCases[] = {
    {"port", Event::synthesize(device(), IBV_EVENT_PORT_ERR, ibev::Port{2}), ElementKind::kPort, 2,
     false, std::nullopt},
    {"qp by address", Event::synthesize(device(), IBV_EVENT_QP_FATAL, &qp), ElementKind::kQp,
     std::nullopt, true, std::nullopt},
    {"qp by number",
     Event::synthesize(device(), IBV_EVENT_QP_LAST_WQE_REACHED,
                       ibev::ObjectNumber{ElementKind::kQp, 0xabcdef}),
     ElementKind::kQp, std::nullopt, false, 0xabcdef},
    {"device lost", Event::device_lost(device(), ibev::DeviceLoss::kRemoved), ElementKind::kDevice,
     std::nullopt, false, std::nullopt},
    {"unknown code", Event::synthesize(device(), 77, ibev::WholeDevice{}), ElementKind::kDevice,
     std::nullopt, false, std::nullopt},
};

}  // namespace

BOOST_DATA_TEST_CASE(an_event_reads_back_as_written, boost::unit_test::data::make(kCases), c) {
  const auto lines = read(ibev::recording_header(noon()) + "\n" +
                          ibev::recording_line(c.event, "rxe0", noon()) + "\n");
  BOOST_REQUIRE_EQUAL(lines.size(), 1u);
  const auto* read_back = std::get_if<RecordedEvent>(&lines[0]);
  BOOST_REQUIRE(read_back != nullptr);
  BOOST_TEST((read_back->time == noon()));
  BOOST_TEST(read_back->device == "rxe0");
  BOOST_TEST(read_back->code == c.event.code());
  BOOST_TEST((read_back->kind == c.kind));
  BOOST_TEST((read_back->port == c.port));
  BOOST_TEST(read_back->object.has_value() == c.has_object);
  if (c.has_object) BOOST_TEST(*read_back->object == reinterpret_cast<std::uintptr_t>(&qp));
  BOOST_TEST((read_back->number == c.number));
  BOOST_TEST((read_back->loss == c.event.loss()));
  BOOST_TEST(read_back->synthesized == c.event.synthesized());
}

BOOST_AUTO_TEST_CASE(changes_read_back_and_counts_are_skipped) {
  const auto lines = read(
      ibev::recording_change_line("rxe0", "uverbs0", true, ibev::DeviceLoss::kNone, noon()) +
      "\n\n" +
      ibev::recording_change_line("rxe0", "uverbs0", false, ibev::DeviceLoss::kRemoved, noon()) +
      "\n" + R"({"count":3,"device":"rxe0","event":"IBV_EVENT_PORT_ERR"})" + "\n");
  BOOST_REQUIRE_EQUAL(lines.size(), 2u);
  const auto& added = std::get<ibev::RecordedChange>(lines[0]);
  const auto& removed = std::get<ibev::RecordedChange>(lines[1]);
  BOOST_TEST(added.added);
  BOOST_TEST(added.node == "uverbs0");
  BOOST_TEST(!removed.added);
  BOOST_TEST((removed.loss == ibev::DeviceLoss::kRemoved));
}

// Found by tests/fuzz/recording_fuzz.cc: a removal with no loss was written
// "loss":"none", which the reader refuses.
BOOST_AUTO_TEST_CASE(a_removal_without_a_loss_reads_back) {
  const auto lines =
      read(ibev::recording_change_line("rxe0", "uverbs0", false, ibev::DeviceLoss::kNone, noon()));
  BOOST_REQUIRE_EQUAL(lines.size(), 1u);
  const auto& removed = std::get<ibev::RecordedChange>(lines[0]);
  BOOST_TEST(!removed.added);
  BOOST_TEST((removed.loss == ibev::DeviceLoss::kNone));
}

struct Bad {
  const char* line;
  const char* why;
};
std::ostream& operator<<(std::ostream& out, const Bad& b) { return out << b.line; }

const Bad kBad[] = {
    {R"(not json)", "rec.jsonl:2: not a JSON object"},
    {R"({"recording":"ibev","version":2,"time":"x"})", "rec.jsonl:2: a recording of version 2"},
    {R"({"time":"2026-11-21T12:00:00.Z","device":"rxe0","code":10,"scope":"port","port":1})",
     "rec.jsonl:2: \"time\" is not ISO 8601"},
    {R"({"time":"2026-13-21T12:00:00.1Z","device":"rxe0","code":10,"scope":"port","port":1})",
     "rec.jsonl:2: \"time\" is not ISO 8601"},
    {R"({"time":"2026-11-21T25:00:00.1Z","device":"rxe0","code":10,"scope":"port","port":1})",
     "rec.jsonl:2: \"time\" is not ISO 8601"},
    {R"({"time":"2026-02-29T12:00:00.1Z","device":"rxe0","code":10,"scope":"port","port":1})",
     "rec.jsonl:2: \"time\" is not ISO 8601"},
    {R"({"time":"2300-01-01T12:00:00.1Z","device":"rxe0","code":10,"scope":"port","port":1})",
     "rec.jsonl:2: \"time\" is not ISO 8601"},
    {R"({"time":"2026-11-21T12:00:00.-5Z","device":"rxe0","code":10,"scope":"port","port":1})",
     "rec.jsonl:2: \"time\" is not ISO 8601"},
    {R"({"time":"2026-11-21T12:00:00.1234567891Z","device":"d","code":10,"scope":"port","port":1})",
     "rec.jsonl:2: \"time\" is not ISO 8601"},
    {R"({"time":"2026-11-21T12:00:00.1Z","device":{"name":"rxe0"},"code":8,"scope":"device"})",
     "rec.jsonl:2: \"device\" is an object or an array"},
    {R"({"time":"2026-11-21T12:00:00.1Z","device":"d","code":"+8","scope":"device"})",
     "rec.jsonl:2: \"code\" is not a number"},
    {R"({"recording":"ibev","version":1,"time":"2026-11-21T12:00:00.1Z"})",
     "rec.jsonl:2: a header after the first line"},
    {R"({"recording":"other","version":1})", "rec.jsonl:2: a header of another format"},
    {R"({"time":"2026-11-21T12:00:00.000001Z","code":10,"scope":"port","port":1})",
     "rec.jsonl:2: no \"device\""},
    {R"({"time":"2026-11-21T12:00:00.000001Z","device":"d","code":10,"scope":"port"})",
     "rec.jsonl:2: no \"port\""},
    {R"({"time":"2026-11-21T12:00:00.000001Z","device":"d","code":10,"scope":"qp"})",
     "rec.jsonl:2: \"scope\" qp does not match IBV_EVENT_PORT_ERR's port"},
    {R"({"time":"2026-11-21T12:00:00.000001Z","device":"d","code":-1,"scope":"device"})",
     "rec.jsonl:2: \"code\" is not a number"},
    {R"({"time":"2026-11-21T12:00:00.000001Z","device":"d","code":10,"scope":"port","port":0})",
     "rec.jsonl:2: \"port\" is not a number from 1 to 255"},
    {R"({"time":"2026-11-21T12:00:00.000001Z","device":"d","code":1,"scope":"qp","object":"zz"})",
     "rec.jsonl:2: \"object\" is not a number"},
    {R"({"time":"2026-11-21T12:00:00.000001Z","device":"d","change":"moved","node":"u"})",
     "rec.jsonl:2: \"change\" is not added or removed"},
    {R"({"time":"2026-11-21T12:00:00.000001Z","device":"d","code":8,"scope":"device","loss":"x"})",
     "rec.jsonl:2: \"loss\" is not removed, fatal or async fd failed"},
    {R"({"time":"2026-11-21T12:00:00.000001Z","device":"d"})", "rec.jsonl:2: neither an event"},
};

BOOST_DATA_TEST_CASE(a_bad_line_is_refused_with_its_place, boost::unit_test::data::make(kBad), b) {
  const std::string good = ibev::recording_header(noon());
  try {
    read(good + "\n" + b.line + "\n");
    BOOST_FAIL("read: " << b.line);
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(std::string(e.what()).find(b.why) == 0u, e.what());
  }
}

// Fractions of 1 to 9 digits are fractions: ".5" is half a second.
BOOST_AUTO_TEST_CASE(a_short_fraction_is_a_fraction) {
  const auto lines =
      read(R"({"time":"2026-11-21T12:00:00.5Z","device":"d","code":8,"scope":"device"})"
           "\n"
           R"({"time":"2026-11-21T12:00:00.000000001Z","device":"d","code":8,"scope":"device"})");
  const auto time = [&](int i) { return std::get<RecordedEvent>(lines[i]).time; };
  const auto second = ibev::RecordingClock::time_point(std::chrono::seconds(1795262400));
  BOOST_TEST((time(0) == second + std::chrono::milliseconds(500)));
  BOOST_TEST((time(1) == second + std::chrono::nanoseconds(1)));
}

BOOST_AUTO_TEST_CASE(a_leap_day_is_a_day) {
  BOOST_TEST(
      read(R"({"time":"2028-02-29T23:59:59.999999Z","device":"d","code":8,"scope":"device"})")
          .size() == 1u);
}

// A later version adds keys, to events and changes too: read as before.
BOOST_AUTO_TEST_CASE(unknown_keys_are_ignored) {
  const auto lines =
      read(R"({"time":"2026-11-21T12:00:00.5Z","device":"d","code":10,"scope":"port","port":1,)"
           R"("count":7,"recording":"x","future":{"a":[1,2]}})");
  BOOST_REQUIRE_EQUAL(lines.size(), 1u);
  BOOST_TEST(std::get<RecordedEvent>(lines[0]).code == IBV_EVENT_PORT_ERR);
}

BOOST_AUTO_TEST_CASE(a_recording_without_header_is_version_1) {
  const auto lines = read(ibev::recording_line(
      Event::synthesize(device(), IBV_EVENT_GID_CHANGE, ibev::Port{1}), "rxe0", noon()));
  BOOST_TEST(lines.size() == 1u);
}
