// ibev-watch --journal: each event and device change as one systemd journal
// entry (sd_journal_send), with structured fields that journalctl matches:
//
//   MESSAGE       the human line without its time ("rxe0 port 1 IBV_EVENT_PORT_ERR ...")
//   PRIORITY      from the event's severity: fatal 2 (crit), error 3 (err),
//                 informational 6 (info), unknown 5 (notice); a device added
//                 5, removed 4 (warning)
//   RDMA_DEVICE   the device's name          RDMA_EVENT    IBV_EVENT_PORT_ERR
//   RDMA_PORT     port events only           RDMA_ELEMENT  port, device, qp, ...
//   RDMA_EVENT_CODE  the ibv_event_type value
//   RDMA_CHANGE   added or removed (device changes; RDMA_LOSS says why)
//
// Both return 0, or an errno: ENOENT or ECONNREFUSED when no journald
// listens on kJournalSocket (journal_reachable's word, asked before every
// entry: sd_journal_send itself returns 0 then and the entry is lost), else
// the one sd_journal_send gave. Any thread.
#ifndef IBEV_APPS_IBEV_WATCH_JOURNAL_H_
#define IBEV_APPS_IBEV_WATCH_JOURNAL_H_

#include <string>

#include <ibev/core/event.h>

#include "apps/ibev_watch/format.h"

namespace ibev::watch {

// Where journald takes entries (sd_journal_send writes there; the path is
// fixed in libsystemd).
inline constexpr const char* kJournalSocket = "/run/systemd/journal/socket";

// 0 when something listens on `socket` (a datagram connect succeeds), else
// the errno: ENOENT in a container or on a host without systemd,
// ECONNREFUSED when journald is gone and left its socket behind. `socket` is
// a parameter for tests; ibev-watch asks kJournalSocket.
int journal_reachable(const char* socket = kJournalSocket);

// `time` is when ibev-watch heard it (the journal stamps its own too).
int journal_event(const Event& event, const std::string& device, Clock::time_point time);
int journal_change(const std::string& device, const std::string& node, bool added, DeviceLoss loss,
                   Clock::time_point time);

}  // namespace ibev::watch

#endif  // IBEV_APPS_IBEV_WATCH_JOURNAL_H_
