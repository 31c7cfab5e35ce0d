// ibev::Dispatcher: one epoll loop that reads every watched device's async
// events and every watched completion channel, and hands them to a Registry
// and to completion handlers.
//
// Async events follow the ibv_get_async_event(3) rules: each event is read,
// resolved in the Registry (who hears it is decided now), acked to rdma-core,
// and only then delivered. So destroying an object never waits for the
// dispatcher (rdma-core's destroy waits for the object's read events to be
// acked), from any thread or from inside the object's own handler, and an
// event is never delivered to a newer object that reuses a destroyed one's
// address.
//
// Completions follow ibv_get_cq_event(3): watch_completions() arms the CQ
// before returning (stage I); on each channel event the dispatcher takes it,
// counts it for acking, drains the CQ in batches into the handler, re-arms,
// and drains again before it sleeps (stage II): the handler's reply does not
// wait for the re-arm, and nothing landing around the re-arm is missed. A
// channel that serves one CQ (the default: each CompletionQueue has its own)
// is drained even before its event is read, so that a reply costs no system
// call after the wake-up. A
// completion that lands between re-arm and last drain is drained at once and
// leaves an event with nothing to poll: that empty event is expected and
// counted, not an error. Acks are amortised: one
// ibv_ack_cq_events per `ack_batch` events; releasing the watch acks the rest,
// so ibv_destroy_cq never blocks.
//
// Threads: handlers (the Registry's and completion handlers) run on the thread
// that dispatches: the Dispatcher's own thread between start() and stop(), or
// the caller of run_once() for applications that drive dispatch from their
// own loop (fd() is the epoll fd to wait on). All other members may be called
// from any thread. Releasing a Watch from another thread waits until the
// dispatcher is not using the watched object any more (after which the object
// may be destroyed); from inside a handler it does not wait, and the
// dispatcher does not touch the object again.
//
// Fork: in a child forked after the Dispatcher was made, every Watch and the
// Dispatcher itself are inert: releasing or destroying them touches neither
// the parent's epoll set nor its fds' flags (nor acks its CQ events), and
// start() and run_once() throw. As rdma-core's objects are not usable in the
// child (ibv_fork_init(3)), a child may only drop what it inherited, or exec.
//
// Lifetime: the Registry must outlive the Dispatcher. Watches may outlive it.
// Errors in the loop (a failing verb, a throwing completion handler) never
// stop dispatch: they go to Options::on_error and are counted.
#ifndef IBEV_DISPATCH_DISPATCHER_H_
#define IBEV_DISPATCH_DISPATCHER_H_

#include <infiniband/verbs.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>

#include <ibev/core/event.h>
#include <ibev/core/registry.h>
#include <ibev/dispatch/watch.h>

namespace ibev {

namespace detail {
struct DispatcherState;
struct CqEntry;
}  // namespace detail

// The work completions one ibv_poll_cq returned.
struct CompletionBatch {
  ibv_cq* cq;
  const ibv_wc* data;
  std::size_t size;
  const ibv_wc* begin() const noexcept { return data; }
  const ibv_wc* end() const noexcept { return data + size; }
};

using CompletionHandler = std::function<void(const CompletionBatch&)>;

struct CompletionOptions {
  // Ack completion events with one ibv_ack_cq_events per this many.
  unsigned ack_batch = 32;
  // Work completions taken per ibv_poll_cq (1..256).
  unsigned poll_batch = 16;
  // Arm for solicited completions only.
  bool solicited_only = false;
  // Adaptive mode, like NAPI: after an event, keep polling the CQ until it has
  // been empty for this long (0: off), then arm and drain once more before
  // sleeping. Saves the event round trip under load, costs this much spinning
  // per burst. At most 1 s. A turn of polling lasts at most this long too
  // (and at most `budget` completions): then the CQ yields to the other
  // sources and is polled again on the next turn, still unarmed.
  std::chrono::microseconds poll_budget{0};
  // Work completions this CQ may take per turn, like the kernel's
  // IB_POLL_BUDGET_IRQ: a CQ under sustained inflow then delays other CQs,
  // async events and stop() by one turn at most. A CQ that used its budget is
  // served again next turn before the dispatcher sleeps. At least 1.
  unsigned budget = 256;
};

struct CompletionStats {
  std::uint64_t events = 0;        // channel events taken for this CQ
  std::uint64_t ack_calls = 0;     // ibv_ack_cq_events calls made for it
  std::uint64_t empty_events = 0;  // events whose drain found nothing
  std::uint64_t completions = 0;   // work completions handed to the handler
  std::uint64_t polled = 0;        // of those, found by adaptive polling
  std::uint64_t yields = 0;        // turns that ended on the budget
};

// A CQ's completion watch: the handle, and the CQ's figures.
class [[nodiscard]] CompletionWatch {
 public:
  CompletionWatch() = default;
  void release() noexcept { watch_.release(); }
  bool active() const noexcept { return watch_.active(); }
  CompletionStats stats() const noexcept;

 private:
  friend class Dispatcher;
  CompletionWatch(std::shared_ptr<const detail::CqEntry> entry, Watch watch)
      : entry_(std::move(entry)), watch_(std::move(watch)) {}

  std::shared_ptr<const detail::CqEntry> entry_;
  Watch watch_;
};

struct DispatcherStats {
  std::uint64_t async_events = 0;  // read from rdma-core (and acked)
  std::uint64_t injected = 0;
  std::uint64_t devices_lost = 0;  // async fds that failed; DEVICE_FATAL sent
  std::uint64_t completion_events = 0;
  std::uint64_t cq_ack_calls = 0;
  std::uint64_t empty_completion_events = 0;
  // Reads of a completion channel that found no event (EAGAIN): wasted
  // system calls, none while each channel's reads stay within its CQs.
  std::uint64_t empty_channel_reads = 0;
  std::uint64_t work_completions = 0;
  std::uint64_t errors = 0;  // reported to Options::on_error
};

class Dispatcher {
 public:
  struct Options {
    // Events taken from one source per pass before the next source's turn
    // (from a completion channel, also no more than the CQs it serves).
    unsigned batch = 16;
    // Called on the dispatching thread with what went wrong. The default
    // writes to stderr.
    std::function<void(std::string_view)> on_error;
  };

  // Builds the epoll loop; starts no thread. Throws std::system_error
  // (epoll_create1, eventfd) on failure.
  explicit Dispatcher(Registry& registry);
  Dispatcher(Registry& registry, Options options);
  // stop(), then closes the loop: every fd still watched gets its flags back
  // and watches still held become inert; injected events never dispatched are
  // reported to Options::on_error. From inside one of its own handlers it
  // does not wait: the thread finishes that handler, stops, and cleans up.
  ~Dispatcher();
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  // Starts the dispatcher thread. Throws std::logic_error if it is running,
  // from the dispatcher thread, or in a forked child.
  void start();
  // Wakes the thread and joins it: it returns when the handler running now
  // (if any) has returned, however long that takes; ibev does not interrupt
  // handlers. Any thread may call it, several at once. From inside a handler
  // it only asks the thread to stop (it cannot join itself); start() or the
  // destructor joins.
  void stop();
  bool running() const noexcept;
  bool in_dispatcher_thread() const noexcept;

  // For applications with their own loop: wait on fd() (readable when there
  // is work), then call run_once(). Dispatches what is ready, waiting up to
  // `timeout` for something; returns how many sources it served. Throws
  // std::logic_error while the dispatcher thread runs or another run_once()
  // is in progress.
  int fd() const noexcept;
  std::size_t run_once(std::chrono::milliseconds timeout);

  // Watches `device`'s async fd (made non-blocking; restored on release).
  // When the fd fails (EPOLLERR/EPOLLHUP, or a read error but EAGAIN) the
  // device is gone: its listeners get a synthesized DEVICE_FATAL and the fd
  // is no longer watched. Throws std::invalid_argument (null, already
  // watched) or std::system_error (fcntl, epoll_ctl).
  [[nodiscard]] Watch watch(ibv_context* device);

  // Delivers `handler` the completions of `cq`, created on `channel`, and
  // arms the CQ before returning: the CQ must have no completion yet that the
  // caller wants delivered. Several CQs may share a channel. Throws
  // std::invalid_argument (null, empty handler, a CQ of another channel or
  // already watched, a batch out of range) or std::system_error (fcntl,
  // epoll_ctl, ibv_req_notify_cq).
  [[nodiscard]] CompletionWatch watch_completions(ibv_comp_channel* channel,
                                                  ibv_cq* cq,
                                                  CompletionHandler handler,
                                                  CompletionOptions options = {});

  // Sends a synthesized event through the same resolve/deliver path, on the
  // dispatching thread; never acked to rdma-core. Who hears it is resolved
  // now, as for a real event read now. Throws std::invalid_argument as
  // Event::synthesize does.
  void inject(ibv_context* device, int code, Element element);

  DispatcherStats stats() const noexcept;

 private:
  void loop();

  std::shared_ptr<detail::DispatcherState> state_;
  std::mutex control_;                  // start() and stop() among app threads
  std::unique_ptr<std::thread> thread_;  // between start() and its join
};

}  // namespace ibev

#endif  // IBEV_DISPATCH_DISPATCHER_H_
