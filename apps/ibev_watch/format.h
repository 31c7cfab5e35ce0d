// How ibev-watch prints an event for a person: one line. --json prints the
// recording format instead (formats/recording.h), one object per line.
//
// "2026-11-21T12:00:00.123456Z rxe0 port 1 IBV_EVENT_PORT_ERR (port error) error"
// Object events name the object ("qp 0x..."), unknown codes print as
// "unknown(42)", and synthesized events say so, as a DEVICE_FATAL meaning
// the device is gone says why ("[removed]").
//
// Devices coming and going, one line each:
// "2026-11-21T12:00:00.123456Z rxe0 device removed (uverbs0, removed)"
#ifndef IBEV_APPS_IBEV_WATCH_FORMAT_H_
#define IBEV_APPS_IBEV_WATCH_FORMAT_H_

#include <chrono>
#include <string>
#include <string_view>

#include <ibev/core/event.h>

namespace ibev::watch {

using Clock = std::chrono::system_clock;

std::string format_human(const Event& event, std::string_view device, Clock::time_point time);

// A device added, or removed (`loss` says why); `node` is its uverbs node.
std::string format_change_human(std::string_view device, std::string_view node, bool added,
                                DeviceLoss loss, Clock::time_point time);

}  // namespace ibev::watch

#endif  // IBEV_APPS_IBEV_WATCH_FORMAT_H_
