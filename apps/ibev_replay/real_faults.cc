// ibev-replay --schedule --real's faults (real_faults.h).
#include "apps/ibev_replay/real_faults.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <map>
#include <optional>
#include <set>

extern char** environ;

namespace ibev::real_faults {
namespace {

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

// The address a gid-change adds: fd00:ffff::LINE, one (so a GID) per line.
std::string gid_address(const Fault& fault) {
  return "fd00:ffff::" + std::to_string(fault.line) + "/128";
}

// netem's words for `netem` (tc-netem(8)): its delay in microseconds, its
// percentages as the schedule writes them.
std::vector<std::string> netem_words(const NetemSpec& netem) {
  std::vector<std::string> words;
  if (netem.delay) {
    words.insert(words.end(), {"delay", std::to_string(netem.delay->count()) + "us"});
  }
  if (netem.loss) words.insert(words.end(), {"loss", netem_percent_text(*netem.loss)});
  if (netem.reorder) words.insert(words.end(), {"reorder", netem_percent_text(*netem.reorder)});
  return words;
}

// Why the tools `fault` needs are not there (tc for a netem, ip and rdma
// for the rest), or empty.
std::string missing_tool(const Fault& fault) {
  const bool netem = fault.kind == Fault::Kind::kNetem || fault.kind == Fault::Kind::kNetemOff;
  if (netem ? !tool("tc").empty() : !tool("ip").empty() && !tool("rdma").empty()) return {};
  return std::string("no ") + (netem ? "tc" : "ip or rdma") +
         " in /usr/sbin, /usr/bin, /sbin or /bin (package iproute2)";
}

// The commands that do `fault`, in order, or a reason they cannot. A command
// whose first word is "-" may fail (a gid-change's removal of an address
// not there yet, a netem-off's of a netem not there).
std::vector<std::vector<std::string>> commands_for(const Fault& fault, std::string& why) {
  why = missing_tool(fault);
  if (!why.empty()) return {};
  const std::string ip = tool("ip");
  const std::string rdma = tool("rdma");
  const std::string tc = tool("tc");
  switch (fault.kind) {
    case Fault::Kind::kPortDown:
    case Fault::Kind::kPortUp:
    case Fault::Kind::kGidChange: {
      const auto netdev = rxe_netdev(fault.device, why);
      if (!netdev) return {};
      if (fault.kind == Fault::Kind::kGidChange) {
        // Removed first so that a second run of the schedule adds it, and
        // changes the GIDs, again.
        const std::string address = gid_address(fault);
        return {{"-", ip, "-6", "addr", "del", address, "dev", *netdev},
                {ip, "-6", "addr", "add", address, "dev", *netdev, "nodad"}};
      }
      return {
          {ip, "link", "set", *netdev, fault.kind == Fault::Kind::kPortDown ? "down" : "up"}};
    }
    case Fault::Kind::kRemove:
      if (!rxe_netdev(fault.device, why)) return {};
      return {{rdma, "link", "delete", fault.device}};
    case Fault::Kind::kAdd:
      if (!virtual_netdev(fault.netdev)) {
        why = fault.netdev + " is hardware, or not there: not touched";
        return {};
      }
      return {{rdma, "link", "add", fault.device, "type", "rxe", "netdev", fault.netdev}};
    case Fault::Kind::kNetem:
    case Fault::Kind::kNetemOff: {
      const auto netdev = rxe_netdev(fault.device, why);
      if (!netdev) return {};
      if (fault.kind == Fault::Kind::kNetemOff) {
        return {{"-", tc, "qdisc", "del", "dev", *netdev, "root"}};
      }
      std::vector<std::string> command{tc, "qdisc", "replace", "dev", *netdev, "root", "netem"};
      for (auto& word : netem_words(fault.netem)) command.push_back(std::move(word));
      return {std::move(command)};
    }
    case Fault::Kind::kQpFatal:
    case Fault::Kind::kListenerClose:
    case Fault::Kind::kListenerOpen:
    case Fault::Kind::kPeerKill:
    case Fault::Kind::kPeerStart:
      why = not_real(fault);
      return {};
  }
  return {};
}

// "NAME:LINE: why".
Outcome failed(int status, const std::string& name, const Fault& fault, const std::string& why) {
  return {status, name + ":" + std::to_string(fault.line) + ": " + why, {}};
}

}  // namespace

std::string not_real(const Fault& fault) {
  switch (fault.kind) {
    case Fault::Kind::kQpFatal:
      return "qp-fatal has no real action (inject it: ibev::Replay)";
    case Fault::Kind::kListenerClose:
    case Fault::Kind::kListenerOpen:
      return std::string(to_string(fault.kind)) +
             " has no real action (the listener is the program's: the program under test "
             "closes and opens it, as the fault campaign's runner does)";
    case Fault::Kind::kPeerKill:
    case Fault::Kind::kPeerStart:
      return std::string(to_string(fault.kind)) +
             " has no real action (the peer process is the program's: the program under test "
             "kills and starts it, as the fault campaign's runner does)";
    default:
      return {};
  }
}

Outcome check(const std::vector<Fault>& faults, const std::string& name) {
  for (const auto& fault : faults) {
    if (const std::string why = not_real(fault); !why.empty()) {
      return failed(Outcome::kRefused, name, fault, why);
    }
    for (const std::string* word : {&fault.device, &fault.netdev}) {
      if (!word->empty() && !plain_name(*word)) {
        return failed(Outcome::kRefused, name, fault,
                      "'" + *word + "' is not a device or netdev name");
      }
    }
  }
  if (geteuid() != 0) {
    return {Outcome::kRefused, "--real needs root (it runs ip, rdma and tc)", {}};
  }
  // Every tool the schedule needs is there before its first fault is done.
  for (const auto& fault : faults) {
    const std::string why = missing_tool(fault);
    if (!why.empty()) return failed(Outcome::kFailed, name, fault, why);
  }
  std::map<std::string, bool> present;  // after the faults so far
  for (const auto& fault : faults) {
    std::string why;
    auto known = present.find(fault.device);
    if (known == present.end()) {
      const bool here = fault.kind == Fault::Kind::kAdd
                            ? access(("/sys/class/infiniband/" + fault.device).c_str(), F_OK) == 0
                            : rxe_netdev(fault.device, why).has_value();
      if (fault.kind != Fault::Kind::kAdd && !here) {
        return failed(Outcome::kFailed, name, fault, why);
      }
      known = present.emplace(fault.device, here).first;
    }
    const bool add = fault.kind == Fault::Kind::kAdd;
    if (known->second == add) {
      return failed(Outcome::kFailed, name, fault,
                    fault.device + " is " + (add ? "there already" : "not there") + " then");
    }
    if (add && !virtual_netdev(fault.netdev)) {
      return failed(Outcome::kFailed, name, fault,
                    fault.netdev + " is hardware, or not there: not touched");
    }
    if (add || fault.kind == Fault::Kind::kRemove) known->second = add;
  }
  return {};
}

Outcome apply(const Fault& fault, const std::string& name) {
  std::string why;
  const auto commands = commands_for(fault, why);
  if (commands.empty()) return failed(Outcome::kFailed, name, fault, why);
  Outcome done;
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
      return failed(Outcome::kFailed, name, fault,
                    "'" + line + "' " + (status < 0 ? "did not run: " : "exited ") +
                        std::to_string(status));
    }
    done.command = line;  // the command that does it, last
  }
  return done;
}

void clean_up(const std::vector<Fault>& faults) {
  const std::string ip = tool("ip");
  const std::string tc = tool("tc");
  std::set<std::string> netem_netdevs;
  for (const auto& fault : faults) {
    const bool gid_change = fault.kind == Fault::Kind::kGidChange && !ip.empty();
    const bool netem = fault.kind == Fault::Kind::kNetem && !tc.empty();
    std::string why;
    const auto netdev = gid_change || netem ? rxe_netdev(fault.device, why) : std::nullopt;
    if (!netdev) continue;
    if (gid_change) run({ip, "-6", "addr", "del", gid_address(fault), "dev", *netdev}, true);
    // Whether or not its netem-off came (a run may stop before it), once per
    // netdev: deleting the root qdisc puts the kernel's default back.
    if (netem && netem_netdevs.insert(*netdev).second) {
      run({tc, "qdisc", "del", "dev", *netdev, "root"}, true);
    }
  }
}

}  // namespace ibev::real_faults
