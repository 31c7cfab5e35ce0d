// The recording format (formats/recording.h): written and read in this one file.
#include <ibev/formats/recording.h>

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <sstream>
#include <stdexcept>

// Boost 1.74's JSON parser includes <boost/bind.hpp>, which warns (a #pragma
// message in every build) unless told the old global placeholders are wanted.
#define BOOST_BIND_GLOBAL_PLACEHOLDERS
#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>

namespace ibev {

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

std::string object_address(const void* object) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", object);
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
    out << ",\"object\":" << json_string(object_address(object));
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
  // Not "none", which the reader refuses: no key reads back as kNone.
  if (!added && loss != DeviceLoss::kNone) out << ",\"loss\":" << json_string(to_string(loss));
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
    const auto child = tree_.get_child_optional(key);
    if (!child) fail(std::string("no \"") + key + "\"");
    if (!child->empty()) fail(std::string("\"") + key + "\" is an object or an array");
    return child->data();
  }

  // A whole number within [low, high].
  std::uint64_t number(const char* key, std::uint64_t low, std::uint64_t high) const {
    const std::string value = text(key);
    const std::optional<std::uint64_t> n = parse_whole_number(value, high);
    if (!n || *n < low) {
      fail(std::string("\"") + key + "\" is not a number from " + std::to_string(low) + " to " +
           std::to_string(high) + ": '" + value + "'");
    }
    return *n;
  }

  // YYYY-MM-DDTHH:MM:SS[.F]Z, F of 1 to 9 digits, every field in its range.
  RecordingClock::time_point time() const {
    const std::string value = text("time");
    const auto digits = [&](std::size_t at, std::size_t count, int low, int high) {
      int n = 0;
      for (std::size_t i = at; i < at + count; ++i) {
        if (i >= value.size() || value[i] < '0' || value[i] > '9') return -1;
        n = n * 10 + (value[i] - '0');
      }
      return n < low || n > high ? -1 : n;
    };
    const auto bad = [&] {
      fail("\"time\" is not ISO 8601 UTC (2026-11-21T12:00:00.123456Z): '" + value + "'");
    };
    std::tm utc{};
    // Up to 2261: the clock's int64 nanoseconds end in 2262.
    utc.tm_year = digits(0, 4, 1970, 2261);
    utc.tm_mon = digits(5, 2, 1, 12);
    utc.tm_mday = digits(8, 2, 1, 31);
    utc.tm_hour = digits(11, 2, 0, 23);
    utc.tm_min = digits(14, 2, 0, 59);
    utc.tm_sec = digits(17, 2, 0, 59);
    if (value.size() < 20 || value[4] != '-' || value[7] != '-' || value[10] != 'T' ||
        value[13] != ':' || value[16] != ':' || utc.tm_year < 0 || utc.tm_mon < 0 ||
        utc.tm_mday < 0 || utc.tm_hour < 0 || utc.tm_min < 0 || utc.tm_sec < 0) {
      bad();
    }
    const bool leap = utc.tm_year % 4 == 0 && (utc.tm_year % 100 != 0 || utc.tm_year % 400 == 0);
    const int days[] = {31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (utc.tm_mday > days[utc.tm_mon - 1]) bad();
    std::chrono::nanoseconds fraction{0};
    std::size_t at = 19;
    if (value[at] == '.') {
      long long scale = 100000000;  // the first digit's nanoseconds
      for (++at; at < value.size() && value[at] >= '0' && value[at] <= '9'; ++at, scale /= 10) {
        if (scale == 0) bad();  // more than 9 digits
        fraction += std::chrono::nanoseconds((value[at] - '0') * scale);
      }
      if (at == 20) bad();  // a point with no digit
    }
    if (at != value.size() - 1 || value[at] != 'Z') bad();
    utc.tm_year -= 1900;
    utc.tm_mon -= 1;
    return RecordingClock::time_point(std::chrono::duration_cast<RecordingClock::duration>(
        std::chrono::seconds(timegm(&utc)) + fraction));
  }

  DeviceLoss loss() const {
    if (!has("loss")) return DeviceLoss::kNone;
    const std::string value = text("loss");
    for (const DeviceLoss loss : kDeviceLosses) {
      if (value == to_string(loss)) return loss;
    }
    fail("\"loss\" is not removed, fatal or async fd failed: '" + value + "'");
  }

  ElementKind scope() const {
    const std::string value = text("scope");
    std::string names;  // "cq, qp, srq, wq, port or device"
    for (std::size_t i = 0; i < kElementKinds.size(); ++i) {
      if (value == kElementKinds[i].name) return kElementKinds[i].kind;
      names += (i == 0 ? "" : i + 1 < kElementKinds.size() ? ", " : " or ");
      names += kElementKinds[i].name;
    }
    fail("\"scope\" is not " + names + ": '" + value + "'");
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
    event.object = line.number("object", 0, UINT64_MAX);
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

RecordingClock::time_point time_of(const RecordedLine& line) {
  return std::visit([](const auto& l) { return l.time; }, line);
}

std::vector<RecordedLine> read_recording(std::istream& in, const std::string& name) {
  std::vector<RecordedLine> lines;
  std::string text;
  bool seen_line = false;
  int last_line = 0;
  for (int number = 1; std::getline(in, text); ++number) {
    last_line = number;
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
    // By "code" or "change" first: a later version may add any other key.
    if (line.has("code")) {
      lines.emplace_back(read_event(line));
    } else if (line.has("change")) {
      lines.emplace_back(read_change(line));
    } else if (line.has("recording")) {
      if (line.text("recording") != "ibev") line.fail("a header of another format");
      const std::uint64_t version = line.number("version", 1, 0x7fffffff);
      if (version > static_cast<std::uint64_t>(kRecordingVersion)) {
        line.fail("a recording of version " + std::to_string(version) +
                  "; this ibev reads version " + std::to_string(kRecordingVersion));
      }
      if (seen_line) line.fail("a header after the first line (recordings put together?)");
    } else if (!line.has("count")) {  // ibev-watch --count's totals at exit
      line.fail("neither an event (\"code\") nor a device change (\"change\")");
    }
    seen_line = true;
  }
  if (in.bad())
    throw std::invalid_argument(name + ": a read failed after line " + std::to_string(last_line));
  return lines;
}

std::optional<std::uint64_t> parse_whole_number(std::string_view text, std::uint64_t high) {
  const bool hex = text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X');
  const std::string_view digits = hex ? text.substr(2) : text;
  if (digits.empty()) return std::nullopt;
  std::uint64_t value = 0;
  const auto [end, error] =
      std::from_chars(digits.data(), digits.data() + digits.size(), value, hex ? 16 : 10);
  if (error != std::errc() || end != digits.data() + digits.size() || value > high) {
    return std::nullopt;
  }
  return value;
}

std::chrono::nanoseconds replay_delay(RecordingClock::duration gap, double speed) {
  if (!(speed == 0 || (speed >= 1e-6 && speed <= 1e6))) {
    throw std::invalid_argument("replay speed " + std::to_string(speed) +
                                " is not 0 (no waits) nor from 1e-6 to 1e6");
  }
  if (speed == 0 || gap <= RecordingClock::duration::zero()) return std::chrono::nanoseconds(0);
  // At most a century, so that now() plus it cannot overflow a clock
  // (int64 nanoseconds hold 292 years).
  constexpr double kCentury = 100 * 365.25 * 86400 * 1e9;
  const double nanos = std::chrono::duration<double, std::nano>(gap).count() / speed;
  return std::chrono::nanoseconds(static_cast<std::int64_t>(nanos < kCentury ? nanos : kCentury));
}

}  // namespace ibev
