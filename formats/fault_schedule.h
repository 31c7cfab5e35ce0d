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
//
// One fault a line, in time order; `#` starts a comment. Two drivers:
// - injection, everywhere: to_recording() turns it into the events a real
//   fault raises (PORT_ERR, PORT_ACTIVE, GID_CHANGE, QP_FATAL by number,
//   DEVICE_FATAL), which ibev::Replay (dispatch/replay.h) injects;
// - the real action, as root on a soft-RoCE host:
//   `ibev-replay --schedule --real FILE` runs the soft-RoCE harness's
//   commands (ip link, ip addr, rdma link). qp-fatal has no real action.
//
// Thread-safety: free functions; any thread.
#ifndef IBEV_FORMATS_FAULT_SCHEDULE_H_
#define IBEV_FORMATS_FAULT_SCHEDULE_H_

#include <chrono>
#include <cstdint>
#include <istream>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include <ibev/formats/recording.h>

namespace ibev {

struct Fault {
  enum class Kind { kPortDown, kPortUp, kGidChange, kQpFatal, kRemove, kAdd };

  std::chrono::microseconds at{0};  // from the schedule's start
  Kind kind = Kind::kPortDown;
  std::string device;
  std::uint32_t number = 0;  // the port, or the QP number
  std::string netdev;        // kAdd: the netdev the device comes back over
  int line = 0;              // where it was written, for messages
};

// "port-down", "port-up", "gid-change", "qp-fatal", "remove", "add".
std::string_view to_string(Fault::Kind kind) noexcept;

// Throws std::invalid_argument "NAME:LINE: why" (an unknown fault, a time
// that is not N[.N](s|ms) or goes back, a port outside 1..255, a missing or
// extra argument, a device or netdev name with a byte outside printable
// ASCII).
std::vector<Fault> read_fault_schedule(std::istream& in, const std::string& name);

// Writes `faults` one a line, in the form read_fault_schedule reads (times
// in ms, to the microsecond; a QP number in hex): what it reads back is
// `faults`, each `line` its place in the file. Throws std::invalid_argument
// "fault N: why" before writing anything for what it could not read back
// (a time that goes back or is past a year, a port outside 1..255, a QP
// number past 24 bits, a device or netdev empty or with a space or #).
void write_fault_schedule(std::ostream& out, const std::vector<Fault>& faults);

// The events (and device changes) the faults raise, as recorded at `start`
// plus each fault's time: a replayable recording.
std::vector<RecordedLine> to_recording(const std::vector<Fault>& faults,
                                       RecordingClock::time_point start);

}  // namespace ibev

#endif  // IBEV_FORMATS_FAULT_SCHEDULE_H_
