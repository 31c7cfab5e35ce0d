// What ibev-watch exposes to Prometheus (docs/operations.md lists it): its
// own families, counted from the events its listeners hear and the devices
// its client sees come and go, kept by device name across a device's
// removal and re-add, then the library's (verbs/prometheus_counters.h: the Registry's
// counters, unclaimed events included, and each port's state and GIDs).
//
// Threads: event(), added() and removed() run on the Dispatcher's thread;
// render() on a scraping thread (HTTP, the textfile writer). The mutex is a
// leaf, held to update or copy, never across a call out; render() formats
// a copy, so a scrape never holds up delivery or a device's removal.
#ifndef IBEV_APPS_IBEV_WATCH_WATCH_METRICS_H_
#define IBEV_APPS_IBEV_WATCH_WATCH_METRICS_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ibev/core/event.h>
#include <ibev/core/thread_annotations.h>
#include <ibev/dispatch/dispatcher.h>
#include <ibev/verbs/device.h>

namespace ibev::watch {

class WatchMetrics {
 public:
  using Clock = std::chrono::system_clock;

  // `changed` runs after each update (on the updating thread); may be empty.
  explicit WatchMetrics(std::function<void()> changed = {}) : changed_(std::move(changed)) {}

  void event(const Event& event, const std::string& device, Clock::time_point time);
  void added(const std::string& device);
  void removed(const std::string& device, DeviceLoss loss);
  // A scrape or textfile write that failed (ibev_watch_scrape_errors_total).
  void scrape_error() noexcept { scrape_errors_.fetch_add(1, std::memory_order_relaxed); }

  // The whole exposition: ibev-watch's families, then write_metrics(devices).
  std::string render(const Dispatcher& dispatcher,
                     const std::vector<std::shared_ptr<Device>>& devices) const;

 private:
  struct State {
    // device, port ("" off port events), event, element
    std::map<std::tuple<std::string, std::string, std::string, std::string>, std::uint64_t> events;
    std::map<std::pair<std::string, std::string>, double> last_port_event;  // device, port
    std::map<std::string, std::uint64_t> additions;
    std::map<std::pair<std::string, std::string>, std::uint64_t> removals;  // device, reason
  };

  void update(const std::function<void(State&)>& change) IBEV_EXCLUDES(mutex_);

  const std::function<void()> changed_;
  mutable detail::Mutex mutex_;
  State state_ IBEV_GUARDED_BY(mutex_);
  std::atomic<std::uint64_t> scrape_errors_{0};
};

}  // namespace ibev::watch

#endif  // IBEV_APPS_IBEV_WATCH_WATCH_METRICS_H_
