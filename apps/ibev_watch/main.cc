// ibev-watch: prints every async event of RDMA devices as it arrives.
//
//   ibev-watch [-d NAME]... [-j | --journal] [-c] [--metrics-listen HOST:PORT]
//              [--metrics-textfile PATH]      (ibev-watch --help; man ibev-watch)
//
// Watches every device, and those added later (or each -d NAME, also when it
// is re-added), through an ibev Dispatcher and DeviceClients: prints a line
// when a device is added or removed and one per port and device event (see
// format.h), or a journal entry (journal.h); it serves and writes Prometheus
// metrics (watch_metrics.h, exposition.h). It never holds up a device's
// delete: a removed device is let go at once. SIGINT or SIGTERM ends it:
// events already queued are printed, then the counts (--count), then it
// exits 0. Options and exit codes follow rdma-core's ibv_* tools:
// getopt_long, usage errors exit 1.
//
// main() checks what there is to watch (explaining why not, when it cannot;
// no device, even no RDMA in the kernel, is no failure without -d: it waits
// for devices), then starts the Dispatcher with a Watch (watch.h) registered as a device
// client and waits for a signal. The command line is options.h's.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include <ibev/dispatch/dispatcher.h>
#include <ibev/verbs/device.h>
#include <ibev/verbs/device_clients.h>

#include "apps/ibev_watch/exposition.h"
#include "apps/ibev_watch/options.h"
#include "apps/ibev_watch/watch.h"
#include "apps/ibev_watch/watch_metrics.h"

namespace {

// node_exporter's textfile collector reads the file when scraped: the
// counters are rewritten at least this often, and on every event.
constexpr std::chrono::seconds kTextfilePeriod{10};

// rdma-core's device list is empty (ENOSYS) both when there is no device and
// when the kernel has no RDMA at all; /sys/class/infiniband_verbs, which the
// uverbs module makes and rdma-core reads, tells the two apart.
bool kernel_has_rdma() { return access("/sys/class/infiniband_verbs", F_OK) == 0; }

void explain_no_rdma() {
  std::fputs(
      "ibev-watch: this kernel has no RDMA support (no /sys/class/infiniband_verbs).\n"
      "  Load the RDMA modules (modprobe ib_uverbs and a driver, e.g. rdma_rxe),\n"
      "  or use a kernel built with InfiniBand/RDMA. In a container, the host's\n"
      "  /sys/class/infiniband_verbs and /dev/infiniband must be visible.\n",
      stderr);
}

// Why there is nothing to watch: no RDMA in the kernel, or no device.
void explain_no_device() {
  if (!kernel_has_rdma()) return explain_no_rdma();
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
    std::fprintf(stderr, "ibev-watch: no RDMA device named %s (%s)\n", name.c_str(), e.what());
  } else {
    std::fprintf(stderr, "ibev-watch: cannot open %s: %s\n", name.c_str(), e.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  using ibev::watch::kCannotWatch;
  const ibev::watch::Options options = ibev::watch::parse(argc, argv);

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
  // With no device named, a host without RDMA (yet) is one with no device:
  // ibev-watch waits for devices to come (modules loaded later, a card
  // hot-plugged), as with none at all. Exiting instead made the unit's
  // Restart=on-failure restart it every 5 s on every such host of a fleet.
  if (!kernel_has_rdma()) {
    explain_no_rdma();
    if (!options.devices.empty()) return kCannotWatch;
    std::fputs("ibev-watch: waiting for RDMA devices to appear\n", stderr);
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

  ibev::watch::Printer printer(options.journal ? ibev::watch::Output::kJournal
                               : options.json  ? ibev::watch::Output::kJson
                                               : ibev::watch::Output::kHuman);
  // Set before start(): the dispatching thread only reads it.
  std::unique_ptr<ibev::watch::TextfileWriter> textfile;
  ibev::watch::WatchMetrics metrics([&textfile] {
    if (textfile) textfile->changed();
  });
  ibev::watch::Watch watch(dispatcher.registry(), printer, metrics, options.devices);
  std::unique_ptr<ibev::DeviceClients> clients;
  try {
    clients = std::make_unique<ibev::DeviceClients>(dispatcher);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ibev-watch: cannot watch devices come and go: %s\n", e.what());
    return kCannotWatch;
  }

  // Metrics, from the first device added on.
  const ibev::watch::Render render = [&] {
    return metrics.render(dispatcher, watch.watched(clients->devices()));
  };
  const ibev::watch::ExpositionFailed failed = [&metrics](const std::string& what) {
    metrics.scrape_error();
    std::fprintf(stderr, "ibev-watch: metrics: %s\n", what.c_str());
  };
  std::unique_ptr<ibev::watch::MetricsServer> server;
  // However main returns, dispatch stops first (the textfile hook runs on its
  // thread), then the threads that render, before what they read (clients,
  // metrics, watch) goes.
  struct StopFirst {
    ibev::Dispatcher& dispatcher;
    std::unique_ptr<ibev::watch::MetricsServer>& server;
    std::unique_ptr<ibev::watch::TextfileWriter>& textfile;
    ~StopFirst() {
      dispatcher.stop();
      server.reset();
      textfile.reset();
    }
  } stop_first{dispatcher, server, textfile};
  try {
    if (!options.metrics_textfile.empty()) {
      textfile = std::make_unique<ibev::watch::TextfileWriter>(options.metrics_textfile,
                                                               kTextfilePeriod, render, failed);
    }
    if (!options.metrics_host.empty()) {
      server = std::make_unique<ibev::watch::MetricsServer>(options.metrics_host,
                                                            options.metrics_port, render, failed);
      std::fprintf(stderr, "ibev-watch: serving metrics on %s\n", server->url().c_str());
    }
  } catch (const std::system_error& e) {
    std::fprintf(stderr, "ibev-watch: cannot expose metrics: %s\n", e.what());
    return ibev::watch::kUsageError;
  }

  printer.begin();
  ibev::Handle client = clients->register_client(watch.client());
  dispatcher.start();
  if (!watch.wait_added(expected, std::chrono::seconds(10))) {
    std::fprintf(stderr, "ibev-watch: the devices did not come up within 10 s\n");
    return kCannotWatch;
  }
  std::string names;
  for (const auto& name : expected) names += (names.empty() ? "" : ", ") + name;
  if (names.empty()) names = "no device yet";
  std::fprintf(stderr, "ibev-watch: watching %s%s (devices noticed through %s)\n", names.c_str(),
               options.devices.empty() ? ", and devices added later" : "",
               std::string(ibev::to_string(dispatcher.device_monitor())).c_str());

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  dispatcher.stop();
  // What was queued before the signal is printed too (bounded).
  for (int pass = 0; pass < 100 && dispatcher.run_once(std::chrono::milliseconds(0)) > 0; ++pass) {
  }
  if (options.count) ibev::watch::print_counts(watch.counts(clients->devices()), options.json);
  std::fflush(stdout);
  client.release();
  return 0;
}
