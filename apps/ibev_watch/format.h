// How ibev-watch prints an event: one line, human-readable or JSON.
//
// Human: "2026-11-21T12:00:00.123456Z rxe0 port 1 IBV_EVENT_PORT_ERR (port error) error"
// JSON:  {"time":"...","device":"rxe0","event":"IBV_EVENT_PORT_ERR","code":10,
//         "scope":"port","port":1,"severity":"error"}
// Object events name the object ("qp 0x..."; JSON "object":"0x..."), unknown
// codes print as "unknown(42)", and synthesized events say so, as a
// DEVICE_FATAL meaning the device is gone says why ("loss").
//
// Devices coming and going, one line each:
// Human: "2026-11-21T12:00:00.123456Z rxe0 device removed (uverbs0, removed)"
// JSON:  {"time":"...","device":"rxe0","change":"removed","node":"uverbs0","loss":"removed"}
#ifndef IBEV_APPS_IBEV_WATCH_FORMAT_H_
#define IBEV_APPS_IBEV_WATCH_FORMAT_H_

#include <chrono>
#include <string>
#include <string_view>

#include <ibev/core/event.h>

namespace ibev::watch {

using Clock = std::chrono::system_clock;

// ISO 8601, UTC, microseconds.
std::string format_time(Clock::time_point time);

// The event's enumerator ("IBV_EVENT_PORT_ERR"), or "unknown(42)".
std::string enumerator_of(const Event& event);

std::string format_human(const Event& event, std::string_view device,
                         Clock::time_point time);
std::string format_json(const Event& event, std::string_view device,
                        Clock::time_point time);

// A device added, or removed (`loss` says why); `node` is its uverbs node.
std::string format_change_human(std::string_view device, std::string_view node, bool added,
                                DeviceLoss loss, Clock::time_point time);
std::string format_change_json(std::string_view device, std::string_view node, bool added,
                               DeviceLoss loss, Clock::time_point time);

// `text` as a JSON string literal, quotes included.
std::string json_string(std::string_view text);

}  // namespace ibev::watch

#endif  // IBEV_APPS_IBEV_WATCH_FORMAT_H_
