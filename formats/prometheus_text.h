// ibev::MetricsText: the Prometheus text exposition format (version 0.0.4,
// what every Prometheus server scrapes and node_exporter's textfile
// collector reads), written one metric family at a time.
//
//   MetricsText text(out);
//   text.family("ibev_events_delivered_total", MetricsText::kCounter, "Events that ...");
//   text.sample({{"device", "rxe0"}, {"event", "IBV_EVENT_PORT_ERR"}}, 3);
//
// A family's HELP and TYPE lines come first, then its samples, as the format
// requires; label values and help text are escaped here, so any device name
// is safe. Names are checked against the format's grammar (std::invalid_argument),
// as a mistyped one would make the whole scrape fail in the server.
//
// Thread-safety: none; one writer on one stream.
#ifndef IBEV_FORMATS_PROMETHEUS_TEXT_H_
#define IBEV_FORMATS_PROMETHEUS_TEXT_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ibev {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

class MetricsText {
 public:
  enum Type { kCounter, kGauge };

  // The content type an HTTP server answers with.
  static constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";

  explicit MetricsText(std::ostream& out) : out_(out) {}

  // Starts family `name` (a counter's name ends in _total, by Prometheus's
  // convention). Throws std::invalid_argument for a name outside
  // `[a-zA-Z_:][a-zA-Z0-9_:]*`.
  void family(std::string_view name, Type type, std::string_view help);
  // One sample of the family started last. Throws std::invalid_argument for a
  // label name outside `[a-zA-Z_][a-zA-Z0-9_]*`, or std::logic_error before
  // any family().
  void sample(const MetricLabels& labels, std::uint64_t value);
  void sample(const MetricLabels& labels, double value);

 private:
  void sample_start(const MetricLabels& labels);

  std::ostream& out_;
  std::string family_;
};

}  // namespace ibev

#endif  // IBEV_FORMATS_PROMETHEUS_TEXT_H_
