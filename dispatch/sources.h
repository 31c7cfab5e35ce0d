// Internal to dispatch/: how the Dispatcher facade makes each kind of source.
// One file each: async_event_source.cc, completion_source.cc, fd_source.cc.
#ifndef IBEV_DISPATCH_SOURCES_H_
#define IBEV_DISPATCH_SOURCES_H_

#include <infiniband/verbs.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

#include <ibev/core/executor.h>
#include <ibev/core/handle.h>
#include <ibev/dispatch/completions.h>
#include <ibev/dispatch/dispatcher.h>

namespace ibev::detail {

class Reactor;
class DeviceTracker;

// `tracker`: null when devices are not monitored (DeviceMonitor::kOff).
Handle watch_async_events(const std::shared_ptr<Reactor>& reactor, ibv_context* device,
                          AsyncDelivery deliver, DeviceTracker* tracker);

Handle watch_completions(const std::shared_ptr<Reactor>& reactor, ibv_cq* cq,
                         CompletionOptions options, CompletionHandler handler);
CompletionStats completion_stats(Reactor& reactor, ibv_cq* cq);
Handle take_completion(Reactor& reactor, ibv_cq* cq, std::uint32_t qp_num, std::uint64_t wr_id,
                       std::function<void(const ibv_wc&)> taken);

Handle watch_fd(const std::shared_ptr<Reactor>& reactor, int fd, std::uint32_t events,
                FdHandler handler, Executor executor);
Handle call_after(const std::shared_ptr<Reactor>& reactor, std::chrono::milliseconds delay,
                  Task task, Executor executor);
Handle call_every(const std::shared_ptr<Reactor>& reactor, std::chrono::milliseconds period,
                  Task task, Executor executor);

}  // namespace ibev::detail

#endif  // IBEV_DISPATCH_SOURCES_H_
