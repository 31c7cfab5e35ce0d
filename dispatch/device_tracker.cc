// Devices coming and going, from what the kernel shows to the watchers:
// uevent / inotify / timer fd readable -> the changes it means, by uverbs
// node -> for a removal, the async sources of that device lose it (their
// listeners hear DEVICE_FATAL) -> every watcher hears the change.
//
// Three ways to notice, the first that starts for kAuto, each a Monitor
// that serves its own fd:
//  - uevents: a NETLINK_KOBJECT_UEVENT socket bound to the kernel's group,
//    taking `ACTION=add|remove SUBSYSTEM=infiniband_verbs
//    DEVNAME=infiniband/uverbsN`. The kernel's own word, ~0.1 s into a delete.
//  - inotify on /dev/infiniband (and on /dev, for the folder's coming and
//    going): for where no uevent socket can be bound, as in some containers.
//  - rescans of /sys/class/infiniband_verbs every 250 ms: for where neither
//    works (a /dev that is not devtmpfs).
// The known set is kept whatever the kind, and a rescan reconciles it when
// the kernel's messages may have been lost (ENOBUFS, a folder just watched).
//
// Locking: the known set is the dispatching thread's; the two subscriber
// lists lock themselves (core/subscriber_lists.h), never across a call.
#include "device_tracker.h"

#include <dirent.h>
#include <linux/netlink.h>
#include <sys/epoll.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "sources.h"

namespace ibev::detail {

namespace {

constexpr char kSysfsNodes[] = "/sys/class/infiniband_verbs";
constexpr char kDevFolder[] = "/dev/infiniband";
constexpr auto kRescanPeriod = std::chrono::milliseconds(250);
constexpr int kMessagesPerTurn = 64;  // bounded turns, as every source

bool is_uverbs_node(std::string_view name) {
  return name.size() > 6 && name.substr(0, 6) == "uverbs";
}

std::set<std::string> nodes_present() {
  std::set<std::string> nodes;
  DIR* dir = ::opendir(kSysfsNodes);
  if (dir == nullptr) return nodes;  // no RDMA subsystem: no device
  while (const dirent* entry = ::readdir(dir)) {
    if (is_uverbs_node(entry->d_name)) nodes.insert(entry->d_name);
  }
  ::closedir(dir);
  return nodes;
}

// One uevent: "ACTION@DEVPATH\0KEY=VALUE\0...". The change it means for an
// uverbs node, if any.
std::optional<std::pair<DeviceChange, std::string>> parse_uevent(const char* data,
                                                                 std::size_t size) {
  std::string_view action, subsystem, devname;
  for (std::size_t at = 0; at < size;) {
    const std::string_view field(data + at, ::strnlen(data + at, size - at));
    at += field.size() + 1;
    if (field.substr(0, 7) == "ACTION=") action = field.substr(7);
    if (field.substr(0, 10) == "SUBSYSTEM=") subsystem = field.substr(10);
    if (field.substr(0, 8) == "DEVNAME=") devname = field.substr(8);
  }
  if (subsystem != "infiniband_verbs") return std::nullopt;
  const auto slash = devname.rfind('/');
  const std::string_view node = slash == std::string_view::npos ? devname : devname.substr(slash + 1);
  if (!is_uverbs_node(node)) return std::nullopt;
  if (action == "add") return std::make_pair(DeviceChange::kAdded, std::string(node));
  if (action == "remove") return std::make_pair(DeviceChange::kRemoved, std::string(node));
  return std::nullopt;
}

}  // namespace

// One way of noticing (Dispatcher::Options::device_monitor): its fd, and
// serve(), which reads what the fd says and tells the tracker each change.
class DeviceTracker::Monitor {
 public:
  explicit Monitor(int fd) : fd_(fd) {}
  virtual ~Monitor() = default;
  int fd() const noexcept { return fd_.get(); }
  // The fd is readable: at most kMessagesPerTurn reads.
  virtual void serve(DeviceTracker& tracker) noexcept = 0;

 private:
  FileDescriptor fd_;
};

namespace {

// The kernel's uevents: ACTION=add|remove of SUBSYSTEM=infiniband_verbs.
class UeventMonitor final : public DeviceTracker::Monitor {
 public:
  UeventMonitor() : Monitor(open_socket()) {
    // A burst of uevents (a hundred netdevs going) must not overflow it; a
    // lost one is recovered by a rescan anyway.
    const int buffer = 1 << 20;
    if (::setsockopt(fd(), SOL_SOCKET, SO_RCVBUFFORCE, &buffer, sizeof buffer) != 0) {
      ::setsockopt(fd(), SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);
    }
    sockaddr_nl address{};
    address.nl_family = AF_NETLINK;
    address.nl_groups = 1;  // the kernel's uevents (2 is udev's re-broadcast)
    if (::bind(fd(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
      throw_system_error("bind(NETLINK_KOBJECT_UEVENT)", errno);
    }
  }

  void serve(DeviceTracker& tracker) noexcept override {
    alignas(8) char buffer[8192];
    for (int i = 0; i < kMessagesPerTurn; ++i) {
      sockaddr_nl sender{};
      iovec io{buffer, sizeof buffer};
      msghdr message{};
      message.msg_name = &sender;
      message.msg_namelen = sizeof sender;
      message.msg_iov = &io;
      message.msg_iovlen = 1;
      const ssize_t n = ::recvmsg(fd(), &message, 0);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        if (errno == EINTR) continue;
        if (errno == ENOBUFS) {  // the kernel dropped some: ask the truth
          tracker.rescan();
          continue;
        }
        tracker.report_verb("recvmsg(NETLINK_KOBJECT_UEVENT)", errno);
        return;
      }
      if (sender.nl_pid != 0) continue;  // only the kernel speaks here
      if (auto change = parse_uevent(buffer, static_cast<std::size_t>(n))) {
        tracker.apply(change->first, change->second);
      }
    }
  }

 private:
  static int open_socket() {
    const int fd = ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
                            NETLINK_KOBJECT_UEVENT);
    if (fd < 0) throw_system_error("socket(NETLINK_KOBJECT_UEVENT)", errno);
    return fd;
  }
};

// /dev/infiniband's nodes made and deleted, and /dev for the folder itself.
class InotifyMonitor final : public DeviceTracker::Monitor {
 public:
  InotifyMonitor() : Monitor(open_inotify()) {
    dev_watch_ = ::inotify_add_watch(fd(), "/dev", IN_CREATE | IN_MOVED_TO | IN_ONLYDIR);
    if (dev_watch_ < 0) throw_system_error("inotify_add_watch(/dev)", errno);
    // Absent until the first device: /dev's watch says when it comes.
    watch_folder();
  }

  void serve(DeviceTracker& tracker) noexcept override {
    alignas(8) char buffer[8192];
    for (int i = 0; i < kMessagesPerTurn; ++i) {
      const ssize_t n = ::read(fd(), buffer, sizeof buffer);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        if (errno == EINTR) continue;
        tracker.report_verb("read(inotify)", errno);
        return;
      }
      bool reconcile = false;
      for (ssize_t at = 0; at < n;) {
        inotify_event event;
        std::memcpy(&event, buffer + at, sizeof event);
        const std::string name = event.len > 0 ? std::string(buffer + at + sizeof event) : "";
        at += static_cast<ssize_t>(sizeof event + event.len);
        if ((event.mask & IN_Q_OVERFLOW) != 0) reconcile = true;
        if (event.wd == dev_watch_ && name == "infiniband") {
          // The folder came: watch it, and look, as its first nodes may have
          // been made before the watch was.
          watch_folder();
          reconcile = true;
        } else if (event.wd == folder_watch_ && is_uverbs_node(name)) {
          if ((event.mask & (IN_CREATE | IN_MOVED_TO)) != 0) {
            tracker.apply(DeviceChange::kAdded, name);
          }
          if ((event.mask & (IN_DELETE | IN_MOVED_FROM)) != 0) {
            tracker.apply(DeviceChange::kRemoved, name);
          }
        }
      }
      if (reconcile) tracker.rescan();
    }
  }

 private:
  static int open_inotify() {
    const int fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd < 0) throw_system_error("inotify_init1", errno);
    return fd;
  }
  void watch_folder() noexcept {
    folder_watch_ = ::inotify_add_watch(
        fd(), kDevFolder, IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_ONLYDIR);
  }

  int dev_watch_ = -1;     // /dev
  int folder_watch_ = -1;  // /dev/infiniband
};

// A look at /sys/class/infiniband_verbs every kRescanPeriod.
class RescanMonitor final : public DeviceTracker::Monitor {
 public:
  RescanMonitor() : Monitor(open_timer()) {
    itimerspec period{};
    period.it_interval.tv_nsec =
        std::chrono::duration_cast<std::chrono::nanoseconds>(kRescanPeriod).count();
    period.it_value = period.it_interval;
    if (::timerfd_settime(fd(), 0, &period, nullptr) != 0) {
      throw_system_error("timerfd_settime", errno);
    }
  }

  void serve(DeviceTracker& tracker) noexcept override {
    std::uint64_t expirations;
    if (::read(fd(), &expirations, sizeof expirations) < 0) {
      if (errno != EAGAIN && errno != EINTR) tracker.report_verb("read(timerfd)", errno);
      return;
    }
    tracker.rescan();
  }

 private:
  static int open_timer() {
    const int fd = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (fd < 0) throw_system_error("timerfd_create", errno);
    return fd;
  }
};

std::unique_ptr<DeviceTracker::Monitor> open_monitor(DeviceMonitor kind) {
  switch (kind) {
    case DeviceMonitor::kUevents:
      return std::make_unique<UeventMonitor>();
    case DeviceMonitor::kInotify:
      return std::make_unique<InotifyMonitor>();
    case DeviceMonitor::kRescan:
      return std::make_unique<RescanMonitor>();
    default:
      throw std::invalid_argument("DeviceTracker: no such kind");
  }
}

}  // namespace

std::shared_ptr<DeviceTracker> DeviceTracker::start(const std::shared_ptr<Reactor>& reactor,
                                                    DeviceMonitor wanted) {
  std::unique_ptr<Monitor> monitor;
  DeviceMonitor kind = wanted;
  if (wanted == DeviceMonitor::kAuto) {
    for (DeviceMonitor candidate :
         {DeviceMonitor::kUevents, DeviceMonitor::kInotify, DeviceMonitor::kRescan}) {
      try {
        monitor = open_monitor(candidate);
        kind = candidate;
        break;
      } catch (const std::system_error&) {
        if (candidate == DeviceMonitor::kRescan) throw;
      }
    }
  } else {
    monitor = open_monitor(wanted);
  }
  const int fd = monitor->fd();
  auto tracker = std::make_shared<DeviceTracker>(reactor, kind, std::move(monitor));
  // Known before the first message, so that each message is a change.
  tracker->present_ = nodes_present();
  tracker->served_ = watch_fd(
      reactor, fd, EPOLLIN,
      [weak = std::weak_ptr<DeviceTracker>(tracker)](std::uint32_t) {
        if (auto self = weak.lock()) self->monitor_->serve(*self);
      },
      {});
  return tracker;
}

DeviceTracker::DeviceTracker(std::shared_ptr<Reactor> reactor, DeviceMonitor kind,
                             std::unique_ptr<Monitor> monitor)
    : reactor_(std::move(reactor)), kind_(kind), monitor_(std::move(monitor)) {}

DeviceTracker::~DeviceTracker() { served_.release(); }

void DeviceTracker::rescan() noexcept {
  std::set<std::string> now;
  try {
    now = nodes_present();
  } catch (const std::exception& e) {  // an allocation: its only way to fail
    report_verb("DeviceTracker::rescan", errno_of(e));
    return;
  }
  const std::set<std::string> known = present_;
  for (const std::string& node : known) {
    if (now.count(node) == 0) apply(DeviceChange::kRemoved, node);
  }
  for (const std::string& node : now) {
    if (known.count(node) == 0) apply(DeviceChange::kAdded, node);
  }
}

void DeviceTracker::apply(DeviceChange change, const std::string& node) noexcept {
  auto reactor = reactor_.lock();
  if (!reactor) return;
  IBEV_ASSERT_DISPATCHING(*reactor);  // present_ is its own
  const auto report = [reactor](const Failure& failure, const auto&) {
    reactor->report(failure);
  };
  try {
    if (change == DeviceChange::kAdded) {
      if (present_.count(node) != 0) return;  // said already (inotify, then a rescan)
      auto before = std::make_shared<const std::set<std::string>>(present_);
      present_.insert(node);
      watchers_.snapshot().deliver(Notice{std::move(before), std::make_pair(change, node)},
                                   "device watcher", report);
      return;
    }
    if (present_.count(node) == 0) return;
    auto before = std::make_shared<const std::set<std::string>>(present_);
    present_.erase(node);
    // The devices first (their listeners hear DEVICE_FATAL, device clients'
    // remove among them, last, and the Device closes), then the watchers.
    losses_.snapshot().deliver(node, "device loss", report);
    watchers_.snapshot().deliver(Notice{std::move(before), std::make_pair(change, node)},
                                 "device watcher", report);
  } catch (const std::exception& e) {  // a set's or a snapshot's allocation
    reactor->report(Failure::verb_failed("DeviceTracker", errno_of(e), e.what()));
  }
}

Handle DeviceTracker::track(std::string node, std::function<void()> lose) {
  return losses_.add(std::make_shared<Loss>(
      [node = std::move(node), lose = std::move(lose)](const std::string& removed) {
        if (removed == node) lose();
      }));
}

Handle DeviceTracker::watch(DeviceWatcher watcher) {
  // Caught up on its first call: every node present then, as kAdded, so
  // that it hears a consistent history however the registration races the
  // kernel. A posted empty round makes that first call come promptly.
  auto caught_up = std::make_shared<bool>(false);
  Handle handle = watchers_.add(std::make_shared<Watcher>(
      [watcher = std::move(watcher), caught_up](const Notice& notice) {
        if (!*caught_up) {
          *caught_up = true;
          for (const std::string& node : *notice.present) watcher(DeviceChange::kAdded, node);
        }
        if (notice.change) watcher(notice.change->first, notice.change->second);
      }));
  if (auto reactor = reactor_.lock()) {
    reactor->post([weak = weak_from_this()] {
      auto self = weak.lock();
      auto reactor = self ? self->reactor_.lock() : nullptr;
      if (!reactor) return;
      self->watchers_.snapshot().deliver(
          Notice{std::make_shared<const std::set<std::string>>(self->present_), std::nullopt},
          "device watcher",
          [reactor](const Failure& failure, const Notice&) { reactor->report(failure); });
    });
  }
  return handle;
}

void DeviceTracker::report_verb(const char* verb, int error) noexcept {
  if (auto reactor = reactor_.lock()) {
    reactor->report(Failure::verb_failed(verb, error, "noticing RDMA devices come and go"));
  }
}

}  // namespace ibev::detail
