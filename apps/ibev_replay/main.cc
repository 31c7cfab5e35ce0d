// ibev-replay: what a replay of a recording (ibev-watch --json), or of a
// fault schedule, would deliver; and, as root on a soft-RoCE host, a fault
// schedule done for real.
//
//   ibev-replay [-x SPEED] FILE                 (ibev-replay --help; man ibev-replay)
//   ibev-replay --schedule [--real] [-x SPEED] FILE
//
// Printing reads the file with the library's own readers (core/recording.h,
// core/fault_schedule.h), so a file it prints is one ibev::Replay plays; a
// malformed one is refused with its line. --real runs the soft-RoCE
// harness's commands (ip link, ip addr, rdma link) at each fault's time.
#include <getopt.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
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

#include <ibev/core/fault_schedule.h>
#include <ibev/core/recording.h>
#include <ibev/version.h>

extern char** environ;

namespace {

constexpr int kUsageError = 1;  // also a malformed file
constexpr int kActionFailed = 2;

constexpr char kUsage[] =
    "usage: ibev-replay [-x SPEED] FILE\n"
    "       ibev-replay --schedule [--real] [-x SPEED] FILE\n"
    "  FILE               a recording (ibev-watch --json), or with --schedule a fault\n"
    "                     schedule; - reads stdin\n"
    "  -s, --schedule     FILE is a fault schedule: print the events it injects\n"
    "  -r, --real         with --schedule: do each fault for real at its time, on\n"
    "                     this host's soft-RoCE devices (root; ip, rdma)\n"
    "  -x, --speed=SPEED  divide the recorded gaps by SPEED (default 1; 0: no gaps)\n"
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
    "netdev); docs/operations.md has the format.\n"
    "\n"
    "Exit status:\n"
    "  0  done\n"
    "  1  a usage error, or a file that is not a recording or a schedule (the\n"
    "     message names the line)\n"
    "  2  with --real: a command that failed (the message names it)\n";

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
        if (*optarg == '\0' || *end != '\0' || errno != 0 || !(options.speed >= 0) ||
            std::isinf(options.speed)) {
          usage_error(std::string("--speed '") + optarg + "' is not a number from 0 up");
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
    char address[32];
    std::snprintf(address, sizeof address, "0x%llx",
                  static_cast<unsigned long long>(*event.object));
    where = std::string(ibev::to_string(event.kind)) + " " + address;
  } else {
    where = "device";
  }
  return event.device + " " + where + " " + ibev::enumerator_name(event.code);
}

// "+1.500000": seconds from `first`, divided by `speed` (0: none).
std::string offset(ibev::RecordingClock::time_point time, ibev::RecordingClock::time_point first,
                   double speed) {
  const double seconds =
      speed > 0 ? std::chrono::duration<double>(time - first).count() / speed : 0.0;
  char text[32];
  std::snprintf(text, sizeof text, "+%.6f", seconds);
  return text;
}

// --- --real ---

// Runs argv[0] from PATH; its exit status, or -1 when it could not start.
int run(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawnp(&pid, args[0], nullptr, nullptr, args.data(), environ) != 0) return -1;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The netdev under a soft-RoCE device's port, as rxe's GID table names it.
std::optional<std::string> netdev_of(const std::string& device, std::uint32_t port) {
  std::ifstream in("/sys/class/infiniband/" + device + "/ports/" + std::to_string(port) +
                   "/gid_attrs/ndevs/0");
  std::string name;
  if (!(in >> name)) return std::nullopt;
  return name;
}

// The commands that do `fault`, or a reason they cannot.
std::vector<std::string> command_for(const ibev::Fault& fault, std::string& why) {
  switch (fault.kind) {
    case ibev::Fault::Kind::kPortDown:
    case ibev::Fault::Kind::kPortUp:
    case ibev::Fault::Kind::kGidChange: {
      const auto netdev = netdev_of(fault.device, fault.number);
      if (!netdev) {
        why = "no netdev under " + fault.device + " port " + std::to_string(fault.number) +
              " (not a soft-RoCE device here?)";
        return {};
      }
      if (fault.kind == ibev::Fault::Kind::kGidChange) {
        // An address of its own per line: each adds a GID.
        return {"ip",  "-6",    "addr", "add", "fd00:ffff::" + std::to_string(fault.line) + "/128",
                "dev", *netdev, "nodad"};
      }
      return {"ip", "link", "set", *netdev,
              fault.kind == ibev::Fault::Kind::kPortDown ? "down" : "up"};
    }
    case ibev::Fault::Kind::kRemove:
      return {"rdma", "link", "delete", fault.device};
    case ibev::Fault::Kind::kAdd:
      return {"rdma", "link", "add", fault.device, "type", "rxe", "netdev", fault.netdev};
    case ibev::Fault::Kind::kQpFatal:
      why = "qp-fatal has no real action (inject it: ibev::Replay)";
      return {};
  }
  return {};
}

int do_for_real(const std::vector<ibev::Fault>& faults, const std::string& name, double speed) {
  if (geteuid() != 0) {
    std::fprintf(stderr, "ibev-replay: --real needs root (it runs ip and rdma)\n");
    return kUsageError;
  }
  for (const auto& fault : faults) {
    if (fault.kind == ibev::Fault::Kind::kQpFatal) {
      std::fprintf(stderr,
                   "ibev-replay: %s:%d: qp-fatal has no real action (inject it: "
                   "ibev::Replay)\n",
                   name.c_str(), fault.line);
      return kUsageError;
    }
  }
  const auto started = std::chrono::steady_clock::now();
  for (const auto& fault : faults) {
    if (speed > 0) {
      std::this_thread::sleep_until(
          started + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                        std::chrono::duration<double, std::micro>(fault.at.count() / speed)));
    }
    std::string why;
    const std::vector<std::string> command = command_for(fault, why);
    std::string text;
    for (const auto& word : command) text += (text.empty() ? "" : " ") + word;
    if (command.empty()) {
      std::fprintf(stderr, "ibev-replay: %s:%d: %s\n", name.c_str(), fault.line, why.c_str());
      return kActionFailed;
    }
    const int status = run(command);
    if (status != 0) {
      std::fprintf(stderr, "ibev-replay: %s:%d: '%s' %s %d\n", name.c_str(), fault.line,
                   text.c_str(), status < 0 ? "did not run:" : "exited", status);
      return kActionFailed;
    }
    std::printf("+%.6f %s %s: %s\n", std::chrono::duration<double>(fault.at).count(),
                fault.device.c_str(), std::string(ibev::to_string(fault.kind)).c_str(),
                text.c_str());
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
  try {
    if (options.schedule) {
      const std::vector<ibev::Fault> faults = ibev::read_fault_schedule(in, options.file);
      if (options.real) return do_for_real(faults, options.file, options.speed);
      const auto start = ibev::RecordingClock::time_point{};
      for (const auto& line : ibev::to_recording(faults, start)) {
        const auto time = std::visit([](const auto& l) { return l.time; }, line);
        std::printf("%s %s\n", offset(time, start, options.speed).c_str(), describe(line).c_str());
      }
      return 0;
    }
    const std::vector<ibev::RecordedLine> lines = ibev::read_recording(in, options.file);
    std::optional<ibev::RecordingClock::time_point> first;
    for (const auto& line : lines) {
      const auto time = std::visit([](const auto& l) { return l.time; }, line);
      if (!first) first = time;
      std::printf("%s %s\n", offset(time, *first, options.speed).c_str(), describe(line).c_str());
    }
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "ibev-replay: %s\n", e.what());
    return kUsageError;
  }
  return 0;
}
