// docs/api.md names every public type of core/, dispatch/, verbs/ and cm/: each
// `class X` or `struct X` declared in namespace ibev (not ibev::detail) in a
// public header must appear there as `X`.
#define BOOST_TEST_MODULE ibev_docs_api
#include <boost/test/unit_test.hpp>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

std::string read(const std::string& path) {
  std::ifstream in(path);
  BOOST_REQUIRE_MESSAGE(in, path << " not found in runfiles");
  std::stringstream all;
  all << in.rdbuf();
  return all.str();
}

// Public types: class/struct definitions outside `namespace detail` blocks.
std::set<std::string> public_types(const std::string& header) {
  std::set<std::string> types;
  static const std::regex definition(R"(^(?:class|struct) (?:\[\[nodiscard\]\] )?(\w+)(?: final)? [:{])");
  std::istringstream in(header);
  std::string line;
  int detail_depth = 0;
  while (std::getline(in, line)) {
    if (line.rfind("namespace detail {", 0) == 0) ++detail_depth;
    if (line.rfind("}  // namespace detail", 0) == 0) --detail_depth;
    std::smatch match;
    if (detail_depth == 0 && std::regex_search(line, match, definition)) {
      types.insert(match[1]);
    }
  }
  return types;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_public_type_is_documented) {
  const std::string api = read("docs/api.md");
  const auto& suite = boost::unit_test::framework::master_test_suite();
  BOOST_REQUIRE_MESSAGE(suite.argc > 1, "pass the public headers after --");
  int found = 0;
  for (int i = 1; i < suite.argc; ++i) {
    for (const std::string& type : public_types(read(suite.argv[i]))) {
      ++found;
      BOOST_TEST(api.find("`" + type + "`") != std::string::npos,
                 type << " (" << suite.argv[i] << ") is not in docs/api.md");
    }
  }
  BOOST_TEST(found >= 25, "only " << found << " public types found: is the scan broken?");
}
