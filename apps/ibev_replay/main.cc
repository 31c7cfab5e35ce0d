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
// harness's commands (ip link, ip addr, rdma link) at each fault's time.
#include <fcntl.h>
#include <getopt.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include <ibev/formats/fault_schedule.h>
#include <ibev/formats/recording.h>
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
    "netdev); docs/operations.md has the format.\n"
    "\n"
    "Times are from the first line for a recording, from 0 for a schedule, as\n"
    "ibev::Replay plays them.\n"
    "\n"
    "Exit status:\n"
    "  0  done\n"
    "  1  a usage error, a file that cannot be read or is not a recording or a\n"
    "     schedule (the message names the line); --real with a qp-fatal, or\n"
    "     not as root\n"
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

// --- --real ---

// iproute2's tools where Debian puts them, never from the caller's PATH or
// folder: this runs as root. Empty when none is there.
std::string tool(const std::string& name) {
  for (const char* dir : {"/usr/sbin/", "/usr/bin/", "/sbin/", "/bin/"}) {
    if (access((dir + name).c_str(), X_OK) == 0) return dir + name;
  }
  return {};
}

// Runs argv (argv[0] a path), with its stderr to /dev/null when `quiet`; its
// exit status, or -1 when it did not run or end normally.
int run(const std::vector<std::string>& argv, bool quiet) {
  std::vector<char*> args;
  for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  struct Actions {
    posix_spawn_file_actions_t actions;
    Actions() { posix_spawn_file_actions_init(&actions); }
    ~Actions() { posix_spawn_file_actions_destroy(&actions); }
  } quieted;
  if (quiet &&
      posix_spawn_file_actions_addopen(&quieted.actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0) !=
          0) {
    return -1;
  }
  pid_t pid = -1;
  if (posix_spawn(&pid, args[0], &quieted.actions, nullptr, args.data(), environ) != 0) return -1;
  int status = 0;
  pid_t waited;
  while ((waited = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
  }
  if (waited != pid) return -1;  // SIGCHLD ignored: no status to trust
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A name as the kernel gives devices and netdevs: no path in it.
bool plain_name(const std::string& name) {
  return !name.empty() && name.size() < 64 && name != "." && name != ".." &&
         name.find_first_not_of(
             "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
             "_.-") == std::string::npos;
}

// A netdev --real may take down: one with no hardware under it (a dummy, a
// veth, a bridge), so that a soft-RoCE device over a host's real NIC is
// refused rather than cutting the host off.
bool virtual_netdev(const std::string& netdev) {
  return plain_name(netdev) && access(("/sys/class/net/" + netdev).c_str(), F_OK) == 0 &&
         access(("/sys/class/net/" + netdev + "/device").c_str(), F_OK) != 0;
}

// The netdev a soft-RoCE device runs over (rxe's own `parent` attribute,
// which no hardware RDMA device has), if it is a virtual one.
std::optional<std::string> rxe_netdev(const std::string& device, std::string& why) {
  std::ifstream in("/sys/class/infiniband/" + device + "/parent");
  std::string name;
  if (!(in >> name)) {
    why =
        device + " is not a soft-RoCE device here (no /sys/class/infiniband/" + device + "/parent)";
    return std::nullopt;
  }
  if (!virtual_netdev(name)) {
    why = device + " runs over " + name + ", which is hardware (or gone): not touched";
    return std::nullopt;
  }
  return name;
}

// The commands that do `fault`, in order, or a reason they cannot. A command
// whose first word is "-" may fail (a gid-change's removal of an address
// not there yet).
std::vector<std::vector<std::string>> commands_for(const ibev::Fault& fault, std::string& why) {
  const std::string ip = tool("ip");
  const std::string rdma = tool("rdma");
  if (ip.empty() || rdma.empty()) {
    why = "no ip or rdma in /usr/sbin, /usr/bin, /sbin or /bin (package iproute2)";
    return {};
  }
  switch (fault.kind) {
    case ibev::Fault::Kind::kPortDown:
    case ibev::Fault::Kind::kPortUp:
    case ibev::Fault::Kind::kGidChange: {
      const auto netdev = rxe_netdev(fault.device, why);
      if (!netdev) return {};
      if (fault.kind == ibev::Fault::Kind::kGidChange) {
        // fd00:ffff::LINE, an address (so a GID) per line, removed first so
        // that a second run of the schedule adds it, and changes the GIDs, again.
        const std::string address = "fd00:ffff::" + std::to_string(fault.line) + "/128";
        return {{"-", ip, "-6", "addr", "del", address, "dev", *netdev},
                {ip, "-6", "addr", "add", address, "dev", *netdev, "nodad"}};
      }
      return {
          {ip, "link", "set", *netdev, fault.kind == ibev::Fault::Kind::kPortDown ? "down" : "up"}};
    }
    case ibev::Fault::Kind::kRemove:
      if (!rxe_netdev(fault.device, why)) return {};
      return {{rdma, "link", "delete", fault.device}};
    case ibev::Fault::Kind::kAdd:
      if (!virtual_netdev(fault.netdev)) {
        why = fault.netdev + " is hardware, or not there: not touched";
        return {};
      }
      return {{rdma, "link", "add", fault.device, "type", "rxe", "netdev", fault.netdev}};
    case ibev::Fault::Kind::kQpFatal:
      why = "qp-fatal has no real action (inject it: ibev::Replay)";
      return {};
  }
  return {};
}

// Whether each fault's device is there to act on when its turn comes, as far
// as the schedule itself says (a device removed is gone; one added is
// there), checked against this host for a device's first fault.
bool check_devices(const std::vector<ibev::Fault>& faults, const std::string& name) {
  std::map<std::string, bool> present;  // after the faults so far
  for (const auto& fault : faults) {
    std::string why;
    auto known = present.find(fault.device);
    if (known == present.end()) {
      const bool here = fault.kind == ibev::Fault::Kind::kAdd
                            ? access(("/sys/class/infiniband/" + fault.device).c_str(), F_OK) == 0
                            : rxe_netdev(fault.device, why).has_value();
      if (fault.kind != ibev::Fault::Kind::kAdd && !here) {
        std::fprintf(stderr, "ibev-replay: %s:%d: %s\n", name.c_str(), fault.line, why.c_str());
        return false;
      }
      known = present.emplace(fault.device, here).first;
    }
    const bool add = fault.kind == ibev::Fault::Kind::kAdd;
    if (known->second == add) {
      std::fprintf(stderr, "ibev-replay: %s:%d: %s is %s then\n", name.c_str(), fault.line,
                   fault.device.c_str(), add ? "there already" : "not there");
      return false;
    }
    if (add && !virtual_netdev(fault.netdev)) {
      std::fprintf(stderr, "ibev-replay: %s:%d: %s is hardware, or not there: not touched\n",
                   name.c_str(), fault.line, fault.netdev.c_str());
      return false;
    }
    if (add || fault.kind == ibev::Fault::Kind::kRemove) known->second = add;
  }
  return true;
}

int do_for_real(const std::vector<ibev::Fault>& faults, const std::string& name, double speed) {
  // Everything the file says is checked before anything is done.
  for (const auto& fault : faults) {
    if (fault.kind == ibev::Fault::Kind::kQpFatal) {
      std::fprintf(stderr, "ibev-replay: %s:%d: qp-fatal has no real action (inject it: %s)\n",
                   name.c_str(), fault.line, "ibev::Replay");
      return kUsageError;
    }
    for (const std::string* word : {&fault.device, &fault.netdev}) {
      if (!word->empty() && !plain_name(*word)) {
        std::fprintf(stderr, "ibev-replay: %s:%d: '%s' is not a device or netdev name\n",
                     name.c_str(), fault.line, word->c_str());
        return kUsageError;
      }
    }
  }
  if (geteuid() != 0) {
    std::fprintf(stderr, "ibev-replay: --real needs root (it runs ip and rdma)\n");
    return kUsageError;
  }
  if (!check_devices(faults, name)) return kActionFailed;
  const auto started = std::chrono::steady_clock::now();
  for (const auto& fault : faults) {
    std::this_thread::sleep_until(started + ibev::replay_delay(fault.at, speed));
    std::string why;
    const auto commands = commands_for(fault, why);
    if (commands.empty()) {
      std::fprintf(stderr, "ibev-replay: %s:%d: %s\n", name.c_str(), fault.line, why.c_str());
      return kActionFailed;
    }
    std::string text;
    for (auto command : commands) {
      const bool may_fail = command.front() == "-";
      if (may_fail) command.erase(command.begin());
      std::string line;
      for (const auto& word : command) line += (line.empty() ? "" : " ") + word;
      // A command that may fail is one whose failure is expected (the
      // address a gid-change removes first is usually not there): its
      // complaint ("RTNETLINK answers: Cannot assign requested address")
      // is no news, and would read as the run's failure.
      const int status = run(command, may_fail);
      if (status != 0 && !may_fail) {
        std::fprintf(stderr, "ibev-replay: %s:%d: '%s' %s %d\n", name.c_str(), fault.line,
                     line.c_str(), status < 0 ? "did not run:" : "exited", status);
        return kActionFailed;
      }
      text = line;  // the command that does it, last
    }
    std::printf(
        "%s %s %s: %s\n", offset(ibev::RecordingClock::time_point(fault.at), {}, speed).c_str(),
        fault.device.c_str(), std::string(ibev::to_string(fault.kind)).c_str(), text.c_str());
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
