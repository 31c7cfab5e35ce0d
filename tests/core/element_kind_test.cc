// The element kinds' table (kElementKinds, core/event_type.h) and every part
// of ibev that reads it, walked row by row: a kind's row is all its name,
// description, object-ness and async read need, so a kind added with its row
// is covered here without a line of this file changing. What is checked at
// compile time instead: the rows are in the enum's order (event_type.h),
// every kind fits an ObjectKey's low bits (object_table.h), and the C API's
// ibev_element_kind mirrors the table (capi/ibev_c.cc).
#define BOOST_TEST_MODULE ibev_element_kind
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>
#include <cstring>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <variant>

#include <ibev/core/event.h>
#include <ibev/formats/recording.h>

using ibev::ElementKind;
using ibev::ElementKindInfo;
using ibev::ElementMember;
using ibev::Event;
using ibev::EventTypeInfo;

namespace boost::test_tools::tt_detail {
template <>
struct print_log_value<ElementKindInfo> {
  void operator()(std::ostream& out, const ElementKindInfo& row) { out << row.name; }
};
template <>
struct print_log_value<EventTypeInfo> {
  void operator()(std::ostream& out, const EventTypeInfo& row) { out << row.enumerator; }
};
}  // namespace boost::test_tools::tt_detail

namespace {

ibv_context* fake_device() {
  static ibv_context context{};
  return &context;
}

const ElementKindInfo& row_of(ElementKind kind) {
  const ElementKindInfo* row = ibev::find_element_kind(kind);
  BOOST_REQUIRE(row != nullptr);
  return *row;
}

// Stand-ins whose addresses an event may carry.
ibv_cq cq;
ibv_qp qp;
ibv_srq srq;
ibv_wq wq;

// An ibv_async_event of `code`, its element set through `member`, as
// rdma-core would; and the element Event should read from it.
ibv_async_event raw_event(int code, ElementMember member, ibev::Element& expected) {
  ibv_async_event raw{};
  std::memcpy(&raw.event_type, &code, sizeof code);
  switch (member) {
    case ElementMember::kCq:
      raw.element.cq = &cq;
      expected = &cq;
      break;
    case ElementMember::kQp:
      raw.element.qp = &qp;
      expected = &qp;
      break;
    case ElementMember::kSrq:
      raw.element.srq = &srq;
      expected = &srq;
      break;
    case ElementMember::kWq:
      raw.element.wq = &wq;
      expected = &wq;
      break;
    case ElementMember::kPortNum:
      raw.element.port_num = 3;
      expected = ibev::Port{3};
      break;
    case ElementMember::kNone:
      expected = ibev::WholeDevice{};
      break;
  }
  return raw;
}

// An event of `info`'s code that names its element as an injector would: an
// object by number (which every object kind can be), a port, or nothing.
Event synthesized(const EventTypeInfo& info) {
  const ElementKindInfo& row = row_of(info.element);
  if (row.object) {
    return Event::synthesize(fake_device(), info.type, ibev::ObjectNumber{row.kind, 7});
  }
  if (row.member == ElementMember::kPortNum) {
    return Event::synthesize(fake_device(), info.type, ibev::Port{1});
  }
  return Event::synthesize(fake_device(), info.type, ibev::WholeDevice{});
}

}  // namespace

BOOST_DATA_TEST_CASE(every_kind_is_named_and_described_by_its_row, ibev::kElementKinds, row) {
  BOOST_TEST(ibev::to_string(row.kind) == row.name);
  std::ostringstream printed;
  printed << row.kind;
  BOOST_TEST(printed.str() == std::string(row.name));
  BOOST_TEST(ibev::is_object(row.kind) == row.object);
  BOOST_TEST(!row.description.empty());
  // Only the device's row names no member: other kinds arrive with an
  // element, or (an object named by number only) are objects.
  BOOST_TEST((row.member != ElementMember::kNone || row.object ||
              row.kind == ElementKind::kDevice));
}

BOOST_AUTO_TEST_CASE(names_are_distinct_and_a_value_outside_the_table_is_invalid) {
  std::set<std::string_view> names;
  for (const ElementKindInfo& row : ibev::kElementKinds) names.insert(row.name);
  BOOST_TEST(names.size() == ibev::kElementKinds.size());
  const auto outside = static_cast<ElementKind>(ibev::kElementKinds.size());
  BOOST_TEST(ibev::find_element_kind(outside) == nullptr);
  BOOST_TEST(ibev::to_string(outside) == "invalid");
  BOOST_TEST(!ibev::is_object(outside));
}

// A recording's "scope" is the row's name, read back as its kind: checked
// with a code this build does not know, whose scope any kind may be.
BOOST_DATA_TEST_CASE(a_recordings_scope_reads_back_as_its_kind, ibev::kElementKinds, row) {
  std::istringstream in(R"({"time":"2026-11-21T12:00:00Z","device":"rxe0","code":77,"scope":")" +
                        std::string(row.name) + R"(","port":1})");
  const auto lines = ibev::read_recording(in, "rec.jsonl");
  BOOST_REQUIRE(lines.size() == 1u);
  BOOST_TEST((std::get<ibev::RecordedEvent>(lines[0]).kind == row.kind));
}

BOOST_AUTO_TEST_CASE(a_scope_no_row_names_is_refused_with_every_name) {
  std::istringstream in(
      R"({"time":"2026-11-21T12:00:00Z","device":"rxe0","code":77,"scope":"dct"})");
  try {
    (void)ibev::read_recording(in, "rec.jsonl");
    BOOST_FAIL("a scope of no kind was read");
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    BOOST_TEST(what.rfind("rec.jsonl:1: \"scope\" is not ", 0) == 0, what);
    BOOST_TEST(what.find(": 'dct'") != std::string::npos, what);
    for (const ElementKindInfo& row : ibev::kElementKinds) {
      BOOST_TEST(what.find(std::string(row.name)) != std::string::npos, row.name << ": " << what);
    }
  }
}

// Every code's event, of its row's kind, through a recording and back.
BOOST_DATA_TEST_CASE(every_codes_kind_survives_a_recording, ibev::kEventTypes, info) {
  const Event event = synthesized(info);
  BOOST_TEST((event.element_kind() == info.element));
  std::istringstream in(ibev::recording_line(event, "rxe0", ibev::RecordingClock::now()) + "\n");
  const auto lines = ibev::read_recording(in, "rec.jsonl");
  BOOST_REQUIRE(lines.size() == 1u);
  BOOST_TEST((std::get<ibev::RecordedEvent>(lines[0]).kind == info.element));
}

// Event::from_async reads each code's element through the member its kind's
// row names, and the event is of that kind.
BOOST_DATA_TEST_CASE(from_async_reads_the_member_the_row_names, ibev::kEventTypes, info) {
  ibev::Element expected;
  const ibv_async_event raw = raw_event(info.type, row_of(info.element).member, expected);
  const Event event = Event::from_async(fake_device(), raw);
  BOOST_TEST((event.element_kind() == info.element));
  BOOST_TEST((event.element() == expected));
}

// The messages that name a kind use its row's description.
BOOST_DATA_TEST_CASE(a_wrong_element_is_refused_in_the_rows_words, ibev::kEventTypes, info) {
  const ElementKindInfo& row = row_of(info.element);
  const ibev::Element wrong = row.member == ElementMember::kPortNum
                                  ? ibev::Element(ibev::WholeDevice{})
                                  : ibev::Element(ibev::Port{1});
  const ElementKindInfo& wrong_row = row_of(ibev::kind_of(wrong));
  try {
    (void)Event::synthesize(fake_device(), info.type, wrong);
    BOOST_FAIL("a wrong element was taken");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(std::string(e.what()) == "Event::synthesize: " + std::string(info.enumerator) +
                                            " carries " + std::string(row.description) +
                                            ", not " + std::string(wrong_row.description));
  }
}
