// ibev-watch: prints every async event of RDMA devices as it arrives.
//
//   ibev-watch [-d NAME]... [-j] [-c]      (ibev-watch --help; man ibev-watch)
//
// Opens every device (or each -d NAME), listens to all of its port and device
// events through an ibev Dispatcher, and prints one line per event (see
// format.h). SIGINT or SIGTERM ends it: events already queued are printed,
// then the counts (--count), then it exits 0. Options and exit codes follow
// rdma-core's ibv_* tools: getopt_long, usage errors exit 1.
#include <getopt.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <ibev/core/registry.h>
#include <ibev/dispatch/dispatcher.h>
#include <ibev/verbs/device.h>
#include <ibev/version.h>

#include "apps/ibev_watch/format.h"

namespace {

constexpr char kUsage[] =
    "usage: ibev-watch [-d NAME]... [-j] [-c]\n"
    "  -d, --device=NAME  watch this device (repeatable; default: all)\n"
    "  -j, --json         one JSON object per line\n"
    "  -c, --count        print per-device, per-event counts at exit\n"
    "  -V, --version      print the version and exit\n"
    "  -h, --help         print this help and exit\n";

constexpr char kHelp[] =
    "\n"
    "Prints every async event (port, device and unclaimed object events) of\n"
    "RDMA devices as it arrives, one line each, until SIGINT or SIGTERM.\n"
    "\n"
    "Output, one line per event:\n"
    "  human: TIME DEVICE SCOPE ENUMERATOR (NAME) SEVERITY\n"
    "         2026-11-21T12:00:00.123456Z rxe0 port 1 IBV_EVENT_PORT_ERR (port error) error\n"
    "  JSON:  time, device, event, code, scope, port (port events), object\n"
    "         (object events, as \"0x...\"), severity, synthesized (when ibev\n"
    "         made the event itself)\n"
    "  --count, at exit: DEVICE EVENT COUNT per line (JSON: count, device, event)\n"
    "\n"
    "Exit status:\n"
    "  0  ended by SIGINT or SIGTERM\n"
    "  1  a usage error\n"
    "  2  no RDMA support in this kernel, no device, or a device that cannot\n"
    "     be opened (the message says which)\n";

// Exit statuses (documented above and in ibev-watch.1).
constexpr int kUsageError = 1;
constexpr int kCannotWatch = 2;

struct Options {
  std::vector<std::string> devices;
  bool json = false;
  bool count = false;
};

[[noreturn]] void usage_error(const std::string& reason) {
  if (!reason.empty()) std::fprintf(stderr, "ibev-watch: %s\n", reason.c_str());
  std::fputs(kUsage, stderr);
  std::exit(kUsageError);
}

// Parses argv with getopt_long (which names an unknown option itself);
// exits for --help, --version and usage errors.
Options parse(int argc, char** argv) {
  static const option kLong[] = {
      {"device", required_argument, nullptr, 'd'},
      {"json", no_argument, nullptr, 'j'},
      {"count", no_argument, nullptr, 'c'},
      {"version", no_argument, nullptr, 'V'},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0},
  };
  Options options;
  for (int opt; (opt = getopt_long(argc, argv, "d:jcVh", kLong, nullptr)) != -1;) {
    switch (opt) {
      case 'd':
        if (*optarg == '\0') usage_error("--device needs a device name");
        // The same device twice is watched once (its events would print twice).
        if (std::find(options.devices.begin(), options.devices.end(), optarg) ==
            options.devices.end()) {
          options.devices.emplace_back(optarg);
        }
        break;
      case 'j':
        options.json = true;
        break;
      case 'c':
        options.count = true;
        break;
      case 'V':
        std::printf("ibev-watch (ibev) %s\n", IBEV_VERSION_STRING);
        std::exit(0);
      case 'h':
        std::printf("%s%s", kUsage, kHelp);
        std::exit(0);
      default:  // getopt_long said what was wrong
        usage_error("");
    }
  }
  if (optind < argc) usage_error(std::string("unexpected argument '") + argv[optind] + "'");
  return options;
}

// rdma-core's device list is empty (ENOSYS) both when there is no device and
// when the kernel has no RDMA at all; /sys/class/infiniband_verbs, which the
// uverbs module makes and rdma-core reads, tells the two apart.
bool kernel_has_rdma() { return access("/sys/class/infiniband_verbs", F_OK) == 0; }

// Why there is nothing to watch: no RDMA in the kernel, or no device.
void explain_no_device() {
  if (!kernel_has_rdma()) {
    std::fputs(
        "ibev-watch: this kernel has no RDMA support (no /sys/class/infiniband_verbs).\n"
        "  Load the RDMA modules (modprobe ib_uverbs and a driver, e.g. rdma_rxe),\n"
        "  or use a kernel built with InfiniBand/RDMA. In a container, the host's\n"
        "  /sys/class/infiniband_verbs and /dev/infiniband must be visible.\n",
        stderr);
    return;
  }
  std::fputs(
      "ibev-watch: the kernel supports RDMA, but there is no RDMA device.\n"
      "  To make a soft-RoCE device over an Ethernet interface (as root):\n"
      "    modprobe rdma_rxe && rdma link add rxe0 type rxe netdev <interface>\n",
      stderr);
}

void explain_open_failure(const std::string& name, const std::system_error& e) {
  const int error = e.code().value();
  if (error == EACCES || error == EPERM) {
    std::fprintf(stderr,
                 "ibev-watch: no permission to open %s (%s).\n"
                 "  Run as root, or as a member of the group that owns "
                 "/dev/infiniband/uverbs*.\n",
                 name.c_str(), e.what());
  } else if (error == ENODEV && !kernel_has_rdma()) {
    explain_no_device();
  } else if (error == ENODEV) {
    std::fprintf(stderr, "ibev-watch: no RDMA device named %s (%s)\n", name.c_str(),
                 e.what());
  } else {
    std::fprintf(stderr, "ibev-watch: cannot open %s: %s\n", name.c_str(), e.what());
  }
}

class Printer {
 public:
  explicit Printer(bool json) : json_(json) {}
  ibev::Handler for_device(std::string name) {
    return [this, name](const ibev::Event& event) {
      const auto now = ibev::watch::Clock::now();
      const std::string line = json_ ? ibev::watch::format_json(event, name, now)
                                     : ibev::watch::format_human(event, name, now);
      std::lock_guard<std::mutex> lock(mutex_);
      std::fprintf(stdout, "%s\n", line.c_str());
      std::fflush(stdout);  // a line per event, even into a pipe
    };
  }

 private:
  const bool json_;
  std::mutex mutex_;
};

void print_counts(ibev::Registry& registry, const ibev::Device& device, bool json) {
  const ibev::CounterSnapshot counts = registry.counters(device.context());
  for (int code = 0; code <= ibev::CounterSnapshot::kTrackedCodes; ++code) {
    const ibev::EventCounts c = counts.for_code(code);
    const std::uint64_t seen = c.delivered + c.unclaimed;
    if (seen == 0) continue;
    const auto* info = ibev::find_event_type(code);
    const std::string name = code == ibev::CounterSnapshot::kTrackedCodes
                                 ? "other"
                                 : info ? std::string(info->enumerator)
                                        : "unknown(" + std::to_string(code) + ")";
    if (json) {
      std::printf("{\"count\":%llu,\"device\":%s,\"event\":%s}\n",
                  static_cast<unsigned long long>(seen),
                  ibev::watch::json_string(device.name()).c_str(),
                  ibev::watch::json_string(name).c_str());
    } else {
      std::printf("%s %s %llu\n", device.name().c_str(), name.c_str(),
                  static_cast<unsigned long long>(seen));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options options = parse(argc, argv);

  // Signals are taken by sigwait below; every thread started from here on
  // inherits the mask, so none of them is interrupted.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  if (options.devices.empty()) {
    try {
      options.devices = ibev::Device::names();
    } catch (const std::system_error& e) {
      std::fprintf(stderr, "ibev-watch: cannot list RDMA devices: %s\n", e.what());
      return kCannotWatch;
    }
  }
  if (options.devices.empty()) {
    explain_no_device();
    return kCannotWatch;
  }

  ibev::Dispatcher dispatcher;
  ibev::Registry& registry = dispatcher.registry();
  Printer printer(options.json);
  std::vector<std::shared_ptr<ibev::Device>> devices;
  std::vector<ibev::Handle> listeners;
  for (const std::string& name : options.devices) {
    try {
      devices.push_back(ibev::Device::open(dispatcher, name));
    } catch (const std::system_error& e) {
      explain_open_failure(name, e);
      return kCannotWatch;
    }
    listeners.push_back(devices.back()->on_event({}, printer.for_device(name)));
  }

  std::string names;
  for (const auto& d : devices) names += (names.empty() ? "" : ", ") + d->name();
  std::fprintf(stderr, "ibev-watch: watching %s\n", names.c_str());
  dispatcher.start();

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  dispatcher.stop();
  // What was queued before the signal is printed too (bounded).
  for (int pass = 0; pass < 100 && dispatcher.run_once(std::chrono::milliseconds(0)) > 0;
       ++pass) {
  }
  if (options.count) {
    for (const auto& device : devices) print_counts(registry, *device, options.json);
  }
  std::fflush(stdout);
  return 0;
}
