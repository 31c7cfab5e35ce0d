// ibev-watch's command line (options.h).
#include "apps/ibev_watch/options.h"

#include <getopt.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <ibev/version.h>

namespace ibev::watch {
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

[[noreturn]] void usage_error(const std::string& reason) {
  if (!reason.empty()) std::fprintf(stderr, "ibev-watch: %s\n", reason.c_str());
  std::fputs(kUsage, stderr);
  std::exit(kUsageError);
}

}  // namespace

// getopt_long names an unknown option itself.
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

}  // namespace ibev::watch
