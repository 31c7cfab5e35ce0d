// ibev's counters as Prometheus metrics (verbs/prometheus_counters.h).
#include <ibev/verbs/prometheus_counters.h>

#include <cstdint>
#include <string>
#include <utility>

#include <ibev/core/registry.h>
#include <ibev/formats/prometheus_text.h>

namespace ibev {
namespace {

struct DeviceCounters {
  std::string name;
  CounterSnapshot counters;
};

// One family per EventCounts member, a sample per device and event seen.
void write_event_family(MetricsText& text, const std::vector<DeviceCounters>& devices,
                        const char* name, const char* help, std::uint64_t EventCounts::*member) {
  text.family(name, MetricsText::kCounter, help);
  for (const DeviceCounters& device : devices) {
    for (int code = 0; code <= CounterSnapshot::kTrackedCodes; ++code) {
      const std::uint64_t value = device.counters.for_code(code).*member;
      if (value == 0) continue;
      text.sample({{"device", device.name}, {"event", CounterSnapshot::bucket_name(code)}}, value);
    }
  }
}

}  // namespace

void write_metrics(std::ostream& out, const Dispatcher& dispatcher,
                   const std::vector<std::shared_ptr<Device>>& devices) {
  MetricsText text(out);
  const DispatcherStats stats = dispatcher.stats();
#define IBEV_WRITE_DISPATCHER_STAT(name)                                                   \
  text.family("ibev_dispatcher_" #name "_total", MetricsText::kCounter,                    \
              "The Dispatcher's " #name " (DispatcherStats, ibev/dispatch/dispatcher.h)"); \
  text.sample({}, stats.name);
  IBEV_DISPATCHER_STATS(IBEV_WRITE_DISPATCHER_STAT)
#undef IBEV_WRITE_DISPATCHER_STAT

  // Read once, so that every family names the same devices.
  std::vector<DeviceCounters> counted;
  std::vector<std::pair<std::string, std::vector<CachedPort>>> ports;
  for (const std::shared_ptr<Device>& device : devices) {
    ibv_context* context = device->context();
    if (context == nullptr) continue;  // closed: its counters are gone
    counted.push_back({device->name(), device->registry().counters(context)});
    std::vector<CachedPort> cached;
    for (std::uint8_t port = 1; port <= device->port_count(); ++port) {
      cached.push_back(device->cached_port(port));
    }
    ports.emplace_back(device->name(), std::move(cached));
  }

  write_event_family(text, counted, "ibev_events_delivered_total",
                     "Async events that reached at least one handler", &EventCounts::delivered);
  write_event_family(text, counted, "ibev_events_unclaimed_total",
                     "Async events that reached no handler (no object or listener took them)",
                     &EventCounts::unclaimed);
  write_event_family(text, counted, "ibev_event_handler_failures_total",
                     "Event handler calls that threw", &EventCounts::handler_failures);
  text.family("ibev_completion_handler_failures_total", MetricsText::kCounter,
              "Completion handler calls that threw, on the device's CQs");
  for (const DeviceCounters& device : counted) {
    text.sample({{"device", device.name}}, device.counters.completion_handler_failures());
  }
  text.family("ibev_failures_total", MetricsText::kCounter,
              "Failures reported for the device, of any kind (ibev/core/failure.h)");
  for (const DeviceCounters& device : counted) {
    text.sample({{"device", device.name}}, device.counters.failures());
  }

  const auto write_port_family = [&](const char* name, const char* help,
                                     std::uint64_t (*value_of)(const CachedPort&)) {
    text.family(name, MetricsText::kGauge, help);
    for (const auto& [device, cached] : ports) {
      for (std::size_t i = 0; i < cached.size(); ++i) {
        text.sample({{"device", device}, {"port", std::to_string(i + 1)}}, value_of(cached[i]));
      }
    }
  };
  write_port_family("ibev_port_state",
                    "The port's ibv_port_state: 1 down, 2 init, 3 armed, 4 active, 5 active_defer",
                    [](const CachedPort& port) -> std::uint64_t { return port.attributes.state; });
  write_port_family("ibev_port_gids", "Valid entries of the port's GID table",
                    [](const CachedPort& port) -> std::uint64_t { return port.gids.size(); });
}

}  // namespace ibev
