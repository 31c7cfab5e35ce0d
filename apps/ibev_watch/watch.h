// What ibev-watch does with devices and their events: Watch is its device
// client (each device, or each named one, listened to from when it is added
// until it is removed), Printer writes the lines (format.h) or journal
// entries (journal.h), WatchMetrics counts for Prometheus (watch_metrics.h), and
// the counts are what --count prints at exit.
//
// A removed device is let go at once, so that its delete never waits for
// ibev-watch.
//
// Threads and locking: handlers and the client's add/remove run on the
// Dispatcher's thread; wait_added() and counts() on main's. Printer's mutex
// is a leaf (one line at a time). Watch's mutex guards its listeners and
// counts; it is held across a listener's release and the Registry's
// counters (which take the Registry's own locks, never this one), and never
// while a handler or a client runs: add() subscribes before taking it, and
// remove() runs on the dispatching thread, where a listener's release does
// not wait.
#ifndef IBEV_APPS_IBEV_WATCH_WATCH_H_
#define IBEV_APPS_IBEV_WATCH_WATCH_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <ibev/core/registry.h>
#include <ibev/core/thread_annotations.h>
#include <ibev/verbs/device.h>
#include <ibev/verbs/device_clients.h>

#include "apps/ibev_watch/format.h"
#include "apps/ibev_watch/watch_metrics.h"

namespace ibev::watch {

// Where the lines go: stdout (human or JSON), or the systemd journal
// (journal.h). While there is no journal (a container, a host without
// systemd, journald stopped) or it refuses an entry, the human line goes to
// stdout instead: never dropped. Each such stretch is said once on stderr,
// from the first line it touches (or from begin()), and its end too.
enum class Output { kHuman, kJson, kJournal };

class Printer {
 public:
  explicit Printer(Output output) : output_(output) {}

  // The recording's header line, first (JSON only); with kJournal, says on
  // stderr when there is no journal to write to.
  void begin();

  void event(const Event& event, const std::string& device, Clock::time_point time);
  void change(const Device& device, bool added, DeviceLoss loss, Clock::time_point time);

 private:
  void print(const std::string& line) IBEV_EXCLUDES(mutex_);
  // Journal entries: `error` from journal.h (0: taken), `line` the text
  // printed when it was not.
  void journaled(int error, const std::string& line) IBEV_EXCLUDES(mutex_);

  const Output output_;
  detail::Mutex mutex_;  // one line at a time
  bool journal_lost_ IBEV_GUARDED_BY(mutex_) = false;
};

// Events seen, per device name and event, across a device's removals and
// re-adds: the Registry forgets a device once it is closed.
using Counts = std::map<std::string, std::map<std::string, std::uint64_t>>;

void print_counts(const Counts& counts, bool json);

class Watch {
 public:
  // `only`: the device names to watch; empty, every device.
  Watch(Registry& registry, Printer& printer, WatchMetrics& metrics, std::vector<std::string> only)
      : registry_(registry), printer_(printer), metrics_(metrics), only_(std::move(only)) {}

  // To register with DeviceClients; this Watch must outlive the registration.
  DeviceClient client();

  // Until each of `names` was added once, or `limit` passed.
  bool wait_added(const std::vector<std::string>& names, std::chrono::milliseconds limit);

  // Those removed, and those of `open` still watched.
  Counts counts(const std::vector<std::shared_ptr<Device>>& open);
  // Those of `open` watched (DeviceClients opens every device; -d narrows).
  std::vector<std::shared_ptr<Device>> watched(const std::vector<std::shared_ptr<Device>>& open);

 private:
  bool wanted(const std::string& name) const;
  void add(const std::shared_ptr<Device>& device) IBEV_EXCLUDES(mutex_);
  void remove(const std::shared_ptr<Device>& device, DeviceLoss loss) IBEV_EXCLUDES(mutex_);

  Registry& registry_;
  Printer& printer_;
  WatchMetrics& metrics_;
  const std::vector<std::string> only_;
  detail::Mutex mutex_;
  std::condition_variable added_;
  std::set<std::string> added_names_ IBEV_GUARDED_BY(mutex_);
  std::map<const Device*, Handle> listeners_ IBEV_GUARDED_BY(mutex_);
  Counts removed_counts_ IBEV_GUARDED_BY(mutex_);
};

}  // namespace ibev::watch

#endif  // IBEV_APPS_IBEV_WATCH_WATCH_H_
