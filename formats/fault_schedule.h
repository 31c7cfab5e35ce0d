// ibev's fault-injection schedule: a small declarative list of what should
// go wrong and when, for testing recovery code the way ibev tests its own.
//
//   # at    fault       device  argument
//   0s      port-down   rxe0    1          # the port (its link goes down)
//   1.5s    port-up     rxe0    1
//   2s      gid-change  rxe0    1          # an address added under the port
//   2500ms  qp-fatal    rxe0    0x11       # the QP numbered 0x11
//   3s      remove      rxe0               # the device goes away
//   4s      add         rxe0    d0         # and comes back, over netdev d0
//   5s      netem       rxe0    loss=20% delay=30ms reorder=10%
//   6500ms  netem-off   rxe0               # its netdev's packets as before
//   7s      listener-close rxe1            # the CM listener on rxe1 closed
//   8s      listener-open  rxe1            # and listening again
//   9s      peer-kill      rxe1            # the peer process on rxe1 killed
//   10s     peer-start     rxe1            # and started again
//
// One fault a line, in time order; `#` starts a comment. A netem degrades
// the packets the device's netdev sends (`tc qdisc ... netem`) until its
// netem-off (or the next netem, which replaces it): loss=N[.N]% of them
// dropped, each delay=TIME late (up to 10 s), reorder=N[.N]% sent at once
// ahead of the delayed rest, which netem does only with a delay above 0;
// each key at most once, in any order, at least one. A listener-close
// closes the application's CM listener on the device (a server that stops
// accepting: its connections go on, a new connect request is rejected)
// until its listener-open, which listens again on the same port. A
// peer-kill kills the application's peer process on the device (the
// server) with SIGKILL, as a crash would: its listener and connections go
// with it (the kernel closes its CM ids and QPs). Its peer-start starts it
// again, listening on the same port. Two drivers:
// - injection, everywhere: to_recording() turns it into the events a real
//   fault raises (PORT_ERR, PORT_ACTIVE, GID_CHANGE, QP_FATAL by number,
//   DEVICE_FATAL), which ibev::Replay (dispatch/replay.h) injects. A netem
//   raises no RDMA event (what it does shows in the traffic: retries,
//   timeouts), so it injects nothing; nor does a listener-close,
//   listener-open, peer-kill or peer-start (a closed listener shows only
//   as a peer's rejected connect, a killed peer as its connections'
//   end): the program under test does those itself, as the fault
//   campaign's runner does;
// - the real action, as root on a soft-RoCE host:
//   `ibev-replay --schedule --real FILE` runs the soft-RoCE harness's
//   commands (ip link, ip addr, rdma link, tc qdisc). qp-fatal,
//   listener-close, listener-open, peer-kill and peer-start have no real
//   action (the QP, the listener and the peer process are a program's,
//   not the host's).
//
// Thread-safety: free functions; any thread.
#ifndef IBEV_FORMATS_FAULT_SCHEDULE_H_
#define IBEV_FORMATS_FAULT_SCHEDULE_H_

#include <chrono>
#include <cstdint>
#include <istream>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include <ibev/formats/recording.h>

namespace ibev {

// What a netem does to the netdev's packets, in netem's own words; each
// unset is not done.
struct NetemSpec {
  std::optional<double> loss;                      // % dropped, 0 to 100
  std::optional<std::chrono::microseconds> delay;  // each packet's, 0 to 10 s
  std::optional<double> reorder;  // % not delayed, 0 to 100; needs a delay above 0
};

bool operator==(const NetemSpec& a, const NetemSpec& b) noexcept;
inline bool operator!=(const NetemSpec& a, const NetemSpec& b) noexcept { return !(a == b); }

// A netem percentage (0 to 100) in the fewest digits that read back as the
// same double, with its "%": how write_fault_schedule writes one, and what
// tc-netem(8) takes.
std::string netem_percent_text(double value);

struct Fault {
  enum class Kind {
    kPortDown,
    kPortUp,
    kGidChange,
    kQpFatal,
    kRemove,
    kAdd,
    kNetem,
    kNetemOff,
    kListenerClose,  // the CM listener on `device` closed
    kListenerOpen,   // and listening again, on the same port
    kPeerKill,       // the peer process on `device` killed (SIGKILL)
    kPeerStart,      // and started again, listening on the same port
  };

  std::chrono::microseconds at{0};  // from the schedule's start
  Kind kind = Kind::kPortDown;
  std::string device;
  std::uint32_t number = 0;  // the port, or the QP number
  std::string netdev;        // kAdd: the netdev the device comes back over
  NetemSpec netem;           // kNetem: at least one of its three
  int line = 0;              // where it was written, for messages
};

// "port-down", "port-up", "gid-change", "qp-fatal", "remove", "add",
// "netem", "netem-off", "listener-close", "listener-open", "peer-kill",
// "peer-start".
std::string_view to_string(Fault::Kind kind) noexcept;

// Throws std::invalid_argument "NAME:LINE: why" (an unknown fault, a time
// that is not N[.N](s|ms) or goes back, a port outside 1..255, a missing or
// extra argument, a device or netdev name with a byte outside printable
// ASCII; a netem with no key, an unknown or repeated one, a percentage that
// is not N[.N]% from 0 to 100, a delay past 10 s, a reorder without a
// delay above 0).
std::vector<Fault> read_fault_schedule(std::istream& in, const std::string& name);

// Writes `faults` one a line, in the form read_fault_schedule reads (times
// and delays in ms, to the microsecond; a QP number in hex; a percentage in
// the fewest digits that read back the same double): what it reads back is
// `faults`, each `line` its place in the file. Throws std::invalid_argument
// "fault N: why" before writing anything for what it could not read back
// (a time that goes back or is past a year, a port outside 1..255, a QP
// number past 24 bits, a device or netdev empty or with a space or #, a
// netem the reader would refuse).
void write_fault_schedule(std::ostream& out, const std::vector<Fault>& faults);

// The events (and device changes) the faults raise, as recorded at `start`
// plus each fault's time: a replayable recording. A netem, netem-off,
// listener-close, listener-open, peer-kill or peer-start raises none, so it
// has no line.
std::vector<RecordedLine> to_recording(const std::vector<Fault>& faults,
                                       RecordingClock::time_point start);

}  // namespace ibev

#endif  // IBEV_FORMATS_FAULT_SCHEDULE_H_
