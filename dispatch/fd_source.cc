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

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

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

namespace {

// watch_fd, and what timers need besides: `wait`, whether the release waits
// for a call of the handler in progress (Reactor::prepare_handle).
Handle watch(const std::shared_ptr<Reactor>& reactor, int fd, std::uint32_t events,
             FdHandler handler, Executor executor, bool wait) {
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
  auto handle = Reactor::prepare_handle(reactor, wait);
  MutexLock lock(reactor->mutex());
  if (reactor->find_fd_locked(fd)) {
    throw std::invalid_argument(verb + ": the fd is watched already");
  }
  auto source = std::make_shared<FdSource>(reactor, fd, flags, events, std::move(handler),
                                           std::move(executor));
  reactor->add_locked(source);
  return std::move(handle).joined(source->id());
}

}  // namespace

Handle watch_fd(const std::shared_ptr<Reactor>& reactor, int fd, std::uint32_t events,
                FdHandler handler, Executor executor) {
  return watch(reactor, fd, events, std::move(handler), std::move(executor), true);
}

// Timers: timerfds served as application fds, read, then the task run.
namespace {

timespec to_timespec(std::chrono::milliseconds duration) {
  // A zero it_value disarms a timerfd: the shortest delay is 1 ns.
  const auto ns = std::max<std::int64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(duration).count(), 1);
  return {static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
}

// A timerfd in the loop: first `delay` from now, then every `period` (zero:
// once). Expirations the loop was too busy to see run the task once.
// `wait`: whether the release waits for a run of `task` in progress (it then
// closes the timer's fd before it returns); without, the fd is its
// source's, closed as that goes (when a run in progress ends). Everything
// is allocated before the watch begins: when it throws, nothing is watched
// and no fd stays open.
struct WaitingTimer final : Registration {
  explicit WaitingTimer(int fd) noexcept : fd(fd) {}
  // The watch first: the fd closes when this goes, right after.
  void release() noexcept override { watch.release(); }
  const FileDescriptor fd;
  Handle watch;  // released before `fd` closes
};

Handle timer(const std::shared_ptr<Reactor>& reactor, std::chrono::milliseconds delay,
             std::chrono::milliseconds period, Task task, Executor executor, bool wait) {
  std::shared_ptr<WaitingTimer> waiting;
  std::shared_ptr<FileDescriptor> detached;
  const int fd = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (fd < 0) throw_system_error("timerfd_create", errno);
  try {
    if (wait) {
      waiting = std::make_shared<WaitingTimer>(fd);
    } else {
      detached = std::make_shared<FileDescriptor>(fd);
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  itimerspec when{};
  when.it_value = to_timespec(delay);
  if (period.count() > 0) when.it_interval = to_timespec(period);
  if (::timerfd_settime(fd, 0, &when, nullptr) != 0) throw_system_error("timerfd_settime", errno);
  Handle watched = watch(
      reactor, fd, EPOLLIN,
      [fd, task = std::move(task), detached](std::uint32_t) {
        std::uint64_t expirations;
        if (::read(fd, &expirations, sizeof expirations) > 0) task();
      },
      std::move(executor), wait);
  if (!wait) return watched;
  waiting->watch = std::move(watched);
  return Handle(std::shared_ptr<Registration>(std::move(waiting)));
}

}  // namespace

Handle call_after(const std::shared_ptr<Reactor>& reactor, std::chrono::milliseconds delay,
                  Task task, Executor executor) {
  if (delay.count() < 0) throw std::invalid_argument("Dispatcher::call_after: negative delay");
  if (!task) throw std::invalid_argument("Dispatcher::call_after: the task is empty");
  return timer(reactor, delay, std::chrono::milliseconds{0}, std::move(task), std::move(executor),
               true);
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
// its timer out of the loop and returns without waiting for a tick being
// served on another thread. That tick holds the group, dead, and the
// timerfd, for that tick only, and runs none of its tasks: each release
// waited for its own task already (the wait rule), or was made by that
// task itself. Waiting for the tick would wait for the other tasks it runs:
// a task that released its own handle and goes on to take a lock the last
// releasing thread holds would deadlock it. A dead group is never joined.
// The timer's callback holds the group weakly.

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

// A member's task, held apart from its subscription so that the
// Dispatcher's end can drop it (end_periodic_tasks): a task that owns its
// own handle (captures it) would otherwise keep itself, that handle and its
// group alive for good, with nothing left to release them. A run holds the
// task it runs, so dropping it never pulls it from under a run.
struct PeriodicMember {
  explicit PeriodicMember(Task task) : task(std::make_shared<const Task>(std::move(task))) {}
  std::shared_ptr<const Task> current() {
    MutexLock lock(mutex);
    return task;
  }
  Mutex mutex;  // a leaf: after its group's
  std::shared_ptr<const Task> task IBEV_GUARDED_BY(mutex);
};

struct PeriodicGroup {
  BroadcastList<PeriodicTask> tasks;
  Mutex mutex;  // after the reactor's periodic_mutex
  std::size_t members IBEV_GUARDED_BY(mutex) = 0;
  bool dead IBEV_GUARDED_BY(mutex) = false;
  Handle timer IBEV_GUARDED_BY(mutex);
  // Its members' tasks, for end_periodic_tasks; those gone are pruned as
  // members join.
  std::vector<std::weak_ptr<PeriodicMember>> member_tasks IBEV_GUARDED_BY(mutex);
  // Takes `member` in; throws std::bad_alloc before changing anything.
  void join(const std::shared_ptr<PeriodicMember>& member) IBEV_REQUIRES(mutex) {
    member_tasks.erase(std::remove_if(member_tasks.begin(), member_tasks.end(),
                                      [](const auto& weak) { return weak.expired(); }),
                       member_tasks.end());
    member_tasks.push_back(member);
    ++members;
  }
};

void end_periodic_tasks(Reactor& reactor) noexcept {
  // Destroyed last, outside every lock: a task's captures may release
  // handles, whose release takes these locks.
  std::vector<std::shared_ptr<PeriodicGroup>> groups;
  std::vector<std::shared_ptr<const Task>> dropped;
  try {
    {
      MutexLock lock(reactor.periodic_mutex);
      for (auto& entry : reactor.periodic_groups) {
        if (auto group = entry.second.lock()) groups.push_back(std::move(group));
      }
    }
    for (const auto& group : groups) {
      std::vector<std::weak_ptr<PeriodicMember>> members;
      {
        MutexLock lock(group->mutex);
        members.swap(group->member_tasks);
      }
      for (const auto& weak : members) {
        if (auto member = weak.lock()) {
          MutexLock lock(member->mutex);
          dropped.push_back(std::move(member->task));
        }
      }
    }
  } catch (const std::bad_alloc&) {
    // The tasks not listed stay with their handles, as they would have.
  }
}

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
  auto member = std::make_shared<PeriodicMember>(std::move(task));
  auto subscriber = std::make_shared<PeriodicTask>(
      [member, running = once.running,
       weak_reactor = std::weak_ptr<Reactor>(reactor)](std::uint64_t) {
        struct Done {
          std::atomic<bool>& running;
          ~Done() { running = false; }
        } done{*running};
        auto live = weak_reactor.lock();
        if (!live || live->shut.load()) return;
        if (const auto task = member->current()) (*task)();
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
        group->join(member);
      }
    }
    if (!group) {
      group = std::make_shared<PeriodicGroup>();
      Handle ticks = timer(
          reactor, period, period,
          [weak = std::weak_ptr<PeriodicGroup>(group),
           weak_reactor = std::weak_ptr<Reactor>(reactor)] { serve_group(weak, weak_reactor); },
          {}, false);
      // Nobody else sees the group yet; the lock is for the analysis. Taken
      // after timer(), which takes the table's.
      MutexLock members(group->mutex);
      group->join(member);
      group->timer = std::move(ticks);
      slot = group;
    }
  }
  // Leaves the group: the last member stops its timer, released outside
  // every lock (it takes the table's).
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
