// ibev-watch: prints every async event of RDMA devices as it arrives.
//
//   ibev-watch [-d NAME]... [--json] [--count]
//
// Opens every device (or each -d NAME), listens to all of its port and device
// events through an ibev Dispatcher, and prints one line per event (see
// format.h). SIGINT or SIGTERM ends it: events already queued are printed,
// then the counts (--count), then it exits 0.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "apps/ibev_watch/format.h"
#include <ibev/core/registry.h>
#include <ibev/dispatch/dispatcher.h>
#include <ibev/verbs/device.h>

namespace {

constexpr char kUsage[] =
    "usage: ibev-watch [-d NAME]... [--json] [--count]\n"
    "  -d, --device NAME  watch this device (repeatable; default: all)\n"
    "  --json             one JSON object per line\n"
    "  --count            print per-device, per-event counts at exit\n";

constexpr char kNoDevice[] =
    "ibev-watch: no RDMA device found.\n"
    "  To make a soft-RoCE device over an Ethernet interface (as root):\n"
    "    modprobe rdma_rxe && rdma link add rxe0 type rxe netdev <interface>\n";

struct Options {
  std::vector<std::string> devices;
  bool json = false;
  bool count = false;
};

// Parses argv; returns false (after saying why) on bad usage.
bool parse(int argc, char** argv, Options& options) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if ((arg == "-d" || arg == "--device") && i + 1 < argc) {
      options.devices.emplace_back(argv[++i]);
    } else if (arg.rfind("--device=", 0) == 0) {
      options.devices.emplace_back(arg.substr(9));
    } else if (arg == "--json") {
      options.json = true;
    } else if (arg == "--count") {
      options.count = true;
    } else if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      std::fprintf(stderr, "ibev-watch: unknown argument '%s'\n%s", argv[i], kUsage);
      return false;
    }
  }
  return true;
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
  Options options;
  if (!parse(argc, argv, options)) return 2;

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
      return 2;
    }
  }
  if (options.devices.empty()) {
    std::fputs(kNoDevice, stderr);
    return 2;
  }

  ibev::Registry registry;
  ibev::Dispatcher dispatcher(registry);
  Printer printer(options.json);
  std::vector<std::shared_ptr<ibev::Device>> devices;
  std::vector<ibev::Attachment> listeners;
  for (const std::string& name : options.devices) {
    try {
      devices.push_back(ibev::Device::open(dispatcher, registry, name));
    } catch (const std::system_error& e) {
      std::fprintf(stderr, "ibev-watch: cannot open %s: %s\n", name.c_str(), e.what());
      return 2;
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
