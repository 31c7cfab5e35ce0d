// Internal to dispatch/: which RDMA devices exist, as the kernel announces
// them, for the Dispatcher's device watchers and its async sources.
//
// A device is known by its uverbs node ("uverbs0": ibv_device::dev_name, the
// DEVNAME of its uevents), never by its name, which a re-added device reuses.
// The kernel removes that node at the start of a delete (~0.1 s in), before
// the delete blocks for the processes still holding the device: noticing it
// is what lets ibev close the device so the delete can finish.
//
// Dispatching thread only, after construction, for everything but watch(),
// track() and their handles' release (any thread).
#ifndef IBEV_DISPATCH_DEVICE_TRACKER_H_
#define IBEV_DISPATCH_DEVICE_TRACKER_H_

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include <ibev/core/handle.h>
#include <ibev/core/subscriber_lists.h>
#include <ibev/dispatch/dispatcher.h>
#include "reactor.h"

namespace ibev::detail {

class DeviceTracker : public std::enable_shared_from_this<DeviceTracker> {
 public:
  // Starts noticing through `wanted` (kAuto: uevents, else inotify, else
  // rescans). Throws std::system_error naming the call that failed when the
  // kind asked for (or, for kAuto, every kind) cannot start.
  static std::shared_ptr<DeviceTracker> start(const std::shared_ptr<Reactor>& reactor,
                                              DeviceMonitor wanted);
  ~DeviceTracker();

  DeviceMonitor kind() const noexcept { return kind_; }

  // `lose` runs on the dispatching thread when `node` is removed, before any
  // watcher hears of it.
  Handle track(std::string node, std::function<void()> lose);
  // See Dispatcher::watch_devices.
  Handle watch(DeviceWatcher watcher);

  class Monitor;  // one way of noticing, serving itself: device_tracker.cc
  // For start() (make_shared): only device_tracker.cc can make a Monitor.
  DeviceTracker(std::shared_ptr<Reactor> reactor, DeviceMonitor kind,
                std::unique_ptr<Monitor> monitor);

  // For the monitors, which serve themselves (device_tracker.cc) and tell
  // what they read. rescan(): compares the nodes present now with what is
  // known, applying the difference: at start, after lost uevents, and as
  // the kRescan kind.
  void rescan() noexcept;
  void apply(DeviceChange change, const std::string& node) noexcept;
  void report_verb(const char* verb, int error) noexcept;

 private:
  // What watchers hear: the nodes present before a change, then the change
  // (none for a watcher's first call, which only catches it up).
  // Held by value: a subscriber's argument is copied into its executor's
  // task.
  struct Notice {
    std::shared_ptr<const std::set<std::string>> present;
    std::optional<std::pair<DeviceChange, std::string>> change;
  };
  // A removal, for its device's async source: the removed node.
  using Loss = Subscriber<std::string>;
  using Watcher = Subscriber<Notice>;

  const std::weak_ptr<Reactor> reactor_;
  const DeviceMonitor kind_;
  std::unique_ptr<Monitor> monitor_;
  Handle served_;
  std::set<std::string> present_;  // uverbs nodes
  BroadcastList<Loss> losses_;
  BroadcastList<Watcher> watchers_;
};

}  // namespace ibev::detail

#endif  // IBEV_DISPATCH_DEVICE_TRACKER_H_
