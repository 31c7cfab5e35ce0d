// ibev-watch's journal entries (journal.h).
#include "apps/ibev_watch/journal.h"

#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <syslog.h>
#include <unistd.h>
#include <systemd/sd-journal.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

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

// One entry of "FIELD=value" strings (the identifier added); 0 or an errno.
int send(std::vector<std::string> fields) {
  // sd_journal_sendv returns 0 without sending when the socket is not there.
  if (const int error = journal_reachable(); error != 0) return error;
  fields.emplace_back("SYSLOG_IDENTIFIER=ibev-watch");
  std::vector<iovec> entry;
  for (std::string& field : fields) entry.push_back({field.data(), field.size()});
  const int rc = sd_journal_sendv(entry.data(), static_cast<int>(entry.size()));
  return rc < 0 ? -rc : 0;
}

}  // namespace

int journal_reachable(const char* socket) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (std::strlen(socket) >= sizeof(address.sun_path)) return ENAMETOOLONG;
  std::strcpy(address.sun_path, socket);
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  const int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  const int error = rc == 0 ? 0 : errno;
  ::close(fd);
  return error;
}

int journal_event(const Event& event, const std::string& device, Clock::time_point time) {
  std::vector<std::string> fields = {
      "MESSAGE=" + without_time(format_human(event, device, time)),
      "PRIORITY=" + std::to_string(priority_of(event.severity())),
      "RDMA_DEVICE=" + device,
      "RDMA_EVENT=" + enumerator_name(event.code()),
      "RDMA_EVENT_CODE=" + std::to_string(event.code()),
      "RDMA_ELEMENT=" + std::string(to_string(event.element_kind())),
  };
  if (const auto port = event.port()) fields.push_back("RDMA_PORT=" + std::to_string(*port));
  return send(std::move(fields));
}

int journal_change(const std::string& device, const std::string& node, bool added, DeviceLoss loss,
                   Clock::time_point time) {
  return send({
      "MESSAGE=" + without_time(format_change_human(device, node, added, loss, time)),
      "PRIORITY=" + std::to_string(added ? LOG_NOTICE : LOG_WARNING),
      "RDMA_DEVICE=" + device,
      "RDMA_NODE=" + node,
      std::string("RDMA_CHANGE=") + (added ? "added" : "removed"),
      "RDMA_LOSS=" + std::string(to_string(loss)),
  });
}

}  // namespace ibev::watch
