// ibev::Dispatcher: one epoll loop that serves every device's async events,
// every completion channel and any fd the application adds, and routes async
// events through the Registry it carries.
//
// Async events follow the ibv_get_async_event(3) rules: each event is read,
// resolved in registry() (who hears it is decided now), acked to rdma-core,
// and only then delivered. So destroying an object never waits for the
// dispatcher (rdma-core's destroy waits for the object's read events to be
// acked), from any thread or from inside the object's own handler, and an
// event is never delivered to a newer object that reuses a destroyed one's
// address.
//
// Completions follow ibv_get_cq_event(3): watch_completions() arms the CQ
// before returning; on each channel event the dispatcher takes it, counts it
// for acking, drains the CQ into the handler, re-arms, and drains again
// before it sleeps: nothing landing around the re-arm is missed. Acks are
// amortised (one ibv_ack_cq_events per `ack_batch` events); releasing the
// handle acks the rest, so ibv_destroy_cq never blocks. dispatch/completions.h
// has the modes and options.
//
// Turns are bounded: each source is served once per turn within its budget
// (a CQ: CompletionOptions::budget work completions; a device or channel:
// Options::batch events; posted tasks and injected events: Options::batch;
// an application fd: one call), so one busy CQ delays every other source,
// and stop(), by one turn at most.
//
// Threads. Handlers run on the dispatching thread unless their subscription
// names an Executor (core/executor.h): the Dispatcher's own thread between
// start() and stop(), or the caller of run_once() for applications that
// drive dispatch from their own loop (wait for fd() to be readable;
// dispatch/asio.h does it for a Boost.Asio io_context). start(), stop() and
// run_once() are the controlling calls: one thread drives dispatch at a
// time, and they say so with std::logic_error. Every other member may be
// called from any thread.
//
// Handles. Every watch returns a Handle (core/handle.h) with its wait rule.
//
// Failures never stop dispatch. Each is one Failure (core/failure.h) to
// Options::on_failure, counted. Events nobody dispatches are noticed too: a
// watchdog reports kUndispatched when events have waited `stall_after`
// without a turn (start() forgotten, run_once() not called), and kStalled
// when one turn (a handler) holds the dispatching thread that long.
//
// Lifetime: what was made through a Dispatcher may outlive it. Handles are
// inert then; the verbs/ wrappers (a Device, what is made on it) may still
// be dropped or close()d, which runs their destroy verbs only, and their
// calls that need the Dispatcher (making a CQ, a drain) throw ENODEV. CM
// ids and DeviceClients are the exception: the Dispatcher must outlive them
// (cm/cm_id.h, verbs/device_clients.h). Outliving is after the destructor
// returned: a call on another thread that reaches the Dispatcher (making a
// CQ, a drain, Device::dispatcher()) must not race its destruction. Its
// destructor stops it; every fd still watched gets its flags back, and tasks
// or injected events never dispatched are reported. What it would have run
// is destroyed then, on the destroying thread (a handler, a timer's task,
// call_every's tasks): a task that holds its own Handle does not keep
// itself alive past the Dispatcher.
// From inside one of its own handlers it does not wait for the thread (which
// cannot join itself), but it has let go of every watched fd when it
// returns: the thread then only returns from that handler, touching no fd
// or object of the application's (no handler is called again), and ends
// (thread_exited()).
//
// Fork: in a child forked after the Dispatcher was made, every handle and
// the Dispatcher itself are inert: releasing or destroying them touches
// neither the parent's epoll set nor its fds' flags (nor acks its CQ
// events), and start() and run_once() throw; so are the verbs/ wrappers
// (verbs/ownership.h: no destroy verb runs on the uverbs file the child
// shares with the parent). As rdma-core's objects are not usable in the
// child (ibv_fork_init(3)), a child may only drop what it inherited, or
// exec.
#ifndef IBEV_DISPATCH_DISPATCHER_H_
#define IBEV_DISPATCH_DISPATCHER_H_

#include <infiniband/verbs.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include <ibev/core/event.h>
#include <ibev/core/executor.h>
#include <ibev/core/failure.h>
#include <ibev/core/handle.h>
#include <ibev/core/registry.h>
#include <ibev/core/stats.h>
#include <ibev/core/thread_annotations.h>
#include <ibev/dispatch/completions.h>

namespace ibev {

namespace detail {
class DeviceTracker;
class Reactor;
class Watchdog;
}  // namespace detail

// turns: turns completed; async_events: read from rdma-core (and acked);
// injected: events inject() sent; devices_lost: async fds that failed (a
// DEVICE_FATAL was sent); completion_events, cq_ack_calls,
// empty_completion_events, work_completions: all CQs' figures together;
// empty_channel_reads: reads of a completion channel that found no event
// (wasted system calls); fd_events: calls of watch_fd() handlers; failures:
// Failures reported.
#define IBEV_DISPATCHER_STATS(X)                                          \
  X(turns) X(async_events) X(injected) X(devices_lost) X(completion_events) \
  X(cq_ack_calls) X(empty_completion_events) X(empty_channel_reads)       \
  X(work_completions) X(fd_events) X(failures)
IBEV_DECLARE_STATS(DispatcherStats, IBEV_DISPATCHER_STATS);

// Called with what epoll reported for the fd (EPOLLIN, EPOLLERR, ...).
using FdHandler = std::function<void(std::uint32_t revents)>;

// How a Dispatcher notices RDMA devices come and go (docs/design.md, "Device
// lifecycle"). The kernel removes a device's uverbs node ~0.1 s into a delete
// and then waits for every process to close the device; noticing the node go
// is what lets ibev close it.
enum class DeviceMonitor : std::uint8_t {
  kAuto,     // the first that starts of the three below
  kUevents,  // the kernel's NETLINK_KOBJECT_UEVENT messages
  kInotify,  // /dev/infiniband's nodes (no uevent socket, as in some containers)
  kRescan,   // /sys/class/infiniband_verbs, every 250 ms
  kOff,      // not noticed: a removed device stays open until closed
};
std::string_view to_string(DeviceMonitor monitor) noexcept;

enum class DeviceChange : std::uint8_t { kAdded, kRemoved };
// `node`: the device's uverbs node, as ibv_device::dev_name says ("uverbs0");
// a device re-added under the same name may get another.
using DeviceWatcher = std::function<void(DeviceChange change, const std::string& node)>;

// How a device's resolved async events reach its handlers; by default
// Registry::deliver. The Device wrapper puts the kernel's cache refresh and
// its own end around it (verbs/device.h).
using AsyncDelivery = std::function<void(Delivery delivery)>;

class Dispatcher {
 public:
  struct Options {
    // Events taken from a device's async fd or a completion channel per turn
    // (from a channel, also no more than the CQs it serves), and posted tasks
    // (injected events among them) run per turn.
    unsigned batch = 16;
    // Every Failure of this Dispatcher and its Registry; empty: stderr.
    FailureSink on_failure;
    // The watchdog's threshold (see above); zero: no watchdog.
    std::chrono::milliseconds stall_after{1000};
    // Started with the first watch_async_events() or watch_devices().
    DeviceMonitor device_monitor = DeviceMonitor::kAuto;
  };

  // Builds the epoll loop and the registry; starts no dispatching thread.
  // Throws std::system_error (epoll_create1, eventfd) or
  // std::invalid_argument (batch 0).
  Dispatcher();
  explicit Dispatcher(Options options);
  ~Dispatcher();
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  // Where this Dispatcher routes async events; lives as long as it does.
  Registry& registry() noexcept;
  // For objects made through this Dispatcher that may outlive it (the
  // verbs/ wrappers): its Registry, alive while the pointer is held, and a
  // reference to the Dispatcher that expires when its destructor starts.
  // Past the Dispatcher its handles are inert and its Registry's failures go
  // to stderr (Options::on_failure may be gone with it).
  std::shared_ptr<Registry> shared_registry() const noexcept;
  std::weak_ptr<Dispatcher> weak_ref() const noexcept { return self_; }

  // Starts the dispatcher thread. Throws std::logic_error if it is running,
  // from the dispatcher thread, while run_once() runs, or in a forked child.
  void start();
  // Wakes the thread and joins it: it returns when the handler running now
  // (if any) has returned; ibev does not interrupt handlers. Any thread may
  // call it, several at once. From inside a handler it only asks the thread
  // to stop (it cannot join itself); start() or the destructor joins.
  void stop();
  bool running() const noexcept;
  // True on the dispatching thread: the one running a turn now, the
  // Dispatcher's own thread between start() and stop(), or the caller of
  // run_once() (an io_context's thread, dispatch/asio.h) during that call.
  // Cheap (an atomic load): what must run there asserts it in debug builds
  // with IBEV_ASSERT_DISPATCHING(dispatcher) (core/thread_annotations.h).
  bool in_dispatcher_thread() const noexcept;
  // Ready once the thread the last start() began is done (at once when none
  // was started): it has let go of the reactor and touches nothing more. For
  // a Dispatcher destroyed from one of its own handlers, whose thread cannot
  // join itself: take this in the handler, before the destruction, and wait
  // on it before the process exits.
  std::shared_future<void> thread_exited() const;

  // For applications with their own loop: wait for fd() to be readable, then
  // call run_once(). Runs one turn, waiting up to `timeout` for something;
  // returns how many sources it served. Throws std::logic_error while the
  // dispatcher thread runs or another run_once() is in progress.
  int fd() const noexcept;
  std::size_t run_once(std::chrono::milliseconds timeout);

  // Serves `device`'s async events (its fd made non-blocking; restored on
  // release), delivered through `deliver` if given. The device is lost when
  // its uverbs node is removed (DeviceLoss::kRemoved; see DeviceMonitor), its
  // fd fails (EPOLLERR/EPOLLHUP, or a read error but EAGAIN:
  // kAsyncFdFailed, also reported as a kDeviceLost Failure), or the kernel
  // says DEVICE_FATAL (kFatal): the fd is no longer watched, and its
  // listeners get DEVICE_FATAL carrying that loss (synthesized, but for
  // the kernel's own). Throws std::invalid_argument (null, already watched)
  // or std::system_error (fcntl, epoll_ctl; the device monitor's calls).
  Handle watch_async_events(ibv_context* device, AsyncDelivery deliver = {});

  // `watcher` hears, on the dispatching thread, kAdded for every device
  // present (from the next turn), then every device added or removed, in
  // the order the kernel announced them; a removal after the removed
  // device's listeners heard DEVICE_FATAL. Throws std::invalid_argument
  // (empty, monitor kOff) or std::system_error (the monitor's calls).
  Handle watch_devices(DeviceWatcher watcher);
  // The monitor running; kOff until the first watch that needs it.
  DeviceMonitor device_monitor() const;

  // Delivers `handler` the completions of `cq`, which must have a completion
  // channel, and arms the CQ before returning: the CQ must have no
  // completion yet that the caller wants delivered. Several CQs may share a
  // channel. Throws std::invalid_argument (null, no channel, kPolled, empty
  // handler, already watched, options out of range) or std::system_error
  // (fcntl, epoll_ctl, ibv_req_notify_cq).
  Handle watch_completions(ibv_cq* cq, CompletionOptions options,
                           CompletionHandler handler);
  // The figures of a CQ watched now; zeros for one that is not.
  CompletionStats completion_stats(ibv_cq* cq) const;
  // A completion of watched `cq` that is not the application's: the one of a
  // work request posted with `wr_id` on QP `qp_num` (a drain's marker, as
  // the kernel's ib_drain_qp posts). It never reaches the CQ's handler;
  // `taken` runs once instead, right after the handler had the completions
  // polled before it (on the CQ's executor, if it has one). Release the
  // handle to stop waiting. Throws std::invalid_argument (not watched here,
  // empty callback).
  Handle take_completion(ibv_cq* cq, std::uint32_t qp_num, std::uint64_t wr_id,
                         std::function<void(const ibv_wc&)> taken);

  // Any other fd in the same loop (an rdma_cm event channel, a timerfd, a
  // socket): `handler` is called once per turn while the fd is ready for
  // `events` (level-triggered; it reads the fd itself, whose flags ibev
  // leaves alone). On an executor, the fd is not watched again until the
  // handler's call has returned, so a slow executor does not spin the loop.
  // Throws std::invalid_argument (negative fd, no events, empty handler, fd
  // already watched) or std::system_error (epoll_ctl).
  Handle watch_fd(int fd, std::uint32_t events, FdHandler handler,
                  Executor executor = {});

  // Runs `task` on the dispatching thread, in posting order: on the next
  // turn, or a later one when more than Options::batch tasks wait (turns
  // follow without sleeping). A task that throws is reported (kHandlerThrew).
  void post(Task task);
  // Runs `task` once, `delay` from now, in a turn (on `executor` if given):
  // a one-shot timerfd in the loop. Releasing the handle cancels it (with
  // the wait rule). Throws std::invalid_argument (negative delay, empty
  // task) or std::system_error (timerfd_create, timerfd_settime, epoll_ctl).
  Handle call_after(std::chrono::milliseconds delay, Task task, Executor executor = {});
  // Runs `task` every `period` until the handle is released (with the wait
  // rule). Tasks of the same period share one periodic timerfd, one read a
  // period for all of them, so they run together: a task's first run comes
  // within `period` from now, at its group's next expiry. Periods the loop
  // was too busy to see run it once, not once each; on an executor, a run
  // not yet run there is not handed again (an executor that takes a run and
  // drops it unrun stops the task). A release waits for its own task only
  // (the wait rule), never for the period's other tasks, nor for a tick in
  // progress on another thread. Throws
  // std::invalid_argument (a period not above zero, empty task) or what
  // call_after throws.
  Handle call_every(std::chrono::milliseconds period, Task task, Executor executor = {});

  // Sends a synthesized event through the same resolve/deliver path, on the
  // dispatching thread; never acked to rdma-core. Who hears it is resolved
  // now, as for a real event read now. Throws std::invalid_argument as
  // Event::synthesize does.
  void inject(ibv_context* device, int code, Element element);
  // The same for an object named by its number (core/event.h's
  // ObjectNumber): it reaches the handlers attached by that number (a
  // QueuePair's are), as a source of such events (DevX) would send it.
  // Since 0.8 inject is overloaded: code that takes its address
  // (`std::mem_fn`, a bind) names the one it means, e.g.
  // `static_cast<void (Dispatcher::*)(ibv_context*, int, Element)>(&Dispatcher::inject)`.
  void inject(ibv_context* device, int code, ObjectNumber object);

  DispatcherStats stats() const noexcept;

 private:
  void inject(const Event& event);
  // Owns nothing (a no-op deleter): weak_ref()'s anchor, reset first thing
  // in the destructor.
  std::shared_ptr<Dispatcher> self_;
  std::shared_ptr<detail::Reactor> reactor_;
  mutable detail::Mutex control_;  // start() and stop() among app threads
  // Between start() and its join.
  std::unique_ptr<std::thread> thread_ IBEV_GUARDED_BY(control_);
  // Its own lock, never held across a join: a handler may ask for it while
  // stop() on another thread holds `control_` and waits for that handler.
  mutable detail::Mutex exited_mutex_;
  // The last started thread's.
  std::shared_future<void> thread_exited_ IBEV_GUARDED_BY(exited_mutex_);
  std::unique_ptr<detail::Watchdog> watchdog_;
  std::shared_ptr<detail::DeviceTracker> tracker() IBEV_EXCLUDES(tracker_mutex_);
  mutable detail::Mutex tracker_mutex_;
  // Made by the first watch needing it.
  std::shared_ptr<detail::DeviceTracker> tracker_ IBEV_GUARDED_BY(tracker_mutex_);
};

}  // namespace ibev

#endif  // IBEV_DISPATCH_DISPATCHER_H_
