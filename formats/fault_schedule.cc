// The fault-injection schedule (formats/fault_schedule.h).
#include <ibev/formats/fault_schedule.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

namespace ibev {
namespace {

constexpr Fault::Kind kKinds[] = {
    Fault::Kind::kPortDown,     Fault::Kind::kPortUp,   Fault::Kind::kGidChange,
    Fault::Kind::kQpFatal,      Fault::Kind::kRemove,   Fault::Kind::kAdd,
    Fault::Kind::kNetem,        Fault::Kind::kNetemOff, Fault::Kind::kListenerClose,
    Fault::Kind::kListenerOpen, Fault::Kind::kPeerKill, Fault::Kind::kPeerStart};

// A fault that takes its DEVICE and nothing else.
bool device_only(Fault::Kind kind) {
  return kind == Fault::Kind::kRemove || kind == Fault::Kind::kNetemOff ||
         kind == Fault::Kind::kListenerClose || kind == Fault::Kind::kListenerOpen ||
         kind == Fault::Kind::kPeerKill || kind == Fault::Kind::kPeerStart;
}

constexpr double kLongest = 366 * 86400.0;  // seconds: a schedule's span
constexpr double kLongestDelay = 10.0;      // seconds: a netem's delay
constexpr char kNetemKeys[] = "loss=N%, delay=TIME or reorder=N%";

[[noreturn]] void fail(const std::string& where, const std::string& why) {
  throw std::invalid_argument(where + ": " + why);
}

// A time, or (`what` "the delay") a netem's delay, up to `longest` seconds.
std::chrono::microseconds parse_time(const std::string& text, const std::string& where,
                                     const char* what = "the time", double longest = kLongest) {
  const bool millis = text.size() > 2 && text.compare(text.size() - 2, 2, "ms") == 0;
  const bool seconds = !millis && text.size() > 1 && text.back() == 's';
  const std::string number = text.substr(0, text.size() - (millis ? 2 : seconds ? 1 : 0));
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(number.c_str(), &end);
  if ((!millis && !seconds) || number.empty() || *end != '\0' || errno != 0 || !(value >= 0) ||
      value * (millis ? 1e-3 : 1) > longest ||
      number.find_first_not_of("0123456789.") != std::string::npos) {
    fail(where, std::string(what) + " '" + text + "' is not N[.N]s or N[.N]ms, up to " +
                    (longest == kLongest ? "a year" : "10 s"));
  }
  return std::chrono::microseconds(std::llround(value * (millis ? 1e3 : 1e6)));
}

std::uint32_t parse_number(const std::string& text, std::uint64_t low, std::uint64_t high,
                           const std::string& what, const std::string& where) {
  const std::optional<std::uint64_t> value = parse_whole_number(text, high);
  if (!value || *value < low) {
    fail(where, what + " '" + text + "' is not a number from " + std::to_string(low) + " to " +
                    std::to_string(high));
  }
  return static_cast<std::uint32_t>(*value);
}

// "20%", "0.5%": N[.N]% from 0 to 100, read as from_chars reads it
// (whatever the locale), so that the writer's to_chars text reads back the
// same double.
double parse_percent(const std::string& text, const char* what, const std::string& where) {
  const std::size_t digits = text.size() - 1;
  double value = -1;
  if (text.size() < 2 || text.back() != '%' ||
      text.find_first_not_of("0123456789.") != digits ||
      std::from_chars(text.data(), text.data() + digits, value, std::chars_format::fixed).ptr !=
          text.data() + digits ||
      !(value >= 0 && value <= 100)) {
    fail(where, std::string("the ") + what + " '" + text + "' is not N[.N]% from 0 to 100");
  }
  return value;
}

// netem's own rule (tc refuses it): packets are reordered by sending some
// at once, ahead of the delayed rest, so there must be a delay.
bool reorder_without_delay(const NetemSpec& netem) {
  return netem.reorder && (!netem.delay || netem.delay->count() <= 0);
}

// A netem's KEY=VALUE words, each key once, at least one.
NetemSpec parse_netem(const std::vector<std::string>& words, const std::string& where) {
  NetemSpec netem;
  if (words.empty()) fail(where, std::string("netem takes DEVICE and ") + kNetemKeys);
  for (const std::string& word : words) {
    const std::size_t equals = word.find('=');
    const std::string key = word.substr(0, equals);
    const std::string value = equals == std::string::npos ? "" : word.substr(equals + 1);
    const bool known = equals != std::string::npos &&
                       (key == "loss" || key == "delay" || key == "reorder");
    if (!known) fail(where, "netem's '" + word + "' is not " + kNetemKeys);
    if (key == "loss" ? netem.loss.has_value()
        : key == "delay" ? netem.delay.has_value()
                         : netem.reorder.has_value()) {
      fail(where, "netem's " + key + " is given twice");
    }
    if (key == "loss") {
      netem.loss = parse_percent(value, "loss", where);
    } else if (key == "delay") {
      netem.delay = parse_time(value, where, "the delay", kLongestDelay);
    } else {
      netem.reorder = parse_percent(value, "reorder", where);
    }
  }
  if (reorder_without_delay(netem)) {
    fail(where, "netem's reorder needs a delay above 0 (it sends some packets ahead of the "
                "delayed rest)");
  }
  return netem;
}

// Device and netdev names as the kernel makes them: printable ASCII. Other
// bytes would make a recording (to_recording) its reader refuses: JSON
// wants UTF-8, and the writer passes bytes through.
const std::string& name_of(const std::string& text, const char* what, const std::string& where) {
  for (const char c : text) {
    if (c < 0x21 || c > 0x7e) {
      fail(where, std::string("the ") + what + " '" + text + "' is not a name of printable ASCII");
    }
  }
  return text;
}

// What the reader takes as one name: not empty, printable ASCII (so no
// space), no comment.
bool one_word(const std::string& word) {
  if (word.empty()) return false;
  for (const char c : word) {
    if (c < 0x21 || c > 0x7e || c == '#') return false;
  }
  return true;
}

// "2500ms", "1.5ms", "0.001ms": milliseconds, to the microsecond, which
// parse_time turns back into the same count (llround of N.NNN * 1e3).
std::string time_text(std::chrono::microseconds at) {
  const long long us = at.count();
  std::string text = std::to_string(us / 1000);
  if (us % 1000 != 0) {
    char fraction[8];
    std::snprintf(fraction, sizeof fraction, "%03lld", us % 1000);
    std::string digits(fraction);
    digits.erase(digits.find_last_not_of('0') + 1);
    text += "." + digits;
  }
  return text + "ms";
}

// -0 is refused: it would be written "-0%", which the reader refuses.
bool percent(const std::optional<double>& value) {
  return !value || (*value >= 0 && *value <= 100 && !std::signbit(*value));
}

}  // namespace

std::string netem_percent_text(double value) {
  char text[400];  // the longest: a subnormal's 330-odd fixed digits
  const auto end = std::to_chars(text, text + sizeof text, value, std::chars_format::fixed).ptr;
  return std::string(text, end) + "%";
}

bool operator==(const NetemSpec& a, const NetemSpec& b) noexcept {
  return a.loss == b.loss && a.delay == b.delay && a.reorder == b.reorder;
}

std::string_view to_string(Fault::Kind kind) noexcept {
  switch (kind) {
    case Fault::Kind::kPortDown:
      return "port-down";
    case Fault::Kind::kPortUp:
      return "port-up";
    case Fault::Kind::kGidChange:
      return "gid-change";
    case Fault::Kind::kQpFatal:
      return "qp-fatal";
    case Fault::Kind::kRemove:
      return "remove";
    case Fault::Kind::kAdd:
      return "add";
    case Fault::Kind::kNetem:
      return "netem";
    case Fault::Kind::kNetemOff:
      return "netem-off";
    case Fault::Kind::kListenerClose:
      return "listener-close";
    case Fault::Kind::kListenerOpen:
      return "listener-open";
    case Fault::Kind::kPeerKill:
      return "peer-kill";
    case Fault::Kind::kPeerStart:
      return "peer-start";
  }
  return "invalid";
}

std::vector<Fault> read_fault_schedule(std::istream& in, const std::string& name) {
  std::vector<Fault> faults;
  std::string text;
  for (int number = 1; std::getline(in, text); ++number) {
    const std::string where = name + ":" + std::to_string(number);
    std::istringstream words(text.substr(0, text.find('#')));
    std::vector<std::string> fields;
    for (std::string word; words >> word;) fields.push_back(word);
    if (fields.empty()) continue;
    if (fields.size() < 3) fail(where, "expected: TIME FAULT DEVICE [ARGUMENT]");
    Fault fault;
    fault.line = number;
    fault.at = parse_time(fields[0], where);
    if (!faults.empty() && fault.at < faults.back().at) {
      fail(where, "the time " + fields[0] + " goes back: the schedule is in time order");
    }
    bool known = false;
    for (const Fault::Kind kind : kKinds) {
      if (fields[1] == to_string(kind)) {
        fault.kind = kind;
        known = true;
      }
    }
    if (!known) {
      fail(where, "unknown fault '" + fields[1] +
                      "' (port-down, port-up, gid-change, qp-fatal, remove, add, netem, "
                      "netem-off, listener-close, listener-open, peer-kill, peer-start)");
    }
    fault.device = name_of(fields[2], "device", where);
    if (fault.kind == Fault::Kind::kNetem) {
      fault.netem = parse_netem({fields.begin() + 3, fields.end()}, where);
      faults.push_back(std::move(fault));
      continue;
    }
    const bool takes_argument = !device_only(fault.kind);
    if (fields.size() != (takes_argument ? 4u : 3u)) {
      fail(where, std::string(to_string(fault.kind)) +
                      (takes_argument ? " takes DEVICE and " : " takes DEVICE only") +
                      (fault.kind == Fault::Kind::kQpFatal ? "a QP number"
                       : fault.kind == Fault::Kind::kAdd   ? "a netdev"
                       : takes_argument                    ? "a port"
                                                           : ""));
    }
    switch (fault.kind) {
      case Fault::Kind::kQpFatal:
        fault.number = parse_number(fields[3], 0, 0xffffff, "the QP number", where);
        break;
      case Fault::Kind::kAdd:
        fault.netdev = name_of(fields[3], "netdev", where);
        break;
      case Fault::Kind::kRemove:
      case Fault::Kind::kNetemOff:
      case Fault::Kind::kListenerClose:
      case Fault::Kind::kListenerOpen:
      case Fault::Kind::kPeerKill:
      case Fault::Kind::kPeerStart:
        break;
      default:
        fault.number = parse_number(fields[3], 1, 255, "the port", where);
    }
    faults.push_back(std::move(fault));
  }
  if (in.bad()) throw std::invalid_argument(name + ": a read failed");
  return faults;
}

void write_fault_schedule(std::ostream& out, const std::vector<Fault>& faults) {
  std::string text;
  std::chrono::microseconds last{0};
  for (std::size_t i = 0; i < faults.size(); ++i) {
    const Fault& fault = faults[i];
    const std::string where = "fault " + std::to_string(i + 1);
    if (fault.at < last || fault.at.count() > std::llround(kLongest * 1e6)) {
      fail(where, "its time goes back or is past a year");
    }
    last = fault.at;
    if (!one_word(fault.device)) fail(where, "the device '" + fault.device + "' is not one word");
    text += time_text(fault.at) + " " + std::string(to_string(fault.kind)) + " " + fault.device;
    switch (fault.kind) {
      case Fault::Kind::kQpFatal: {
        if (fault.number > 0xffffff) fail(where, "the QP number is past 24 bits");
        char number[16];
        std::snprintf(number, sizeof number, " 0x%x", static_cast<unsigned>(fault.number));
        text += number;
        break;
      }
      case Fault::Kind::kAdd:
        if (!one_word(fault.netdev)) fail(where, "the netdev '" + fault.netdev + "' is not one word");
        text += " " + fault.netdev;
        break;
      case Fault::Kind::kNetem: {
        const NetemSpec& netem = fault.netem;
        if (!netem.loss && !netem.delay && !netem.reorder) fail(where, "a netem of nothing");
        if (!percent(netem.loss) || !percent(netem.reorder)) {
          fail(where, "a netem's percentage is not from 0 to 100");
        }
        if (netem.delay && (netem.delay->count() < 0 ||
                            netem.delay->count() > std::llround(kLongestDelay * 1e6))) {
          fail(where, "a netem's delay is below 0 or past 10 s");
        }
        if (reorder_without_delay(netem)) fail(where, "a netem's reorder has no delay above 0");
        if (netem.loss) text += " loss=" + netem_percent_text(*netem.loss);
        if (netem.delay) text += " delay=" + time_text(*netem.delay);
        if (netem.reorder) text += " reorder=" + netem_percent_text(*netem.reorder);
        break;
      }
      case Fault::Kind::kRemove:
      case Fault::Kind::kNetemOff:
      case Fault::Kind::kListenerClose:
      case Fault::Kind::kListenerOpen:
      case Fault::Kind::kPeerKill:
      case Fault::Kind::kPeerStart:
        break;
      default:
        if (fault.number < 1 || fault.number > 255) fail(where, "the port is not from 1 to 255");
        text += " " + std::to_string(fault.number);
    }
    text += "\n";
  }
  out << text;
}

std::vector<RecordedLine> to_recording(const std::vector<Fault>& faults,
                                       RecordingClock::time_point start) {
  std::vector<RecordedLine> lines;
  for (const Fault& fault : faults) {
    const auto time = start + fault.at;
    RecordedEvent event;
    event.time = time;
    event.device = fault.device;
    event.synthesized = true;
    switch (fault.kind) {
      case Fault::Kind::kPortDown:
      case Fault::Kind::kPortUp:
      case Fault::Kind::kGidChange:
        event.code = fault.kind == Fault::Kind::kPortDown ? IBV_EVENT_PORT_ERR
                     : fault.kind == Fault::Kind::kPortUp ? IBV_EVENT_PORT_ACTIVE
                                                          : IBV_EVENT_GID_CHANGE;
        event.kind = ElementKind::kPort;
        event.port = static_cast<int>(fault.number);
        break;
      case Fault::Kind::kQpFatal:
        event.code = IBV_EVENT_QP_FATAL;
        event.kind = ElementKind::kQp;
        event.number = fault.number;
        break;
      case Fault::Kind::kRemove:
        event.code = IBV_EVENT_DEVICE_FATAL;
        event.kind = ElementKind::kDevice;
        event.loss = DeviceLoss::kRemoved;
        lines.emplace_back(std::move(event));
        lines.emplace_back(RecordedChange{time, fault.device, "", false, DeviceLoss::kRemoved});
        continue;
      case Fault::Kind::kAdd:
        lines.emplace_back(RecordedChange{time, fault.device, "", true, DeviceLoss::kNone});
        continue;
      case Fault::Kind::kNetem:
      case Fault::Kind::kNetemOff:
        continue;  // no RDMA event: it shows in the traffic only
      case Fault::Kind::kListenerClose:
      case Fault::Kind::kListenerOpen:
        continue;  // no RDMA event: a program's listener, which it closes itself
      case Fault::Kind::kPeerKill:
      case Fault::Kind::kPeerStart:
        continue;  // no RDMA event here: a peer's process, which the program kills and starts
    }
    lines.emplace_back(std::move(event));
  }
  return lines;
}

}  // namespace ibev
