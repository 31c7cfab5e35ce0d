// A fault schedule's faults done for real on this host's soft-RoCE devices,
// as the soft-RoCE harness does them: `ip link set NETDEV down/up`, an
// address added under the port (`ip -6 addr add fd00:ffff::LINE/128`),
// `rdma link delete` and `rdma link add ... type rxe`, and netem's packet
// faults on the netdev (`tc qdisc replace dev NETDEV root netem ...`, which
// takes the place of the netdev's root qdisc; netem-off is `tc qdisc del
// dev NETDEV root`, so the kernel's default is back). One place for
// `ibev-replay --schedule --real` and the fault campaign
// (tests/softroce/campaign_test.cc), so that a schedule the campaign shrank
// replays with ibev-replay as it ran there.
//
// Safety: as root, so it acts only on soft-RoCE devices (rxe's `parent`
// attribute) over netdevs with no hardware under them (a dummy, a veth), runs
// ip, rdma and tc from the system's folders only, never the caller's PATH, and
// takes only plain names (no path) for devices and netdevs.
//
// Thread-safety: free functions, any thread; each spawns and waits for its
// commands (so not from a handler that must not block).
#ifndef IBEV_APPS_IBEV_REPLAY_REAL_FAULTS_H_
#define IBEV_APPS_IBEV_REPLAY_REAL_FAULTS_H_

#include <string>
#include <vector>

#include <ibev/formats/fault_schedule.h>

namespace ibev::real_faults {

// What a check or an action came to: status 0 (done), kRefused (the
// schedule cannot be done for real: a qp-fatal, a listener-close,
// listener-open, peer-kill or peer-start, a bad name, not root) or
// kFailed (a device not soft-RoCE or not there when its turn comes, a
// command that failed), with a message "NAME:LINE: why".
struct Outcome {
  static constexpr int kRefused = 1;
  static constexpr int kFailed = 2;
  int status = 0;
  std::string message;
  std::string command;  // done: the command that did the fault, last
};

// Why `fault` is not the host's to do (a qp-fatal, a listener's close or
// open, a peer process's kill or start: a program's QP, listener and peer,
// injected or done by the program, as the fault campaign's runner does),
// or empty.
std::string not_real(const Fault& fault);

// Everything in `faults` checked before anything is done: each can be done
// for real (no qp-fatal: that one is injected; no listener-close,
// listener-open, peer-kill or peer-start: the listener and the peer
// process are the program's), names are plain, this is
// root, and each fault's device is there to act on when its turn comes as
// far as the schedule says (a device removed is gone, one added is there),
// checked against this host for a device's first fault. `name` is the
// schedule's, for messages.
Outcome check(const std::vector<Fault>& faults, const std::string& name);

// Does `fault` now, waiting for its commands (ip, rdma, tc).
Outcome apply(const Fault& fault, const std::string& name);

// Takes away what the gid-change faults of `faults` added (their
// addresses) and the root qdisc of each netdev a netem of `faults` was on,
// best effort, whether or not the run got that far: a schedule's run leaves
// the netdev's addresses, so its GIDs, and its packets as it found them.
void clean_up(const std::vector<Fault>& faults);

}  // namespace ibev::real_faults

#endif  // IBEV_APPS_IBEV_REPLAY_REAL_FAULTS_H_
