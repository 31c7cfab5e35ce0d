// The Dispatcher facade: the threads (the dispatching thread and the
// watchdog) and the controlling calls. The loop itself is the reactor
// (reactor.cc); each kind of source serves itself (async_event_source.cc,
// completion_source.cc, fd_source.cc).
//
// Locking: `control_` serialises start() and stop() (and the thread handle)
// among application threads; the dispatching thread takes it only when a
// handler destroys the Dispatcher. `exited_mutex_` guards thread_exited()'s
// future alone, never across a join, so a handler may ask for it while
// stop() waits for that handler. The watchdog has its own mutex, for its
// sleep; it takes no other lock.
#include <ibev/dispatch/dispatcher.h>

#include <algorithm>
#include <condition_variable>
#include <future>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "device_tracker.h"
#include "reactor.h"
#include "sources.h"

namespace ibev {
namespace detail {

// Notices events nobody dispatches and turns that hold the dispatching
// thread: it looks every quarter of `stall_after`, and says each stall once.
class Watchdog {
 public:
  Watchdog(std::shared_ptr<Reactor> reactor, std::chrono::milliseconds stall_after)
      : reactor_(std::move(reactor)),
        stall_after_(stall_after),
        thread_([this] { run(); }) {}

  ~Watchdog() {
    {
      MutexLock lock(mutex_);
      done_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

 private:
  using Clock = std::chrono::steady_clock;

  void run() {
    const auto period = std::max<Clock::duration>(stall_after_ / 4, std::chrono::milliseconds(1));
    std::uint64_t seen_turns = reactor_->turns();
    std::uint64_t reported_turns = ~std::uint64_t{0};
    std::optional<Clock::time_point> waiting_since;
    UniqueLock lock(mutex_);
    while (!wake_.wait_for(lock.native(), period, [this]() IBEV_REQUIRES(mutex_) { return done_; })) {
      const auto now = Clock::now();
      const std::uint64_t turns = reactor_->turns();
      if (turns != seen_turns) {  // dispatch moves: a new episode
        seen_turns = turns;
        waiting_since.reset();
      }
      if (const std::int64_t started = reactor_->turn_started_ns(); started != 0) {
        const auto held = now.time_since_epoch() - std::chrono::nanoseconds(started);
        if (held >= stall_after_ && reported_turns != turns) {
          reported_turns = turns;
          report(Failure::Kind::kStalled,
                 "one turn has held the dispatching thread for " + ms(held) +
                     ": a handler blocks (give it an executor, or do less in it)");
        }
        continue;
      }
      if (!reactor_->work_waiting()) {
        waiting_since.reset();
        continue;
      }
      if (!waiting_since) waiting_since = now;
      if (now - *waiting_since >= stall_after_ && reported_turns != turns) {
        reported_turns = turns;
        report(Failure::Kind::kUndispatched,
               "events have waited " + ms(now - *waiting_since) +
                   " with no turn: call start(), or run_once() when fd() is readable");
      }
    }
  }

  static std::string ms(Clock::duration d) {
    return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) +
           " ms";
  }

  void report(Failure::Kind kind, std::string what) {
    Failure failure;
    failure.kind = kind;
    failure.verb = "Dispatcher";
    failure.what = std::move(what);
    reactor_->report(failure);
  }

  const std::shared_ptr<Reactor> reactor_;
  const std::chrono::milliseconds stall_after_;
  Mutex mutex_;
  std::condition_variable wake_;
  bool done_ IBEV_GUARDED_BY(mutex_) = false;
  std::thread thread_;  // last: starts when the rest is ready
};

namespace {

// The dispatcher thread's body. It holds the reactor, not the Dispatcher: a
// handler may destroy the Dispatcher, and the loop then ends after it.
void run_loop(const std::shared_ptr<Reactor>& reactor) {
  reactor->dispatcher_thread = std::this_thread::get_id();
  while (!reactor->stop_requested.load()) reactor->run_turn(-1);
  reactor->dispatcher_thread = std::thread::id{};
}

void require_owner_process(const Reactor& reactor, const char* verb) {
  if (!reactor.in_owner_process()) {
    throw std::logic_error(std::string(verb) +
                           ": in a forked child; only the process that made the "
                           "Dispatcher can dispatch (ibv_fork_init(3))");
  }
}

}  // namespace
}  // namespace detail

Dispatcher::Dispatcher() : Dispatcher(Options{}) {}

Dispatcher::Dispatcher(Options options) : self_(this, [](Dispatcher*) {}) {
  std::promise<void> none_started;
  none_started.set_value();
  thread_exited_ = none_started.get_future().share();
  if (options.batch == 0) {
    throw std::invalid_argument("Dispatcher: Options::batch must be at least 1");
  }
  if (options.stall_after.count() < 0) {
    throw std::invalid_argument("Dispatcher: Options::stall_after is negative");
  }
  const auto stall_after = options.stall_after;
  reactor_ = std::make_shared<detail::Reactor>(std::move(options));
  if (stall_after.count() > 0) {
    watchdog_ = std::make_unique<detail::Watchdog>(reactor_, stall_after);
  }
}

Dispatcher::~Dispatcher() {
  self_.reset();
  if (!reactor_->in_owner_process()) {
    // A forked child's copy: the parent's threads do not exist here, and the
    // epoll set and fds are the parent's. Nothing to join, nothing to undo.
    static_cast<void>(thread_.release());    // leaked on purpose
    static_cast<void>(watchdog_.release());  // leaked on purpose
    return;
  }
  watchdog_.reset();
  if (in_dispatcher_thread()) {
    // Destroyed by one of its own handlers: the thread cannot join itself.
    // Every fd is let go of here, before the application may close one; the
    // thread, which holds the reactor, only returns from the handler (the
    // reactor serves nothing once orphaned) and ends: thread_exited() says
    // when. The lock: start() may still be publishing the handle of this
    // very thread (a handler can run before start() returns).
    {
      detail::MutexLock lock(control_);
      reactor_->orphaned = true;
      reactor_->stop_requested = true;
      if (thread_) thread_->detach();
    }
    reactor_->shut_down();  // destroys pending work: under no ibev lock
    reactor_->registry().detach_failure_sink();
    return;
  }
  stop();
  reactor_->shut_down();
  reactor_->registry().detach_failure_sink();
}

Registry& Dispatcher::registry() noexcept { return reactor_->registry(); }

std::shared_ptr<Registry> Dispatcher::shared_registry() const noexcept {
  return std::shared_ptr<Registry>(reactor_, &reactor_->registry());
}

void Dispatcher::start() {
  detail::require_owner_process(*reactor_, "Dispatcher::start");
  if (in_dispatcher_thread()) {
    throw std::logic_error("Dispatcher::start: called from the dispatcher thread");
  }
  detail::MutexLock lock(control_);
  if (thread_) {
    if (!reactor_->stop_requested.load()) {
      throw std::logic_error("Dispatcher::start: the dispatcher thread is running");
    }
    thread_->join();  // stopped from inside a handler, not joined yet
    thread_.reset();
  }
  if (reactor_->driving.load()) {
    throw std::logic_error("Dispatcher::start: run_once() is in progress");
  }
  reactor_->stop_requested = false;
  reactor_->thread_running = true;
  std::promise<void> exited;
  {
    detail::MutexLock exited_lock(exited_mutex_);
    thread_exited_ = exited.get_future().share();
  }
  thread_ = std::make_unique<std::thread>(
      [reactor = reactor_, exited = std::move(exited)]() mutable {
        detail::run_loop(reactor);
        reactor.reset();  // the last owner, once orphaned: ends here, not after
        // Its last act (set_value_at_thread_exit's ordering is invisible to TSan).
        exited.set_value();
      });
}

std::shared_future<void> Dispatcher::thread_exited() const {
  detail::MutexLock lock(exited_mutex_);
  return thread_exited_;
}

void Dispatcher::stop() {
  if (in_dispatcher_thread()) {  // it cannot join itself: start() or ~ will
    reactor_->stop_requested = true;
    reactor_->wake();
    return;
  }
  detail::MutexLock lock(control_);
  if (!thread_ || !reactor_->in_owner_process()) return;
  reactor_->stop_requested = true;
  reactor_->wake();
  thread_->join();
  thread_.reset();
  reactor_->thread_running = false;
}

bool Dispatcher::running() const noexcept {
  return reactor_->thread_running.load() && !reactor_->stop_requested.load();
}

bool Dispatcher::in_dispatcher_thread() const noexcept {
  return reactor_->in_dispatcher_thread();
}

int Dispatcher::fd() const noexcept { return reactor_->epoll_fd(); }

std::size_t Dispatcher::run_once(std::chrono::milliseconds timeout) {
  detail::require_owner_process(*reactor_, "Dispatcher::run_once");
  if (running()) {
    throw std::logic_error("Dispatcher::run_once: the dispatcher thread is running");
  }
  // Its own hold on the reactor: a handler may destroy the Dispatcher, and
  // the turn ends after it.
  const std::shared_ptr<detail::Reactor> reactor = reactor_;
  if (reactor->driving.exchange(true)) {
    throw std::logic_error("Dispatcher::run_once: called again while running");
  }
  const auto previous = reactor->dispatcher_thread.exchange(std::this_thread::get_id());
  struct Restore {
    detail::Reactor& reactor;
    std::thread::id previous;
    ~Restore() {
      reactor.dispatcher_thread = previous;
      reactor.driving = false;
    }
  } restore{*reactor, previous};
  return reactor->run_turn(static_cast<int>(timeout.count()));
}

Handle Dispatcher::watch_async_events(ibv_context* device, AsyncDelivery deliver) {
  return detail::watch_async_events(reactor_, device, std::move(deliver), tracker().get());
}

std::shared_ptr<detail::DeviceTracker> Dispatcher::tracker() {
  if (reactor_->options().device_monitor == DeviceMonitor::kOff) return nullptr;
  detail::MutexLock lock(tracker_mutex_);
  if (!tracker_) tracker_ = detail::DeviceTracker::start(reactor_, reactor_->options().device_monitor);
  return tracker_;
}

Handle Dispatcher::watch_devices(DeviceWatcher watcher) {
  if (!watcher) throw std::invalid_argument("Dispatcher::watch_devices: the watcher is empty");
  auto tracker = this->tracker();
  if (!tracker) {
    throw std::invalid_argument(
        "Dispatcher::watch_devices: Options::device_monitor is kOff");
  }
  return tracker->watch(std::move(watcher));
}

DeviceMonitor Dispatcher::device_monitor() const {
  detail::MutexLock lock(tracker_mutex_);
  return tracker_ ? tracker_->kind() : DeviceMonitor::kOff;
}

std::string_view to_string(DeviceMonitor monitor) noexcept {
  switch (monitor) {
    case DeviceMonitor::kAuto:
      return "auto";
    case DeviceMonitor::kUevents:
      return "uevents";
    case DeviceMonitor::kInotify:
      return "inotify";
    case DeviceMonitor::kRescan:
      return "rescan";
    case DeviceMonitor::kOff:
      return "off";
  }
  return "unknown";
}

Handle Dispatcher::watch_completions(ibv_cq* cq, CompletionOptions options,
                                     CompletionHandler handler) {
  return detail::watch_completions(reactor_, cq, std::move(options), std::move(handler));
}

CompletionStats Dispatcher::completion_stats(ibv_cq* cq) const {
  return detail::completion_stats(*reactor_, cq);
}

Handle Dispatcher::call_after(std::chrono::milliseconds delay, Task task, Executor executor) {
  return detail::call_after(reactor_, delay, std::move(task), std::move(executor));
}

Handle Dispatcher::call_every(std::chrono::milliseconds period, Task task, Executor executor) {
  return detail::call_every(reactor_, period, std::move(task), std::move(executor));
}

Handle Dispatcher::take_completion(ibv_cq* cq, std::uint32_t qp_num, std::uint64_t wr_id,
                                   std::function<void(const ibv_wc&)> taken) {
  return detail::take_completion(*reactor_, cq, qp_num, wr_id, std::move(taken));
}

Handle Dispatcher::watch_fd(int fd, std::uint32_t events, FdHandler handler,
                            Executor executor) {
  return detail::watch_fd(reactor_, fd, events, std::move(handler), std::move(executor));
}

void Dispatcher::post(Task task) {
  if (!task) throw std::invalid_argument("Dispatcher::post: the task is empty");
  reactor_->post(std::move(task));
}

void Dispatcher::inject(ibv_context* device, int code, Element element) {
  inject(Event::synthesize(device, code, element));
}

void Dispatcher::inject(ibv_context* device, int code, ObjectNumber object) {
  inject(Event::synthesize(device, code, object));
}

void Dispatcher::inject(const Event& event) {
  Registry& registry = reactor_->registry();
  auto delivery = std::make_shared<Delivery>(registry.resolve(event));
  detail::bump(reactor_->stats().injected);
  reactor_->post([&registry, delivery] { registry.deliver(*delivery); });
}

DispatcherStats Dispatcher::stats() const noexcept { return reactor_->stats().load(); }

}  // namespace ibev
