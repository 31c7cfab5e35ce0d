// ibev-watch: prints every async event of RDMA devices as it arrives.
//
//   ibev-watch [-d NAME]... [-j] [-c]      (ibev-watch --help; man ibev-watch)
//
// Watches every device, and those added later (or each -d NAME, also when it
// is re-added), through an ibev Dispatcher and DeviceClients: prints a line
// when a device is added or removed and one per port and device event (see
// format.h). It never holds up a device's delete: a removed device is let go
// at once. SIGINT or SIGTERM ends it: events already queued are printed,
// then the counts (--count), then it exits 0. Options and exit codes follow
// rdma-core's ibv_* tools: getopt_long, usage errors exit 1.
//
// Locking: Printer's mutex is a leaf (one line at a time). Watch's mutex
// guards its listeners and counts; it is held across a listener's release
// and the Registry's counters (which take the Registry's own locks, never
// this one), and never while a handler or a client runs: add() subscribes
// before taking it, and remove() runs on the dispatching thread, where a
// listener's release does not wait.
#include <getopt.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <map>
#include <set>
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
#include <ibev/verbs/device_clients.h>
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
    "RDMA devices as it arrives, one line each, until SIGINT or SIGTERM, and\n"
    "a line when a device is added or removed. Without -d it watches every\n"
    "device, including those added later; a removed device is let go at once\n"
    "(its delete never waits for ibev-watch) and watched again if re-added.\n"
    "\n"
    "Output, one line per event:\n"
    "  human: TIME DEVICE SCOPE ENUMERATOR (NAME) SEVERITY\n"
    "         2026-11-21T12:00:00.123456Z rxe0 port 1 IBV_EVENT_PORT_ERR (port error) error\n"
    "  JSON:  time, device, event, code, scope, port (port events), object\n"
    "         (object events, as \"0x...\"), number (object events that name\n"
    "         the object by its number), severity, synthesized (when ibev\n"
    "         made the event itself)\n"
    "  devices: TIME DEVICE device added|removed (NODE[, LOSS])\n"
    "         JSON: time, device, change (added, removed), node, loss\n"
    "  --count, at exit: DEVICE EVENT COUNT per line (JSON: count, device, event)\n"
    "\n"
    "Exit status:\n"
    "  0  ended by SIGINT or SIGTERM\n"
    "  1  a usage error\n"
    "  2  no RDMA support in this kernel, a device named with -d that is not\n"
    "     there, or a device that cannot be opened (the message says which)\n";

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
  bool json() const noexcept { return json_; }

  ibev::Handler for_device(std::string name) {
    return [this, name](const ibev::Event& event) {
      const auto now = ibev::watch::Clock::now();
      print(json_ ? ibev::watch::format_json(event, name, now)
                  : ibev::watch::format_human(event, name, now));
    };
  }
  void change(const ibev::Device& device, bool added, ibev::DeviceLoss loss) {
    const auto now = ibev::watch::Clock::now();
    print(json_ ? ibev::watch::format_change_json(device.name(), device.node(), added, loss, now)
                : ibev::watch::format_change_human(device.name(), device.node(), added, loss,
                                                   now));
  }
  void print(const std::string& line) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::fprintf(stdout, "%s\n", line.c_str());
    std::fflush(stdout);  // a line per event, even into a pipe
  }

 private:
  const bool json_;
  std::mutex mutex_;
};

// Events seen, per device name and event, across a device's removals and
// re-adds: the Registry forgets a device once it is closed.
using Counts = std::map<std::string, std::map<std::string, std::uint64_t>>;

void add_counts(Counts& counts, ibev::Registry& registry, const ibev::Device& device) {
  const ibev::CounterSnapshot snapshot = registry.counters(device.context());
  for (int code = 0; code <= ibev::CounterSnapshot::kTrackedCodes; ++code) {
    const ibev::EventCounts c = snapshot.for_code(code);
    const std::uint64_t seen = c.delivered + c.unclaimed;
    if (seen == 0) continue;
    const auto* info = ibev::find_event_type(code);
    const std::string name = code == ibev::CounterSnapshot::kTrackedCodes
                                 ? "other"
                                 : info ? std::string(info->enumerator)
                                        : "unknown(" + std::to_string(code) + ")";
    counts[device.name()][name] += seen;
  }
}

void print_counts(const Counts& counts, bool json) {
  for (const auto& [device, events] : counts) {
    for (const auto& [event, seen] : events) {
      if (json) {
        std::printf("{\"count\":%llu,\"device\":%s,\"event\":%s}\n",
                    static_cast<unsigned long long>(seen),
                    ibev::watch::json_string(device).c_str(),
                    ibev::watch::json_string(event).c_str());
      } else {
        std::printf("%s %s %llu\n", device.c_str(), event.c_str(),
                    static_cast<unsigned long long>(seen));
      }
    }
  }
}

// The devices ibev-watch prints, as a device client: each device (or each
// named one) when it is added, listened to until it is removed; a removed
// device is let go at once, so that its delete never waits for ibev-watch.
class Watch {
 public:
  Watch(ibev::Registry& registry, Printer& printer, std::vector<std::string> only)
      : registry_(registry), printer_(printer), only_(std::move(only)) {}

  ibev::DeviceClient client() {
    return {"ibev-watch",
            [this](const std::shared_ptr<ibev::Device>& device) { add(device); },
            [this](const std::shared_ptr<ibev::Device>& device, ibev::DeviceLoss loss) {
              remove(device, loss);
            }};
  }

  // Until each of `names` was added once, or `limit` passed.
  bool wait_added(const std::vector<std::string>& names, std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lock(mutex_);
    return added_.wait_for(lock, limit, [&] {
      return std::all_of(names.begin(), names.end(),
                         [&](const std::string& name) { return added_names_.count(name) != 0; });
    });
  }

  Counts counts(const std::vector<std::shared_ptr<ibev::Device>>& open) {
    std::lock_guard<std::mutex> lock(mutex_);
    Counts all = removed_counts_;
    for (const auto& device : open) {
      if (listeners_.count(device.get()) != 0) add_counts(all, registry_, *device);
    }
    return all;
  }

 private:
  bool wanted(const std::string& name) const {
    return only_.empty() || std::find(only_.begin(), only_.end(), name) != only_.end();
  }

  void add(const std::shared_ptr<ibev::Device>& device) {
    if (!wanted(device->name())) return;
    printer_.change(*device, true, ibev::DeviceLoss::kNone);
    ibev::Handle listener = device->on_event({}, printer_.for_device(device->name()));
    std::lock_guard<std::mutex> lock(mutex_);
    listeners_[device.get()] = std::move(listener);
    added_names_.insert(device->name());
    added_.notify_all();
  }

  void remove(const std::shared_ptr<ibev::Device>& device, ibev::DeviceLoss loss) {
    printer_.change(*device, false, loss);
    std::lock_guard<std::mutex> lock(mutex_);
    add_counts(removed_counts_, registry_, *device);  // before it closes and is forgotten
    listeners_.erase(device.get());
  }

  ibev::Registry& registry_;
  Printer& printer_;
  const std::vector<std::string> only_;
  std::mutex mutex_;
  std::condition_variable added_;
  std::set<std::string> added_names_;
  std::map<const ibev::Device*, ibev::Handle> listeners_;
  Counts removed_counts_;
};

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

  // What there is to watch now: every device (none yet is fine, they may
  // come), or each device named, which must be there and openable.
  std::vector<std::string> present;
  try {
    present = ibev::Device::names();
  } catch (const std::system_error& e) {
    std::fprintf(stderr, "ibev-watch: cannot list RDMA devices: %s\n", e.what());
    return kCannotWatch;
  }
  if (!kernel_has_rdma()) {
    explain_no_device();
    return kCannotWatch;
  }
  const std::vector<std::string> expected = options.devices.empty() ? present : options.devices;

  ibev::Dispatcher::Options dispatcher_options;
  dispatcher_options.on_failure = [](const ibev::Failure& failure) {
    std::fprintf(stderr, "ibev-watch: %s\n", ibev::describe(failure).c_str());
  };
  ibev::Dispatcher dispatcher(dispatcher_options);
  for (const std::string& name : expected) {
    try {
      ibev::Device::open(dispatcher, name);  // dropped at once: a check
    } catch (const std::system_error& e) {
      explain_open_failure(name, e);
      return kCannotWatch;
    }
  }

  Printer printer(options.json);
  Watch watch(dispatcher.registry(), printer, options.devices);
  std::unique_ptr<ibev::DeviceClients> clients;
  try {
    clients = std::make_unique<ibev::DeviceClients>(dispatcher);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ibev-watch: cannot watch devices come and go: %s\n", e.what());
    return kCannotWatch;
  }
  ibev::Handle client = clients->register_client(watch.client());
  dispatcher.start();
  if (!watch.wait_added(expected, std::chrono::seconds(10))) {
    std::fprintf(stderr, "ibev-watch: the devices did not come up within 10 s\n");
    return kCannotWatch;
  }
  std::string names;
  for (const auto& name : expected) names += (names.empty() ? "" : ", ") + name;
  if (names.empty()) names = "no device yet";
  std::fprintf(stderr, "ibev-watch: watching %s%s (devices noticed through %s)\n",
               names.c_str(), options.devices.empty() ? ", and devices added later" : "",
               std::string(ibev::to_string(dispatcher.device_monitor())).c_str());

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  dispatcher.stop();
  // What was queued before the signal is printed too (bounded).
  for (int pass = 0; pass < 100 && dispatcher.run_once(std::chrono::milliseconds(0)) > 0;
       ++pass) {
  }
  if (options.count) print_counts(watch.counts(clients->devices()), options.json);
  std::fflush(stdout);
  client.release();
  return 0;
}
