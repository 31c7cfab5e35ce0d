// The recording format (core/recording.h): written and read in this one file.
#include <ibev/core/recording.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <sstream>
#include <stdexcept>

#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>

namespace ibev {
namespace {

std::string address(const void* object) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", object);
  return text;
}

}  // namespace

// --------------------------------------------------------------- writing

std::string iso8601_utc(RecordingClock::time_point time) {
  const auto since_epoch = time.time_since_epoch();
  const auto seconds = std::chrono::floor<std::chrono::seconds>(since_epoch);
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(since_epoch - seconds);
  const std::time_t whole = seconds.count();
  std::tm utc{};
  gmtime_r(&whole, &utc);
  char text[64];
  std::snprintf(text, sizeof text, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", utc.tm_year + 1900,
                utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                static_cast<long long>(micros.count()));
  return text;
}

std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string recording_header(RecordingClock::time_point time) {
  return "{\"recording\":\"ibev\",\"version\":" + std::to_string(kRecordingVersion) +
         ",\"time\":" + json_string(iso8601_utc(time)) + "}";
}

std::string recording_line(const Event& event, std::string_view device,
                           RecordingClock::time_point time) {
  std::ostringstream out;
  out << "{\"time\":" << json_string(iso8601_utc(time)) << ",\"device\":" << json_string(device)
      << ",\"event\":" << json_string(enumerator_name(event.code())) << ",\"code\":" << event.code()
      << ",\"scope\":" << json_string(to_string(event.element_kind()));
  if (const auto port = event.port()) {
    out << ",\"port\":" << *port;
  } else if (const void* object = event.object()) {
    out << ",\"object\":" << json_string(address(object));
  } else if (const auto number = event.object_number()) {
    out << ",\"number\":" << number->number;
  }
  out << ",\"severity\":" << json_string(to_string(event.severity()));
  if (event.loss() != DeviceLoss::kNone)
    out << ",\"loss\":" << json_string(to_string(event.loss()));
  if (event.synthesized()) out << ",\"synthesized\":true";
  out << '}';
  return out.str();
}

std::string recording_change_line(std::string_view device, std::string_view node, bool added,
                                  DeviceLoss loss, RecordingClock::time_point time) {
  std::ostringstream out;
  out << "{\"time\":" << json_string(iso8601_utc(time)) << ",\"device\":" << json_string(device)
      << ",\"change\":" << json_string(added ? "added" : "removed")
      << ",\"node\":" << json_string(node);
  if (!added) out << ",\"loss\":" << json_string(to_string(loss));
  out << '}';
  return out.str();
}

// --------------------------------------------------------------- reading

namespace {

using boost::property_tree::ptree;

// One line's reading, its errors naming the file and line.
class LineReader {
 public:
  LineReader(const ptree& tree, const std::string& where) : tree_(tree), where_(where) {}

  [[noreturn]] void fail(const std::string& why) const {
    throw std::invalid_argument(where_ + ": " + why);
  }

  bool has(const char* key) const { return tree_.find(key) != tree_.not_found(); }

  std::string text(const char* key) const {
    const auto value = tree_.get_optional<std::string>(key);
    if (!value) fail(std::string("no \"") + key + "\"");
    return *value;
  }

  // A whole number within [low, high]; base 16 takes "0x".
  unsigned long long number(const char* key, unsigned long long low, unsigned long long high,
                            int base = 10) const {
    const std::string value = text(key);
    char* end = nullptr;
    errno = 0;
    const unsigned long long n = std::strtoull(value.c_str(), &end, base);
    if (value.empty() || value[0] == '-' || value[0] == '+' || *end != '\0' || errno != 0 ||
        n < low || n > high) {
      fail(std::string("\"") + key + "\" is not a number from " + std::to_string(low) + " to " +
           std::to_string(high) + ": '" + value + "'");
    }
    return n;
  }

  RecordingClock::time_point time() const {
    const std::string value = text("time");
    std::tm utc{};
    long long micros = 0;
    int consumed = 0;
    if (std::sscanf(value.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d.%6lldZ%n", &utc.tm_year, &utc.tm_mon,
                    &utc.tm_mday, &utc.tm_hour, &utc.tm_min, &utc.tm_sec, &micros,
                    &consumed) != 7 ||
        static_cast<std::size_t>(consumed) != value.size()) {
      fail("\"time\" is not ISO 8601 UTC with microseconds: '" + value + "'");
    }
    utc.tm_year -= 1900;
    utc.tm_mon -= 1;
    return RecordingClock::time_point(std::chrono::seconds(timegm(&utc)) +
                                      std::chrono::microseconds(micros));
  }

  DeviceLoss loss() const {
    if (!has("loss")) return DeviceLoss::kNone;
    const std::string value = text("loss");
    for (const DeviceLoss loss :
         {DeviceLoss::kRemoved, DeviceLoss::kFatal, DeviceLoss::kAsyncFdFailed}) {
      if (value == to_string(loss)) return loss;
    }
    fail("\"loss\" is not removed, fatal or async fd failed: '" + value + "'");
  }

  ElementKind scope() const {
    const std::string value = text("scope");
    for (const ElementKind kind : {ElementKind::kCq, ElementKind::kQp, ElementKind::kSrq,
                                   ElementKind::kWq, ElementKind::kPort, ElementKind::kDevice}) {
      if (value == to_string(kind)) return kind;
    }
    fail("\"scope\" is not cq, qp, srq, wq, port or device: '" + value + "'");
  }

 private:
  const ptree& tree_;
  const std::string& where_;
};

RecordedEvent read_event(const LineReader& line) {
  RecordedEvent event;
  event.time = line.time();
  event.device = line.text("device");
  event.code = static_cast<int>(line.number("code", 0, 0x7fffffff));
  event.kind = line.scope();
  if (const EventTypeInfo* info = find_event_type(event.code);
      info && info->element != event.kind) {
    line.fail("\"scope\" " + std::string(to_string(event.kind)) + " does not match " +
              std::string(info->enumerator) + "'s " + std::string(to_string(info->element)));
  }
  if (event.kind == ElementKind::kPort) {
    event.port = static_cast<int>(line.number("port", 1, 255));
  }
  if (line.has("object")) {
    event.object = line.number("object", 0, UINT64_MAX, 16);
  }
  if (line.has("number")) {
    event.number = static_cast<std::uint32_t>(line.number("number", 0, 0xffffffff));
  }
  event.loss = line.loss();
  event.synthesized = line.has("synthesized") && line.text("synthesized") == "true";
  return event;
}

RecordedChange read_change(const LineReader& line) {
  RecordedChange change;
  change.time = line.time();
  change.device = line.text("device");
  const std::string what = line.text("change");
  if (what != "added" && what != "removed") {
    line.fail("\"change\" is not added or removed: '" + what + "'");
  }
  change.added = what == "added";
  change.node = line.text("node");
  change.loss = line.loss();
  return change;
}

}  // namespace

std::vector<RecordedLine> read_recording(std::istream& in, const std::string& name) {
  std::vector<RecordedLine> lines;
  std::string text;
  for (int number = 1; std::getline(in, text); ++number) {
    const std::string where = name + ":" + std::to_string(number);
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    ptree tree;
    try {
      std::istringstream line(text);
      boost::property_tree::read_json(line, tree);
    } catch (const boost::property_tree::json_parser_error& e) {
      throw std::invalid_argument(where + ": not a JSON object: " + e.message());
    }
    const LineReader line(tree, where);
    if (line.has("recording")) {
      const unsigned long long version = line.number("version", 1, 0x7fffffff);
      if (version > static_cast<unsigned long long>(kRecordingVersion)) {
        line.fail("a recording of version " + std::to_string(version) +
                  "; this ibev reads version " + std::to_string(kRecordingVersion));
      }
    } else if (line.has("count")) {
      continue;  // ibev-watch --count's totals at exit
    } else if (line.has("change")) {
      lines.emplace_back(read_change(line));
    } else if (line.has("code")) {
      lines.emplace_back(read_event(line));
    } else {
      line.fail("neither an event (\"code\") nor a device change (\"change\")");
    }
  }
  return lines;
}

}  // namespace ibev
