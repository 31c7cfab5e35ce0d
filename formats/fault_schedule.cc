// The fault-injection schedule (formats/fault_schedule.h).
#include <ibev/formats/fault_schedule.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

namespace ibev {
namespace {

constexpr Fault::Kind kKinds[] = {Fault::Kind::kPortDown,  Fault::Kind::kPortUp,
                                  Fault::Kind::kGidChange, Fault::Kind::kQpFatal,
                                  Fault::Kind::kRemove,    Fault::Kind::kAdd};

constexpr double kLongest = 366 * 86400.0;  // seconds: a schedule's span

[[noreturn]] void fail(const std::string& where, const std::string& why) {
  throw std::invalid_argument(where + ": " + why);
}

std::chrono::microseconds parse_time(const std::string& text, const std::string& where) {
  const bool millis = text.size() > 2 && text.compare(text.size() - 2, 2, "ms") == 0;
  const bool seconds = !millis && text.size() > 1 && text.back() == 's';
  const std::string number = text.substr(0, text.size() - (millis ? 2 : seconds ? 1 : 0));
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(number.c_str(), &end);
  if ((!millis && !seconds) || number.empty() || *end != '\0' || errno != 0 || !(value >= 0) ||
      value * (millis ? 1e-3 : 1) > kLongest ||
      number.find_first_not_of("0123456789.") != std::string::npos) {
    fail(where, "the time '" + text + "' is not N[.N]s or N[.N]ms, up to a year");
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

}  // namespace

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
                      "' (port-down, port-up, gid-change, qp-fatal, remove, add)");
    }
    fault.device = name_of(fields[2], "device", where);
    const bool takes_argument = fault.kind != Fault::Kind::kRemove;
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
      case Fault::Kind::kRemove:
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
    }
    lines.emplace_back(std::move(event));
  }
  return lines;
}

}  // namespace ibev
