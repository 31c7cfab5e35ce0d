// ibev-replay: what a replay of a recording (ibev-watch --json), or of a
// fault schedule, would deliver; and, as root on a soft-RoCE host, a fault
// schedule done for real.
//
//   ibev-replay [-x SPEED] FILE                 (ibev-replay --help; man ibev-replay)
//   ibev-replay --schedule [--real] [-x SPEED] FILE
//
// Printing reads the file with the library's own readers (formats/recording.h,
// formats/fault_schedule.h), so a file it prints is one ibev::Replay plays; a
// malformed one is refused with its line. --real runs the soft-RoCE
// harness's commands (ip link, ip addr, rdma link, tc qdisc) at each fault's
// time.
#include <getopt.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include <ibev/formats/fault_schedule.h>
#include <ibev/formats/recording.h>
#include <ibev/version.h>

#include "apps/ibev_replay/real_faults.h"

namespace {

constexpr int kUsageError = 1;  // also a malformed file; real_faults::Outcome::kRefused

constexpr char kUsage[] =
    "usage: ibev-replay [-x SPEED] FILE\n"
    "       ibev-replay --schedule [--real] [-x SPEED] FILE\n"
    "  FILE               a recording (ibev-watch --json), or with --schedule a fault\n"
    "                     schedule; - reads stdin\n"
    "  -s, --schedule     FILE is a fault schedule: print the events it injects\n"
    "  -r, --real         with --schedule: do each fault for real at its time, on\n"
    "                     this host's soft-RoCE devices (root; ip, rdma, tc)\n"
    "  -x, --speed=SPEED  divide the recorded gaps by SPEED (default 1; 0: no gaps;\n"
    "                     else from 1e-6 to 1e6)\n"
    "  -V, --version      print the version and exit\n"
    "  -h, --help         print this help and exit\n";

constexpr char kHelp[] =
    "\n"
    "Prints what ibev::Replay would deliver, one line per event or device\n"
    "change, with its time from the first (scaled by SPEED):\n"
    "  +1.500000 rxe0 port 1 IBV_EVENT_PORT_ACTIVE\n"
    "  +3.000000 rxe0 device removed\n"
    "A fault schedule is TIME FAULT DEVICE [ARGUMENT] per line: port-down,\n"
    "port-up, gid-change (a port), qp-fatal (a QP number), remove, add (a\n"
    "netdev), netem (loss=N%, delay=TIME, reorder=N%: on the netdev's packets,\n"
    "no event), netem-off, listener-close and listener-open (the program's CM\n"
    "listener on the device), peer-kill and peer-start (the program's peer\n"
    "process on the device, SIGKILLed and started again): no event, the program\n"
    "does them; docs/operations.md has the format.\n"
    "\n"
    "Times are from the first line for a recording, from 0 for a schedule, as\n"
    "ibev::Replay plays them.\n"
    "\n"
    "Exit status:\n"
    "  0  done\n"
    "  1  a usage error, a file that cannot be read or is not a recording or a\n"
    "     schedule (the message names the line); --real with a qp-fatal, a\n"
    "     listener-close, listener-open, peer-kill or peer-start, or not as\n"
    "     root\n"
    "  2  with --real: a device that is not soft-RoCE, or a command that\n"
    "     failed (the message names it)\n";

[[noreturn]] void usage_error(const std::string& reason) {
  if (!reason.empty()) std::fprintf(stderr, "ibev-replay: %s\n", reason.c_str());
  std::fputs(kUsage, stderr);
  std::exit(kUsageError);
}

struct Options {
  bool schedule = false;
  bool real = false;
  double speed = 1.0;
  std::string file;
};

Options parse(int argc, char** argv) {
  static const option kLong[] = {
      {"schedule", no_argument, nullptr, 's'},    {"real", no_argument, nullptr, 'r'},
      {"speed", required_argument, nullptr, 'x'}, {"version", no_argument, nullptr, 'V'},
      {"help", no_argument, nullptr, 'h'},        {nullptr, 0, nullptr, 0},
  };
  Options options;
  for (int opt; (opt = getopt_long(argc, argv, "srx:Vh", kLong, nullptr)) != -1;) {
    switch (opt) {
      case 's':
        options.schedule = true;
        break;
      case 'r':
        options.real = true;
        break;
      case 'x': {
        char* end = nullptr;
        errno = 0;
        options.speed = std::strtod(optarg, &end);
        try {
          if (*optarg == '\0' || *end != '\0' || errno != 0) throw std::invalid_argument("");
          ibev::replay_delay({}, options.speed);  // the library's range
        } catch (const std::invalid_argument&) {
          usage_error(std::string("--speed '") + optarg + "' is not 0 nor from 1e-6 to 1e6");
        }
        break;
      }
      case 'V':
        std::printf("ibev-replay (ibev) %s\n", IBEV_VERSION_STRING);
        std::exit(0);
      case 'h':
        std::printf("%s%s", kUsage, kHelp);
        std::exit(0);
      default:
        usage_error("");
    }
  }
  if (optind != argc - 1) usage_error(optind == argc ? "no FILE" : "one FILE only");
  options.file = argv[optind];
  if (options.real && !options.schedule) usage_error("--real goes with --schedule");
  return options;
}

std::string describe(const ibev::RecordedLine& line) {
  if (const auto* change = std::get_if<ibev::RecordedChange>(&line)) {
    return change->device + " device " + (change->added ? "added" : "removed");
  }
  const auto& event = std::get<ibev::RecordedEvent>(line);
  std::string where;
  if (event.port) {
    where = "port " + std::to_string(*event.port);
  } else if (event.number) {
    where = std::string(ibev::to_string(event.kind)) + " #" + std::to_string(*event.number);
  } else if (event.object) {
    where = std::string(ibev::to_string(event.kind)) + " " +
            ibev::object_address(reinterpret_cast<const void*>(*event.object));
  } else {
    where = "device";
  }
  return event.device + " " + where + " " + ibev::enumerator_name(event.code);
}

// "+1.500000": when a replay at `speed` injects what was recorded at `time`.
std::string offset(ibev::RecordingClock::time_point time, ibev::RecordingClock::time_point origin,
                   double speed) {
  char text[32];
  std::snprintf(text, sizeof text, "+%.6f",
                std::chrono::duration<double>(ibev::replay_delay(time - origin, speed)).count());
  return text;
}

int do_for_real(const std::vector<ibev::Fault>& faults, const std::string& name, double speed) {
  // Everything the file says is checked before anything is done.
  const ibev::real_faults::Outcome checked = ibev::real_faults::check(faults, name);
  if (checked.status != 0) {
    std::fprintf(stderr, "ibev-replay: %s\n", checked.message.c_str());
    return checked.status;
  }
  const auto started = std::chrono::steady_clock::now();
  for (const auto& fault : faults) {
    std::this_thread::sleep_until(started + ibev::replay_delay(fault.at, speed));
    const ibev::real_faults::Outcome done = ibev::real_faults::apply(fault, name);
    if (done.status != 0) {
      std::fprintf(stderr, "ibev-replay: %s\n", done.message.c_str());
      return done.status;
    }
    std::printf(
        "%s %s %s: %s\n", offset(ibev::RecordingClock::time_point(fault.at), {}, speed).c_str(),
        fault.device.c_str(), std::string(ibev::to_string(fault.kind)).c_str(),
        done.command.c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  std::ifstream file;
  if (options.file != "-") {
    file.open(options.file);
    if (!file) {
      std::fprintf(stderr, "ibev-replay: cannot open %s: %s\n", options.file.c_str(),
                   std::strerror(errno));
      return kUsageError;
    }
  }
  std::istream& in = options.file == "-" ? std::cin : file;
  const std::string name = options.file == "-" ? "stdin" : options.file;
  try {
    if (options.schedule) {
      const std::vector<ibev::Fault> faults = ibev::read_fault_schedule(in, name);
      if (options.real) return do_for_real(faults, name, options.speed);
      const auto start = ibev::RecordingClock::time_point{};
      for (const auto& line : ibev::to_recording(faults, start)) {
        const auto time = ibev::time_of(line);
        std::printf("%s %s\n", offset(time, start, options.speed).c_str(), describe(line).c_str());
      }
      return 0;
    }
    const std::vector<ibev::RecordedLine> lines = ibev::read_recording(in, name);
    std::optional<ibev::RecordingClock::time_point> first;
    for (const auto& line : lines) {
      const auto time = ibev::time_of(line);
      if (!first) first = time;
      std::printf("%s %s\n", offset(time, *first, options.speed).c_str(), describe(line).c_str());
    }
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "ibev-replay: %s\n", e.what());
    return kUsageError;
  }
  return 0;
}
