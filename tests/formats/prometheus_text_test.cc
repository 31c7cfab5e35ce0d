// The Prometheus text format (formats/prometheus_text.h): a family's HELP and
// TYPE lines and escaped samples, the grammar's refusals, values untouched by
// the stream's locale.
#define BOOST_TEST_MODULE ibev_prometheus_text
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdint>
#include <locale>
#include <sstream>
#include <stdexcept>
#include <string>

#include <ibev/formats/prometheus_text.h>

using ibev::MetricsText;

BOOST_AUTO_TEST_CASE(a_family_and_its_escaped_samples) {
  std::ostringstream out;
  MetricsText text(out);
  text.family("ibev_x_total", MetricsText::kCounter, "Help with \\ and\nnewline");
  text.sample({{"device", "a\"b\\c\nd"}, {"port", "1"}}, std::uint64_t{7});
  text.sample({}, std::uint64_t{18446744073709551615u});
  text.family("ibev_y", MetricsText::kGauge, "g");
  text.sample({}, 0.5);
  text.sample({}, std::nan(""));
  text.sample({}, -HUGE_VAL);
  BOOST_TEST(out.str() ==
             "# HELP ibev_x_total Help with \\\\ and\\nnewline\n"
             "# TYPE ibev_x_total counter\n"
             "ibev_x_total{device=\"a\\\"b\\\\c\\nd\",port=\"1\"} 7\n"
             "ibev_x_total 18446744073709551615\n"
             "# HELP ibev_y g\n# TYPE ibev_y gauge\n"
             "ibev_y 0.5\nibev_y NaN\nibev_y -Inf\n");
}

BOOST_DATA_TEST_CASE(a_name_outside_the_grammar_is_refused,
                     boost::unit_test::data::make({"", "1abc", "a-b", "a b", "é"}), name) {
  std::ostringstream out;
  MetricsText text(out);
  BOOST_CHECK_THROW(text.family(name, MetricsText::kGauge, "h"), std::invalid_argument);
  text.family("ok:name_1", MetricsText::kGauge, "h");
  // Label names take no colon.
  BOOST_CHECK_THROW(text.sample({{name, "v"}}, std::uint64_t{1}), std::invalid_argument);
  BOOST_CHECK_THROW(text.sample({{"a:b", "v"}}, std::uint64_t{1}), std::invalid_argument);
}

// An application's stream may carry a locale that groups digits and writes
// a decimal comma; Prometheus reads neither.
struct GermanNumbers : std::numpunct<char> {
  char do_decimal_point() const override { return ','; }
  char do_thousands_sep() const override { return '.'; }
  std::string do_grouping() const override { return "\3"; }
};

BOOST_AUTO_TEST_CASE(values_ignore_the_stream_locale) {
  std::ostringstream out;
  out.imbue(std::locale(out.getloc(), new GermanNumbers));
  MetricsText text(out);
  text.family("ibev_x", MetricsText::kGauge, "h");
  text.sample({}, std::uint64_t{1234567});
  text.sample({}, 1764503412.5);
  BOOST_TEST(out.str() ==
             "# HELP ibev_x h\n# TYPE ibev_x gauge\nibev_x 1234567\nibev_x 1764503412.5\n");
}

BOOST_AUTO_TEST_CASE(a_sample_before_any_family_is_refused) {
  std::ostringstream out;
  MetricsText text(out);
  BOOST_CHECK_THROW(text.sample({}, std::uint64_t{1}), std::logic_error);
}
