// The Prometheus text exposition format, version 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/).
#include <ibev/formats/prometheus_text.h>

#include <charconv>
#include <cmath>
#include <stdexcept>

namespace ibev {
namespace {

bool valid_name(std::string_view name, bool colons) {
  if (name.empty()) return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool letter =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colons && c == ':');
    const bool digit = c >= '0' && c <= '9';
    if (!letter && !(digit && i > 0)) return false;
  }
  return true;
}

// HELP text escapes backslash and newline; label values also the quote.
void write_escaped(std::ostream& out, std::string_view text, bool quote) {
  for (const char c : text) {
    if (c == '\\') {
      out << "\\\\";
    } else if (c == '\n') {
      out << "\\n";
    } else if (quote && c == '"') {
      out << "\\\"";
    } else {
      out << c;
    }
  }
}

}  // namespace

void MetricsText::family(std::string_view name, Type type, std::string_view help) {
  if (!valid_name(name, true)) {
    throw std::invalid_argument("MetricsText::family: '" + std::string(name) +
                                "' is not a metric name");
  }
  family_ = name;
  out_ << "# HELP " << name << ' ';
  write_escaped(out_, help, false);
  out_ << "\n# TYPE " << name << ' ' << (type == kCounter ? "counter" : "gauge") << '\n';
}

void MetricsText::sample_start(const MetricLabels& labels) {
  if (family_.empty()) throw std::logic_error("MetricsText::sample: no family() yet");
  for (const auto& label : labels) {
    if (!valid_name(label.first, false)) {
      throw std::invalid_argument("MetricsText::sample: '" + label.first + "' is not a label name");
    }
  }
  out_ << family_;
  if (labels.empty()) return;
  char separator = '{';
  for (const auto& [name, value] : labels) {
    out_ << separator << name << "=\"";
    write_escaped(out_, value, true);
    out_ << '"';
    separator = ',';
  }
  out_ << '}';
}

// std::to_chars, not a stream or printf: neither the stream's nor the C
// locale may turn 0.5 into "0,5". A double is written in its shortest form
// that reads back the same.
void MetricsText::sample(const MetricLabels& labels, std::uint64_t value) {
  sample_start(labels);
  char text[32];
  const auto end = std::to_chars(text, text + sizeof text, value).ptr;
  out_ << ' ' << std::string_view(text, static_cast<std::size_t>(end - text)) << '\n';
}

void MetricsText::sample(const MetricLabels& labels, double value) {
  sample_start(labels);
  char text[32];
  std::string_view written;
  if (std::isnan(value)) {
    written = "NaN";
  } else if (std::isinf(value)) {
    written = value > 0 ? "+Inf" : "-Inf";
  } else {
    const auto end = std::to_chars(text, text + sizeof text, value).ptr;
    written = std::string_view(text, static_cast<std::size_t>(end - text));
  }
  out_ << ' ' << written << '\n';
}

}  // namespace ibev
