// ibev-watch's command line (options.h).
#include "apps/ibev_watch/options.h"

#include <getopt.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <ibev/version.h>

namespace ibev::watch {
namespace {

constexpr char kUsage[] =
    "usage: ibev-watch [-d NAME]... [-j | --journal] [-c] [--metrics-listen HOST:PORT]\n"
    "                  [--metrics-textfile PATH]\n"
    "  -d, --device=NAME         watch this device (repeatable; default: all)\n"
    "  -j, --json                one JSON object per line\n"
    "      --journal             send events to the systemd journal, not stdout\n"
    "  -c, --count               print per-device, per-event counts at exit\n"
    "      --metrics-listen=HOST:PORT\n"
    "                            serve Prometheus metrics at http://HOST:PORT/metrics\n"
    "                            (HOST an IP address, [v6] in brackets; empty: 0.0.0.0)\n"
    "      --metrics-textfile=PATH\n"
    "                            write them to PATH (atomically) on each event and\n"
    "                            every 10 s, for node_exporter's textfile collector\n"
    "  -V, --version             print the version and exit\n"
    "  -h, --help                print this help and exit\n";

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
    "  JSON:  ibev's recording format, version 1 (ibev-replay plays it back):\n"
    "         first a header: recording (\"ibev\"), version, time; then per event\n"
    "         time, device, event, code, scope, port (port events), object\n"
    "         (object events, as \"0x...\"), number (object events that name\n"
    "         the object by its number), severity, loss, synthesized (when ibev\n"
    "         made the event itself)\n"
    "  devices: TIME DEVICE device added|removed (NODE[, LOSS])\n"
    "         JSON: time, device, change (added, removed), node, loss\n"
    "  --count, at exit: DEVICE EVENT COUNT per line (JSON: count, device, event)\n"
    "\n"
    "  --journal: one journal entry per line above, with the fields\n"
    "         RDMA_DEVICE, RDMA_PORT, RDMA_EVENT, RDMA_ELEMENT, RDMA_CHANGE,\n"
    "         RDMA_LOSS and PRIORITY (journalctl RDMA_EVENT=IBV_EVENT_PORT_ERR)\n"
    "  metrics: docs/operations.md and ibev-watch(1) list them\n"
    "\n"
    "Exit status:\n"
    "  0  ended by SIGINT or SIGTERM\n"
    "  1  a usage error, or a metrics address or file that cannot be used\n"
    "  2  a device named with -d that is not there (or no RDMA support in this\n"
    "     kernel), or a device that cannot be opened (the message says which);\n"
    "     without -d, no device (even no RDMA yet) is waited for, not an error\n";

[[noreturn]] void usage_error(const std::string& reason) {
  if (!reason.empty()) std::fprintf(stderr, "ibev-watch: %s\n", reason.c_str());
  std::fputs(kUsage, stderr);
  std::exit(kUsageError);
}

// Long options without a short one.
enum : int { kJournal = 256, kMetricsListen, kMetricsTextfile };

// HOST:PORT, [HOST]:PORT or :PORT; the host is checked when it is bound.
void parse_listen(const std::string& text, Options& options) {
  const std::string reason = "--metrics-listen '" + text + "': ";
  std::string host;
  std::string port;
  if (!text.empty() && text.front() == '[') {
    const std::size_t close = text.find("]:");
    if (close == std::string::npos) usage_error(reason + "expected [HOST]:PORT");
    host = text.substr(1, close - 1);
    if (host.empty()) usage_error(reason + "no host in the brackets");
    port = text.substr(close + 2);
  } else {
    const std::size_t colon = text.rfind(':');
    if (colon == std::string::npos) usage_error(reason + "expected HOST:PORT");
    host = text.substr(0, colon);
    if (host.find(':') != std::string::npos) {
      usage_error(reason + "an IPv6 address goes in brackets, [::1]:9100");
    }
    port = text.substr(colon + 1);
  }
  char* end = nullptr;
  errno = 0;
  const unsigned long number = std::strtoul(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || errno != 0 || number > 65535 ||
      port.find_first_not_of("0123456789") != std::string::npos) {
    usage_error(reason + "the port is not a number from 0 to 65535");
  }
  options.metrics_host = host.empty() ? "0.0.0.0" : host;
  options.metrics_port = static_cast<std::uint16_t>(number);
}

}  // namespace

// getopt_long names an unknown option itself.
Options parse(int argc, char** argv) {
  static const option kLong[] = {
      {"device", required_argument, nullptr, 'd'},
      {"json", no_argument, nullptr, 'j'},
      {"count", no_argument, nullptr, 'c'},
      {"journal", no_argument, nullptr, kJournal},
      {"metrics-listen", required_argument, nullptr, kMetricsListen},
      {"metrics-textfile", required_argument, nullptr, kMetricsTextfile},
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
      case kJournal:
        options.journal = true;
        break;
      case kMetricsListen:
        parse_listen(optarg, options);
        break;
      case kMetricsTextfile:
        if (*optarg == '\0') usage_error("--metrics-textfile needs a path");
        options.metrics_textfile = optarg;
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
  if (options.json && options.journal) usage_error("--json and --journal: choose one");
  return options;
}

}  // namespace ibev::watch
