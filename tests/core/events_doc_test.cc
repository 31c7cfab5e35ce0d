// docs/events.md documents kEventTypes and kCmEventTypes; this keeps each
// table in step with its code, cell by cell, both ways.
#define BOOST_TEST_MODULE ibev_core_events_doc
#include <boost/test/unit_test.hpp>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <ibev/cm/cm_event_type.h>
#include <ibev/core/event_type.h>

namespace {

std::string trim(const std::string& s) {
  const auto first = s.find_first_not_of(' ');
  const auto last = s.find_last_not_of(' ');
  return first == std::string::npos ? "" : s.substr(first, last - first + 1);
}

// Rows of one classification table: "| code | ... |" rows whose first cell is
// a number, in the part of the page under the heading that starts with
// `heading` (up to the next heading).
std::map<int, std::vector<std::string>> documented_rows(const std::string& heading) {
  std::ifstream doc("docs/events.md");
  BOOST_REQUIRE_MESSAGE(doc, "docs/events.md not found in runfiles");
  std::map<int, std::vector<std::string>> rows;
  std::string line;
  bool inside = false;
  while (std::getline(doc, line)) {
    if (line.rfind("#", 0) == 0) inside = line.rfind(heading, 0) == 0;
    if (!inside || line.rfind("| ", 0) != 0) continue;
    std::vector<std::string> cells;
    std::stringstream in(line.substr(1));
    std::string cell;
    while (std::getline(in, cell, '|')) cells.push_back(trim(cell));
    if (cells.size() < 5 || cells[0].empty() ||
        cells[0].find_first_not_of("0123456789") != std::string::npos) {
      continue;
    }
    const int code = std::stoi(cells[0]);
    BOOST_TEST(rows.count(code) == 0u, "code " << code << " documented twice");
    rows[code] = {cells[1], cells[2], cells[3], cells[4]};
  }
  BOOST_TEST(!rows.empty(), "no table under '" << heading << "'");
  return rows;
}

}  // namespace

BOOST_AUTO_TEST_CASE(table_matches_the_code) {
  const auto rows = documented_rows("# Async events");
  BOOST_TEST(rows.size() == ibev::kEventTypes.size());
  for (const ibev::EventTypeInfo& info : ibev::kEventTypes) {
    const int code = static_cast<int>(info.type);
    const auto it = rows.find(code);
    BOOST_REQUIRE_MESSAGE(it != rows.end(), "code " << code << " undocumented");
    const auto& row = it->second;
    BOOST_TEST(row[0] == std::string(info.enumerator));
    BOOST_TEST(row[1] == std::string(info.name));
    BOOST_TEST(row[2] == std::string(ibev::to_string(info.element)),
               info.enumerator);
    BOOST_TEST(row[3] == std::string(ibev::to_string(info.severity)),
               info.enumerator);
  }
}

BOOST_AUTO_TEST_CASE(cm_table_matches_the_code) {
  const auto rows = documented_rows("## CM events");
  BOOST_TEST(rows.size() == ibev::kCmEventTypes.size());
  for (const ibev::CmEventTypeInfo& info : ibev::kCmEventTypes) {
    const int code = static_cast<int>(info.type);
    const auto it = rows.find(code);
    BOOST_REQUIRE_MESSAGE(it != rows.end(), "CM code " << code << " undocumented");
    const auto& row = it->second;
    BOOST_TEST(row[0] == std::string(info.enumerator));
    // librdmacm names each type by its enumerator.
    BOOST_TEST(row[0] == std::string(rdma_event_str(info.type)));
    BOOST_TEST(row[1] == std::string(ibev::to_string(info.scope)), info.enumerator);
    BOOST_TEST(row[2] == std::string(ibev::to_string(info.payload)), info.enumerator);
    BOOST_TEST(row[3] == std::string(ibev::to_string(info.severity)), info.enumerator);
  }
}

BOOST_AUTO_TEST_CASE(cm_codes_this_build_does_not_know_are_kept_by_number) {
  BOOST_TEST(ibev::find_cm_event_type(16) == nullptr);
  BOOST_TEST(ibev::find_cm_event_type(-1) == nullptr);
  BOOST_TEST(ibev::describe_cm_event_code(16) == "CM event code 16");
  BOOST_TEST(ibev::describe_cm_event_code(RDMA_CM_EVENT_TIMEWAIT_EXIT) ==
             "RDMA_CM_EVENT_TIMEWAIT_EXIT");
}
