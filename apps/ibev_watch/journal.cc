// ibev-watch's journal entries (journal.h).
#include "apps/ibev_watch/journal.h"

#include <syslog.h>
#include <systemd/sd-journal.h>

#include <string_view>

#include "apps/ibev_watch/format.h"

namespace ibev::watch {
namespace {

int priority_of(Severity severity) {
  switch (severity) {
    case Severity::kFatal:
      return LOG_CRIT;
    case Severity::kError:
      return LOG_ERR;
    case Severity::kInformational:
      return LOG_INFO;
    case Severity::kUnknown:
      break;
  }
  return LOG_NOTICE;
}

// The human line (format.h) after its time stamp: the journal keeps its own.
std::string without_time(const std::string& line) {
  const std::size_t space = line.find(' ');
  return space == std::string::npos ? line : line.substr(space + 1);
}

}  // namespace

int journal_event(const Event& event, const std::string& device, Clock::time_point time) {
  const std::string message = without_time(format_human(event, device, time));
  const std::string enumerator = enumerator_name(event.code());
  const std::string element(to_string(event.element_kind()));
  const int priority = priority_of(event.severity());
  // sd_journal_send takes printf-style fields, ended by NULL; RDMA_PORT only
  // where the event names one.
  const int rc =
      event.port()
          ? sd_journal_send("MESSAGE=%s", message.c_str(), "PRIORITY=%d", priority,
                            "SYSLOG_IDENTIFIER=ibev-watch", "RDMA_DEVICE=%s", device.c_str(),
                            "RDMA_PORT=%d", *event.port(), "RDMA_EVENT=%s", enumerator.c_str(),
                            "RDMA_EVENT_CODE=%d", event.code(), "RDMA_ELEMENT=%s", element.c_str(),
                            nullptr)
          : sd_journal_send("MESSAGE=%s", message.c_str(), "PRIORITY=%d", priority,
                            "SYSLOG_IDENTIFIER=ibev-watch", "RDMA_DEVICE=%s", device.c_str(),
                            "RDMA_EVENT=%s", enumerator.c_str(), "RDMA_EVENT_CODE=%d", event.code(),
                            "RDMA_ELEMENT=%s", element.c_str(), nullptr);
  return rc < 0 ? -rc : 0;
}

int journal_change(const std::string& device, const std::string& node, bool added, DeviceLoss loss,
                   Clock::time_point time) {
  const std::string message = without_time(format_change_human(device, node, added, loss, time));
  const std::string why(to_string(loss));
  const int rc = sd_journal_send("MESSAGE=%s", message.c_str(), "PRIORITY=%d",
                                 added ? LOG_NOTICE : LOG_WARNING, "SYSLOG_IDENTIFIER=ibev-watch",
                                 "RDMA_DEVICE=%s", device.c_str(), "RDMA_NODE=%s", node.c_str(),
                                 "RDMA_CHANGE=%s", added ? "added" : "removed", "RDMA_LOSS=%s",
                                 why.c_str(), nullptr);
  return rc < 0 ? -rc : 0;
}

}  // namespace ibev::watch
