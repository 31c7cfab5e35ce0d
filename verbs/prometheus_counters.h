// ibev::write_metrics: ibev's in-process counters in the Prometheus text
// format (formats/prometheus_text.h), for an application to serve on its own
// /metrics endpoint (or write for node_exporter's textfile collector)
// without ibev-watch:
//
//   std::ostringstream text;
//   ibev::write_metrics(text, dispatcher, clients.devices());
//
// It writes the Dispatcher's figures (DispatcherStats, as
// ibev_dispatcher_<name>_total), each device's async events delivered,
// unclaimed and whose handler threw, per event (the Registry's counters),
// its failures, and each port's state and GID count as last cached
// (Device::cached_port: no system call). Labels: `device`, `event` (the
// ibv_event_type enumerator, e.g. IBV_EVENT_PORT_ERR), `port`. A device's
// counters start at zero when it is opened again (a re-added device), which
// Prometheus reads as a counter reset. docs/operations.md lists the names.
//
// Thread-safety: any thread, while the Dispatcher lives; it takes the locks
// of a counter read and never waits for a handler, so it may run on the
// dispatching thread or beside a device's removal, which it never delays.
// A device closed meanwhile is left out.
#ifndef IBEV_VERBS_PROMETHEUS_COUNTERS_H_
#define IBEV_VERBS_PROMETHEUS_COUNTERS_H_

#include <memory>
#include <ostream>
#include <vector>

#include <ibev/dispatch/dispatcher.h>
#include <ibev/verbs/device.h>

namespace ibev {

void write_metrics(std::ostream& out, const Dispatcher& dispatcher,
                   const std::vector<std::shared_ptr<Device>>& devices);

}  // namespace ibev

#endif  // IBEV_VERBS_PROMETHEUS_COUNTERS_H_
