// ibev-watch's command line: what it accepts, and its exit statuses
// (ibev-watch.1 says the same). Options and exit codes follow rdma-core's
// ibv_* tools: getopt_long, usage errors exit 1.
#ifndef IBEV_APPS_IBEV_WATCH_OPTIONS_H_
#define IBEV_APPS_IBEV_WATCH_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace ibev::watch {

// Also: a metrics address or textfile that cannot be used.
constexpr int kUsageError = 1;
// A device named with -d that is not there (also: no RDMA in the kernel),
// or one that cannot be opened. Without -d, no device is no failure.
constexpr int kCannotWatch = 2;

struct Options {
  std::vector<std::string> devices;  // empty: every device, and those added later
  bool json = false;
  bool count = false;
  bool journal = false;  // events to the systemd journal instead of stdout
  // --metrics-listen HOST:PORT ("[::1]:9100", ":9100" for every IPv4
  // address); empty host: not serving.
  std::string metrics_host;
  std::uint16_t metrics_port = 0;
  std::string metrics_textfile;  // empty: none
};

// Parses argv with getopt_long; prints and exits for --help, --version
// (status 0) and usage errors (kUsageError).
Options parse(int argc, char** argv);

}  // namespace ibev::watch

#endif  // IBEV_APPS_IBEV_WATCH_OPTIONS_H_
