// ibev-watch's metrics (watch_metrics.h).
#include "apps/ibev_watch/watch_metrics.h"

#include <sstream>

#include <ibev/formats/prometheus_text.h>
#include <ibev/verbs/prometheus_counters.h>
#include <ibev/version.h>

#include "apps/ibev_watch/format.h"

namespace ibev::watch {

void WatchMetrics::update(const std::function<void(State&)>& change) {
  {
    detail::MutexLock lock(mutex_);
    change(state_);
  }
  if (changed_) changed_();
}

void WatchMetrics::event(const Event& event, const std::string& device, Clock::time_point time) {
  const std::string port = event.port() ? std::to_string(*event.port()) : "";
  const std::string name = enumerator_name(event.code());
  const double seconds = std::chrono::duration<double>(time.time_since_epoch()).count();
  update([&](State& state) {
    ++state.events[{device, port, name, std::string(to_string(event.element_kind()))}];
    if (!port.empty()) state.last_port_event[{device, port}] = seconds;
  });
}

void WatchMetrics::added(const std::string& device) {
  update([&](State& state) {
    ++state.additions[device];
    // Each removal series exists from 0 on, so that Prometheus's increase()
    // sees the first removal (a series born at 1 increased by nothing).
    for (const DeviceLoss loss : kDeviceLosses) {
      state.removals[{device, std::string(to_string(loss))}] += 0;
    }
  });
}

void WatchMetrics::removed(const std::string& device, DeviceLoss loss) {
  update([&](State& state) {
    ++state.removals[{device, std::string(to_string(loss))}];
  });
}

std::string WatchMetrics::render(const Dispatcher& dispatcher,
                                 const std::vector<std::shared_ptr<Device>>& devices) const {
  State state;
  {
    detail::MutexLock lock(mutex_);
    state = state_;
  }
  std::ostringstream out;
  MetricsText text(out);
  text.family("ibev_watch_up", MetricsText::kGauge, "1 while ibev-watch runs");
  text.sample({}, std::uint64_t{1});
  text.family("ibev_watch_build_info", MetricsText::kGauge, "ibev-watch's version, as a label");
  text.sample({{"version", IBEV_VERSION_STRING}}, std::uint64_t{1});
  text.family("ibev_watch_scrape_errors_total", MetricsText::kCounter,
              "Renders, accepts and textfile writes that failed");
  text.sample({}, scrape_errors_.load(std::memory_order_relaxed));
  text.family("ibev_watch_devices", MetricsText::kGauge, "RDMA devices watched now");
  // Every removal follows an addition of the same device.
  std::uint64_t present = 0;
  for (const auto& [device, count] : state.additions) present += count;
  for (const auto& [key, count] : state.removals) present -= count;
  text.sample({}, present);
  text.family("ibev_watch_device_additions_total", MetricsText::kCounter,
              "Devices added (those present at start included)");
  for (const auto& [device, count] : state.additions) text.sample({{"device", device}}, count);
  text.family("ibev_watch_device_removals_total", MetricsText::kCounter,
              "Devices removed, by reason (removed, fatal, async fd failed)");
  for (const auto& [key, count] : state.removals) {
    text.sample({{"device", key.first}, {"reason", key.second}}, count);
  }
  text.family("ibev_watch_events_total", MetricsText::kCounter,
              "Async events heard, by device, port (port events), event and element");
  for (const auto& [key, count] : state.events) {
    const auto& [device, port, event, element] = key;
    text.sample({{"device", device}, {"port", port}, {"event", event}, {"element", element}},
                count);
  }
  text.family("ibev_watch_port_last_event_timestamp_seconds", MetricsText::kGauge,
              "When the port's last event was heard (Unix time)");
  for (const auto& [key, seconds] : state.last_port_event) {
    text.sample({{"device", key.first}, {"port", key.second}}, seconds);
  }
  write_metrics(out, dispatcher, devices);
  return out.str();
}

}  // namespace ibev::watch
