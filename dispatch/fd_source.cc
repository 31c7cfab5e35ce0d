// An application's fd in the loop (an rdma_cm event channel, a timerfd, a
// socket): level-triggered, one handler call per turn while it is ready. On
// an executor the fd leaves the epoll interest set (EPOLL_CTL_MOD to no
// events) until the handler's call has returned and re-arms it, so that an
// fd the executor has not read yet does not make every turn spin.
//
// Timers are timerfds served so; call_every's tasks of one period share one
// (a PeriodicGroup, at the end).
//
// Locking: none of its own; the reactor's table guards joining and leaving,
// the CallGuard a release's wait. call_every takes the reactor's
// periodic_mutex, and the table's lock under it (making a group's timer),
// never the other way round; a group is destroyed under neither.
#include <fcntl.h>
#include <sys/timerfd.h>
#include <unistd.h>
#include <sys/epoll.h>

#include <atomic>
#include <cerrno>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>

#include <ibev/core/route.h>
#include <ibev/core/subscriber_lists.h>
#include "reactor.h"
#include "sources.h"

namespace ibev::detail {
namespace {

class FdSource final : public Source, public std::enable_shared_from_this<FdSource> {
 public:
  FdSource(std::weak_ptr<Reactor> reactor, int fd, int flags, std::uint32_t events,
           FdHandler handler, Executor executor)
      : Source(fd, flags),
        reactor_(std::move(reactor)),
        events_(events),
        handler_(std::move(handler)),
        executor_(std::move(executor)) {}

  std::uint32_t interest() const noexcept override { return events_; }

  void serve(std::uint32_t revents) noexcept override {
    auto reactor = reactor_.lock();
    if (!reactor) return;
    IBEV_ASSERT_DISPATCHING(*reactor);
    bump(reactor->stats().fd_events);
    if (!executor_) {
      call(*reactor, revents);
      return;
    }
    set_interest(*reactor, 0);
    const bool handed = hand_to(
        executor_, guard(),
        [&] {
          return [self = shared_from_this(), revents]() noexcept {
            if (auto reactor = self->reactor_.lock()) {
              self->call(*reactor, revents);
              self->set_interest(*reactor, self->events_);
            }
          };
        },
        "an fd's task", [&](Failure failure) { report(*reactor, std::move(failure)); });
    if (!handed) set_interest(*reactor, events_);
  }

 private:
  void call(Reactor& reactor, std::uint32_t revents) noexcept {
    reported_call("fd handler", [&] { handler_(revents); },
                  [&](Failure failure) { report(reactor, std::move(failure)); });
  }

  void set_interest(Reactor& reactor, std::uint32_t events) noexcept {
    if (guard().closed()) return;  // released: out of the set already
    epoll_event event{};
    event.events = events;
    event.data.u64 = id();
    if (::epoll_ctl(reactor.epoll_fd(), EPOLL_CTL_MOD, fd(), &event) != 0 &&
        errno != ENOENT) {
      report(reactor, Failure::verb_failed("epoll_ctl(EPOLL_CTL_MOD)", errno));
    }
  }

  void report(Reactor& reactor, Failure failure) noexcept {
    failure.object = this;
    failure.what += " (fd " + std::to_string(fd()) + ")";
    reactor.report(failure);
  }

  const std::weak_ptr<Reactor> reactor_;
  const std::uint32_t events_;
  const FdHandler handler_;
  const Executor executor_;
};

}  // namespace

Handle watch_fd(const std::shared_ptr<Reactor>& reactor, int fd, std::uint32_t events,
                FdHandler handler, Executor executor) {
  const std::string verb = "Dispatcher::watch_fd";
  if (fd < 0) throw std::invalid_argument(verb + ": the fd is negative");
  if (events == 0) throw std::invalid_argument(verb + ": no events to wait for");
  if (!handler) throw std::invalid_argument(verb + ": the handler is empty");
  if ((events & (EPOLLET | EPOLLONESHOT)) != 0) {
    throw std::invalid_argument(verb + ": sources are level-triggered; no EPOLLET or "
                                       "EPOLLONESHOT");
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0) throw_system_error("fcntl(F_GETFL)", errno);
  std::uint64_t id;
  {
    MutexLock lock(reactor->mutex());
    if (reactor->find_fd_locked(fd)) {
      throw std::invalid_argument(verb + ": the fd is watched already");
    }
    auto source = std::make_shared<FdSource>(reactor, fd, flags, events, std::move(handler),
                                             std::move(executor));
    reactor->add_locked(source);
    id = source->id();
  }
  return Reactor::handle_for(reactor, id);
}

// A one-shot timerfd served as an application fd: read, then `task`, once.
// The handle's release also closes the timer's fd, after its watch.
namespace {

timespec to_timespec(std::chrono::milliseconds duration) {
  // A zero it_value disarms a timerfd: the shortest delay is 1 ns.
  const auto ns = std::max<std::int64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(duration).count(), 1);
  return {static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
}

// A timerfd in the loop: first `delay` from now, then every `period` (zero:
// once). Expirations the loop was too busy to see run the task once.
Handle timer(const std::shared_ptr<Reactor>& reactor, std::chrono::milliseconds delay,
             std::chrono::milliseconds period, Task task, Executor executor) {
  const int timer = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (timer < 0) throw_system_error("timerfd_create", errno);
  itimerspec when{};
  when.it_value = to_timespec(delay);
  if (period.count() > 0) when.it_interval = to_timespec(period);
  Handle watch;
  try {
    if (::timerfd_settime(timer, 0, &when, nullptr) != 0) {
      throw_system_error("timerfd_settime", errno);
    }
    watch = watch_fd(
        reactor, timer, EPOLLIN,
        [timer, task = std::move(task)](std::uint32_t) {
          std::uint64_t expirations;
          if (::read(timer, &expirations, sizeof expirations) > 0) task();
        },
        std::move(executor));
  } catch (...) {
    ::close(timer);
    throw;
  }
  auto held = std::make_shared<Handle>(std::move(watch));
  return Handle([held, timer]() noexcept {
    held->release();
    ::close(timer);
  });
}

}  // namespace

Handle call_after(const std::shared_ptr<Reactor>& reactor, std::chrono::milliseconds delay,
                  Task task, Executor executor) {
  if (delay.count() < 0) throw std::invalid_argument("Dispatcher::call_after: negative delay");
  if (!task) throw std::invalid_argument("Dispatcher::call_after: the task is empty");
  return timer(reactor, delay, std::chrono::milliseconds{0}, std::move(task), std::move(executor));
}

// call_every: the tasks of one period share one timerfd, a PeriodicGroup,
// so that a thousand connections' keepalives of 1 s wake the loop once a
// second, not a thousand times, and their probes leave together (their
// completions then come in a few CQ events, not one each). A task joins its
// group's next expiry: its first run is within a period of call_every, not
// exactly a period after. Its subscription is the routing primitive's
// (core/route.h): its executor, its guard, the wait rule of its release.
// One tick serves the whole group in one turn, as one source.
//
// A group lives while a task of it is subscribed: the last release takes
// its timer out and releases it, closing the timerfd before it returns (a
// tick being served meanwhile holds the group, dead, for that tick only);
// a dead group is never joined. The timer's callback holds the group
// weakly.

// One run of a task at a time: a tick that finds its last run still waiting
// for (or running on) its executor passes it by, as the loop's own late
// periods merge into one run; an executor's queue never grows by a task a
// period. The run clears the mark, and so does an executor that refuses it
// (throws); one that takes a run and drops it unrun stops the task.
struct OneRunAtATime {
  std::shared_ptr<std::atomic<bool>> running = std::make_shared<std::atomic<bool>>(false);
  bool matches(std::uint64_t) const noexcept { return !running->exchange(true); }
};
using PeriodicTask = Subscriber<std::uint64_t, OneRunAtATime>;

struct PeriodicGroup {
  BroadcastList<PeriodicTask> tasks;
  Mutex mutex;  // after the reactor's periodic_mutex
  std::size_t members IBEV_GUARDED_BY(mutex) = 0;
  bool dead IBEV_GUARDED_BY(mutex) = false;
  Handle timer IBEV_GUARDED_BY(mutex);
};

namespace {

// The group's timer: every member not released and not still running, told
// in registration order. A task that destroyed the Dispatcher ends it: the
// members after it are not run (each run checks, the executors' too).
void serve_group(const std::weak_ptr<PeriodicGroup>& weak, const std::weak_ptr<Reactor>& reactor) {
  auto group = weak.lock();
  if (!group) return;
  group->tasks.snapshot().deliver(0, "a periodic task",
                                  [reactor](const Failure& failure, std::uint64_t) {
                                    if (auto live = reactor.lock()) live->report(failure);
                                  });
}

}  // namespace

Handle call_every(const std::shared_ptr<Reactor>& reactor, std::chrono::milliseconds period,
                  Task task, Executor executor) {
  if (period.count() <= 0) {
    throw std::invalid_argument("Dispatcher::call_every: the period must be positive");
  }
  if (!task) throw std::invalid_argument("Dispatcher::call_every: the task is empty");
  // The subscriber first: nothing can fail between joining a group and
  // holding the handle that leaves it.
  OneRunAtATime once;
  if (executor) {
    // A refused run is reported (core/route.h) and the next tick tries again.
    executor = [inner = std::move(executor), running = once.running](Task run) {
      try {
        inner(std::move(run));
      } catch (...) {
        *running = false;
        throw;
      }
    };
  }
  auto subscriber = std::make_shared<PeriodicTask>(
      [task = std::move(task), running = once.running,
       weak_reactor = std::weak_ptr<Reactor>(reactor)](std::uint64_t) {
        struct Done {
          std::atomic<bool>& running;
          ~Done() { running = false; }
        } done{*running};
        auto live = weak_reactor.lock();
        if (live && !live->shut.load()) task();
      },
      once, std::move(executor));
  std::shared_ptr<PeriodicGroup> group;
  std::shared_ptr<PeriodicGroup> stale;  // a dead group found: let go after the locks
  {
    MutexLock lock(reactor->periodic_mutex);
    for (auto it = reactor->periodic_groups.begin(); it != reactor->periodic_groups.end();) {
      it = it->second.expired() ? reactor->periodic_groups.erase(it) : std::next(it);
    }
    auto& slot = reactor->periodic_groups[period.count()];
    group = slot.lock();
    if (group) {
      MutexLock members(group->mutex);
      if (group->dead) {
        stale = std::move(group);
      } else {
        ++group->members;
      }
    }
    if (!group) {
      group = std::make_shared<PeriodicGroup>();
      Handle ticks = timer(
          reactor, period, period,
          [weak = std::weak_ptr<PeriodicGroup>(group),
           weak_reactor = std::weak_ptr<Reactor>(reactor)] { serve_group(weak, weak_reactor); },
          {});
      // Nobody else sees the group yet; the lock is for the analysis. Taken
      // after timer(), which takes the table's.
      MutexLock members(group->mutex);
      group->members = 1;
      group->timer = std::move(ticks);
      slot = group;
    }
  }
  // Leaves the group: the last member stops its timer, released outside
  // every lock (it waits for a tick being served on another thread).
  auto leave = [](const std::shared_ptr<PeriodicGroup>& group) noexcept {
    Handle timer;
    {
      MutexLock lock(group->mutex);
      if (--group->members == 0) {
        group->dead = true;
        timer = std::move(group->timer);
      }
    }
  };
  try {
    auto joined = std::make_shared<Handle>(group->tasks.add(std::move(subscriber)));
    // In a forked child the handle touches nothing of the parent's.
    return Handle([group, joined = std::move(joined), leave,
                   process = reactor->process()]() noexcept {
      if (process.inherited()) return;
      joined->release();
      leave(group);
    });
  } catch (...) {
    leave(group);
    throw;
  }
}

}  // namespace ibev::detail
