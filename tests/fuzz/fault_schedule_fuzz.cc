// libFuzzer target: read_fault_schedule() (formats/fault_schedule.h) over any
// bytes. Bad input must end in the std::invalid_argument it documents; a
// schedule it accepts must keep the header's promises (time order, ports
// 1..255, QP numbers of 24 bits, an argument where one is due, a netem's
// keys within netem's bounds), write_fault_schedule() must write it as it
// reads back, and the recording to_recording() makes of it (nothing for a
// netem, a listener's close or open or a peer's kill or start) must survive
// the recording writer and reader (recording_check.h).
// tools/fuzz.sh builds and runs it.
#include <cstddef>
#include <chrono>
#include <cstdint>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <ibev/formats/fault_schedule.h>

#include "tests/fuzz/recording_check.h"

using ibev::Fault;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  std::vector<Fault> faults;
  try {
    faults = ibev::read_fault_schedule(in, "fuzz");
  } catch (const std::invalid_argument&) {
    return 0;
  }
  std::size_t removes = 0;
  std::size_t silent = 0;  // faults that raise no event: netem, listener, peer
  for (std::size_t i = 0; i < faults.size(); ++i) {
    const Fault& fault = faults[i];
    const std::string where =
        "fault " + std::to_string(i) + " (line " + std::to_string(fault.line) + ")";
    if (fault.at.count() < 0 || (i > 0 && fault.at < faults[i - 1].at)) {
      ibev::fuzz::broken(where + ": a time below 0 or going back");
    }
    if (fault.device.empty()) ibev::fuzz::broken(where + ": no device");
    switch (fault.kind) {
      case Fault::Kind::kPortDown:
      case Fault::Kind::kPortUp:
      case Fault::Kind::kGidChange:
        if (fault.number < 1 || fault.number > 255)
          ibev::fuzz::broken(where + ": a port outside 1..255");
        break;
      case Fault::Kind::kQpFatal:
        if (fault.number > 0xffffff) ibev::fuzz::broken(where + ": a QP number above 24 bits");
        break;
      case Fault::Kind::kAdd:
        if (fault.netdev.empty()) ibev::fuzz::broken(where + ": add without a netdev");
        break;
      case Fault::Kind::kRemove:
        ++removes;
        break;
      case Fault::Kind::kNetem: {
        const ibev::NetemSpec& netem = fault.netem;
        const auto percent = [](const std::optional<double>& p) {
          return !p || (*p >= 0 && *p <= 100);
        };
        if (!netem.loss && !netem.delay && !netem.reorder) {
          ibev::fuzz::broken(where + ": a netem of nothing");
        }
        if (!percent(netem.loss) || !percent(netem.reorder)) {
          ibev::fuzz::broken(where + ": a netem's percentage outside 0..100");
        }
        if (netem.delay && (netem.delay->count() < 0 || *netem.delay > std::chrono::seconds(10))) {
          ibev::fuzz::broken(where + ": a netem's delay outside 0..10 s");
        }
        if (netem.reorder && !(netem.delay && netem.delay->count() > 0)) {
          ibev::fuzz::broken(where + ": a netem's reorder with no delay");
        }
        ++silent;
        break;
      }
      case Fault::Kind::kNetemOff:
      case Fault::Kind::kListenerClose:
      case Fault::Kind::kListenerOpen:
      case Fault::Kind::kPeerKill:
      case Fault::Kind::kPeerStart:
        if (fault.number != 0 || !fault.netdev.empty()) {
          ibev::fuzz::broken(where + ": an argument on a fault that takes DEVICE only");
        }
        ++silent;
        break;
    }
  }
  // The writer writes what the reader read, and reads back the same.
  std::ostringstream written;
  try {
    ibev::write_fault_schedule(written, faults);
  } catch (const std::invalid_argument& e) {
    ibev::fuzz::broken(std::string("write_fault_schedule refused what was read: ") + e.what());
  }
  std::istringstream again(written.str());
  std::vector<Fault> back;
  try {
    back = ibev::read_fault_schedule(again, "written");
  } catch (const std::invalid_argument& e) {
    ibev::fuzz::broken(std::string("what write_fault_schedule wrote does not read: ") + e.what());
  }
  if (back.size() != faults.size()) ibev::fuzz::broken("written and read back, a fault lost");
  for (std::size_t i = 0; i < back.size(); ++i) {
    const Fault& a = faults[i];
    const Fault& b = back[i];
    if (a.at != b.at || a.kind != b.kind || a.device != b.device || a.number != b.number ||
        a.netdev != b.netdev || a.netem != b.netem) {
      ibev::fuzz::broken("fault " + std::to_string(i) + " written and read back is another");
    }
  }
  const std::vector<ibev::RecordedLine> lines =
      ibev::to_recording(faults, ibev::RecordingClock::time_point{});
  if (lines.size() != faults.size() + removes - silent) {
    ibev::fuzz::broken("to_recording made " + std::to_string(lines.size()) + " lines of " +
                       std::to_string(faults.size()) + " faults");
  }
  for (std::size_t i = 1; i < lines.size(); ++i) {
    if (ibev::time_of(lines[i]) < ibev::time_of(lines[i - 1])) {
      ibev::fuzz::broken("to_recording's lines go back in time");
    }
  }
  ibev::fuzz::check_round_trip(lines);
  return 0;
}
