// ibev's recording format: a stream of async events and device changes as
// JSON lines. `ibev-watch --json` writes it; read_recording() reads it back;
// ibev::Replay (dispatch/replay.h) plays it into an application's Dispatcher,
// so that a user's CI can run its handlers against what a real fabric did.
//
// Version 1, stable: later versions only add keys, and a reader ignores keys
// it does not know (a line is an event by its "code", a change by its
// "change"). A recording may start with a header line
//   {"recording":"ibev","version":1,"time":"2026-11-21T12:00:00.123456Z"}
// (one without it is version 1). Then one object per line:
//   event:  {"time":T,"device":"rxe0","event":"IBV_EVENT_PORT_ERR","code":10,
//            "scope":"port","port":1,"severity":"error"}
//           object events have "object":"0x..." (the address in the recording
//           process: a key, not a pointer) or "number":17 (a QP number);
//           "loss":"removed" on the DEVICE_FATAL of a device that went away,
//           "synthesized":true on events ibev made itself
//   change: {"time":T,"device":"rxe0","change":"added","node":"uverbs0"}
//           ("removed", with "loss")
//   count:  {"count":3,"device":"rxe0","event":"..."} (ibev-watch --count at
//           exit): not part of the stream, skipped by the reader
// T is ISO 8601 UTC with microseconds. docs/operations.md says the same.
//
// Thread-safety: free functions; any thread.
#ifndef IBEV_FORMATS_RECORDING_H_
#define IBEV_FORMATS_RECORDING_H_

#include <chrono>
#include <cstdint>
#include <istream>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <ibev/core/event.h>

namespace ibev {

inline constexpr int kRecordingVersion = 1;
using RecordingClock = std::chrono::system_clock;

// --- writing ---

// "2026-11-21T12:00:00.123456Z".
std::string iso8601_utc(RecordingClock::time_point time);
// `text` as a JSON string literal, quotes included.
std::string json_string(std::string_view text);
// An object's address as recordings (and ibev-watch's lines) write it: "0x55d0...".
std::string object_address(const void* object);
std::string recording_header(RecordingClock::time_point time);
std::string recording_line(const Event& event, std::string_view device,
                           RecordingClock::time_point time);
// A device added, or removed (`loss` says why, unless kNone); `node` is its
// uverbs node.
std::string recording_change_line(std::string_view device, std::string_view node, bool added,
                                  DeviceLoss loss, RecordingClock::time_point time);

// --- reading ---

struct RecordedEvent {
  RecordingClock::time_point time;
  std::string device;
  int code = 0;
  ElementKind kind = ElementKind::kDevice;
  std::optional<int> port;              // port events
  std::optional<std::uint64_t> object;  // object events: the recorded address
  std::optional<std::uint32_t> number;  // object events named by number
  DeviceLoss loss = DeviceLoss::kNone;
  bool synthesized = false;
};

struct RecordedChange {
  RecordingClock::time_point time;
  std::string device;
  std::string node;
  bool added = false;
  DeviceLoss loss = DeviceLoss::kNone;
};

using RecordedLine = std::variant<RecordedEvent, RecordedChange>;

// When the line's event or change was recorded.
RecordingClock::time_point time_of(const RecordedLine& line);

// Every event and change of `in`, in order. Throws std::invalid_argument
// "NAME:LINE: why" for a line that is not a JSON object of this format (a
// missing or malformed key, a value that is an object or array, a scope that
// does not match the event's code, a port event without its port), a header
// of a newer version or not first, or a stream that fails mid-way.
std::vector<RecordedLine> read_recording(std::istream& in, const std::string& name);

// A whole number as these formats write it: decimal, or hexadecimal after
// "0x"; no sign, space or other base. nullopt otherwise, or above `high`.
std::optional<std::uint64_t> parse_whole_number(std::string_view text,
                                                std::uint64_t high = UINT64_MAX);

// The wall-clock wait a replay at `speed` gives a recorded `gap` (gap/speed;
// none at speed 0 or for a gap below 0; at most a century, so that a clock's
// now() plus it never overflows). Throws std::invalid_argument for a speed
// that is not 0 and not from 1e-6 to 1e6.
std::chrono::nanoseconds replay_delay(RecordingClock::duration gap, double speed);

}  // namespace ibev

#endif  // IBEV_FORMATS_RECORDING_H_
