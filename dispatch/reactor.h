// Internal to dispatch/: the reactor behind a Dispatcher. An epoll set of
// Sources that serve themselves, a wake-up eventfd, tasks posted to the
// dispatching thread, and bounded turns: each ready source once per turn
// within its budget (posted tasks too: Options::batch of them), then what
// the last turn deferred (a CQ that used its budget); with work deferred or
// left the next turn does not sleep.
#ifndef IBEV_DISPATCH_REACTOR_H_
#define IBEV_DISPATCH_REACTOR_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include <ibev/core/executor.h>
#include <ibev/core/failure.h>
#include <ibev/core/handle.h>
#include <ibev/core/process.h>
#include <ibev/core/registry.h>
#include <ibev/core/stats.h>
#include <ibev/core/thread_annotations.h>
#include <ibev/dispatch/dispatcher.h>
#include "source.h"

namespace ibev::detail {

IBEV_DECLARE_ATOMIC_STATS(AtomicDispatcherStats, DispatcherStats, IBEV_DISPATCHER_STATS);

struct PeriodicGroup;  // fd_source.cc
class Reactor;
// The Dispatcher is gone: call_every's tasks are dropped (their captures
// destroyed), on the destroying thread, outside every lock (fd_source.cc).
void end_periodic_tasks(Reactor& reactor) noexcept;

class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) noexcept : fd_(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor();
  int get() const noexcept { return fd_; }

 private:
  int fd_;
};

class Reactor {
 public:
  explicit Reactor(Dispatcher::Options options);
  Reactor(const Reactor&) = delete;
  Reactor& operator=(const Reactor&) = delete;

  Registry& registry() noexcept { return registry_; }
  const Dispatcher::Options& options() const noexcept { return options_; }
  AtomicDispatcherStats& stats() noexcept { return stats_; }
  int epoll_fd() const noexcept { return epoll_.get(); }

  // Counts it and hands it to the Registry's sink.
  void report(const Failure& failure) noexcept;

  // The table of sources. A source joins and leaves under mutex(); a source kind with
  // a lock of its own takes it inside this one, never around it.
  Mutex& mutex() noexcept IBEV_RETURN_CAPABILITY(mutex_) { return mutex_; }
  std::shared_ptr<Source> find_fd_locked(int fd) const IBEV_REQUIRES(mutex_);
  // Puts `source` in the epoll set and the table. On failure gives the fd
  // its flags back and throws std::system_error (epoll_ctl).
  void add_locked(const std::shared_ptr<Source>& source) IBEV_REQUIRES(mutex_);
  std::shared_ptr<Source> take_locked(std::uint64_t id) IBEV_REQUIRES(mutex_);
  // Serves it no more, takes its fd out of the epoll set and gives the fd its
  // flags back. False when the fd turned out closed behind the reactor's back
  // (epoll forgets a closed fd silently): the caller reports that, unlocked.
  bool retire_locked(Source& source) noexcept IBEV_REQUIRES(mutex_);
  void report_closed_fd(const Source& source) noexcept;
  // take_locked() and retire_locked() in one critical section, and the
  // report of a closed fd after it; returns the source (null if gone
  // already) for the caller to wait on, unless it is the caller.
  std::shared_ptr<Source> remove(std::uint64_t source_id) noexcept IBEV_EXCLUDES(mutex_);
  // A source's Handle, made in two steps so that no source is ever in the
  // table without the Handle that takes it out: prepare_handle() allocates
  // it (std::bad_alloc is then the one thing that can fail) before the
  // source joins, joined() gives it the source's id after, and cannot
  // throw. Its release takes the source out (table, epoll set, flags, in one
  // critical section); with `wait`, it then waits until the reactor is done
  // with it. Without, a serve in progress on another thread finishes on its
  // own and the source (its handler and what that holds) goes with it: for
  // a source whose release must not wait for its handler (call_every's
  // group timer, fd_source.cc).
  class PendingHandle {
   public:
    Handle joined(std::uint64_t source_id) && noexcept;

   private:
    friend class Reactor;
    struct Release;
    explicit PendingHandle(std::shared_ptr<Release> release) noexcept
        : release_(std::move(release)) {}
    std::shared_ptr<Release> release_;
  };
  static PendingHandle prepare_handle(const std::shared_ptr<Reactor>& reactor,
                                      bool wait = true);

  // One turn; returns how many sources and deferred tasks it served.
  std::size_t run_turn(int timeout_ms) IBEV_EXCLUDES(mutex_);
  // Any thread: runs `task` on the dispatching thread, next turn.
  void post(Task task) IBEV_EXCLUDES(mutex_);
  // The dispatching thread: runs `task` next turn, which does not sleep.
  void defer(Task task);
  void wake() noexcept;

  // True when something waits for a turn (the epoll fd is readable).
  bool work_waiting() const noexcept;
  // The watchdog's view: turns completed, and since when (steady clock, in
  // ns since its epoch) the current one runs; 0 when none runs.
  std::uint64_t turns() const noexcept { return stats_.turns.load(); }
  std::int64_t turn_started_ns() const noexcept { return turn_started_ns_.load(); }

  // The Dispatcher is gone: every fd still watched gets its flags back
  // (handles still held become inert), posted tasks never run are reported,
  // call_every's tasks are dropped.
  // On the destroying thread, the dispatching one included (from a handler);
  // what it drops is destroyed outside every lock.
  void shut_down() noexcept IBEV_EXCLUDES(mutex_);

  // False in a child forked after the reactor was made.
  bool in_owner_process() const noexcept { return !process_.inherited(); }
  const OwningProcess& process() const noexcept { return process_; }

  // Who dispatches; see Dispatcher.
  std::atomic<bool> stop_requested{false};
  std::atomic<bool> thread_running{false};  // between start() and its join
  std::atomic<bool> driving{false};         // a thread is inside run_once
  std::atomic<std::thread::id> dispatcher_thread{};
  // The calling thread runs a turn now: the Dispatcher's own between start()
  // and stop(), or run_once()'s caller during that call (Dispatcher's
  // in_dispatcher_thread(), IBEV_ASSERT_DISPATCHING).
  bool in_dispatcher_thread() const noexcept {
    return dispatcher_thread.load() == std::this_thread::get_id();
  }
  // Destroyed from inside its own handler, and shut down there: the thread,
  // which holds the reactor, serves nothing more and runs no task.
  std::atomic<bool> orphaned{false};
  // shut_down() has begun: what is still handed around (a periodic task's
  // run on an executor) does nothing.
  std::atomic<bool> shut{false};

  // call_every's tasks, grouped by period (fd_source.cc): a group lives
  // while a task of it is subscribed. Taken before mutex(), never after.
  Mutex periodic_mutex IBEV_ACQUIRED_BEFORE(mutex_);
  std::map<std::int64_t, std::weak_ptr<PeriodicGroup>> periodic_groups
      IBEV_GUARDED_BY(periodic_mutex);

 private:
  void run_posted() noexcept IBEV_EXCLUDES(mutex_);
  void report_never_run(std::size_t count) noexcept;
  // The slot holding the source `id` names; null when it left.
  std::shared_ptr<Source>* slot_locked(std::uint64_t id) noexcept IBEV_REQUIRES(mutex_);

  const Dispatcher::Options options_;
  Registry registry_;
  FileDescriptor epoll_;
  FileDescriptor wakeup_;
  const OwningProcess process_;
  AtomicDispatcherStats stats_;
  std::atomic<std::int64_t> turn_started_ns_{0};

  Mutex mutex_;
  // The watched sources, indexed by fd: fds are small and dense, so a slot
  // per fd costs 16 bytes and no node, and the turn finds an epoll event's
  // source in one indexed load. A source's id is its fd in the low 32 bits
  // and a sequence number above: an epoll event read for a source that has
  // since left, its fd reused by another, names an id no slot holds.
  std::vector<std::shared_ptr<Source>> by_fd_ IBEV_GUARDED_BY(mutex_);
  std::uint32_t next_sequence_ IBEV_GUARDED_BY(mutex_) = 1;  // 0 is the wake-up eventfd's id
  std::deque<Task> posted_ IBEV_GUARDED_BY(mutex_);
  // Deferred to the next turn. Only the dispatching thread touches it.
  std::vector<Task> deferred_;
  // The posted tasks this turn runs; the dispatching thread's, like deferred_.
  std::vector<Task> running_;
};

}  // namespace ibev::detail

#endif  // IBEV_DISPATCH_REACTOR_H_
