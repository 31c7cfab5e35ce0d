// Locking. `Reactor::mutex_` guards the table of sources and the posted
// tasks. A source with a lock of its own (a completion channel's) takes it
// inside this one, never the other way round. A source leaves the epoll set
// and gets its fd's flags back under the table's mutex, in the same critical
// section that takes it out of the table: so a new watch of the same fd (a
// CQ joining a channel whose last CQ just left) finds either the old source
// whole or none at all. A source that reads its fd itself (async events, a
// completion channel) reads under the lock its leaving takes, after checking
// that it has not left: a read after the flags went back to blocking would
// wait for an event that may never come, while the release that left waits
// for that very serve. No lock is held while a handler runs, or a task.
// CallGuards (core/) make a release wait until the reactor is done with what
// is released.
//
// Fork: the epoll fd and the watched fds' file descriptions are shared with a
// forked child. Everything that would touch them checks that it runs in the
// process that made the reactor; in a child every handle is inert.
#include "reactor.h"

#include <ibev/dispatch/test_seams.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <iterator>
#include <stdexcept>
#include <string>
#include <utility>

namespace ibev::detail {

void (*test_seams::before_source_read)(int) = nullptr;
void (*test_seams::before_handle_allocated)() = nullptr;

namespace {
constexpr std::uint64_t kWakeupId = 0;

std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

std::uint32_t Source::interest() const noexcept { return EPOLLIN; }

int make_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0) throw_system_error("fcntl(F_GETFL)", errno);
  if (::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    throw_system_error("fcntl(F_SETFL, O_NONBLOCK)", errno);
  }
  return flags;
}

FileDescriptor::~FileDescriptor() {
  if (fd_ >= 0) ::close(fd_);
}

Reactor::Reactor(Dispatcher::Options options)
    : options_(std::move(options)),
      registry_(options_.on_failure),
      epoll_(::epoll_create1(EPOLL_CLOEXEC)),
      wakeup_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (epoll_.get() < 0) throw_system_error("epoll_create1", errno);
  if (wakeup_.get() < 0) throw_system_error("eventfd", errno);
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.u64 = kWakeupId;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wakeup_.get(), &event) < 0) {
    throw_system_error("epoll_ctl(EPOLL_CTL_ADD eventfd)", errno);
  }
}

void Reactor::report(const Failure& failure) noexcept {
  bump(stats_.failures);
  registry_.report(failure);
}

std::shared_ptr<Source> Reactor::find_fd_locked(int fd) const {
  const auto slot = static_cast<std::size_t>(fd);
  return fd >= 0 && slot < by_fd_.size() ? by_fd_[slot] : nullptr;
}

void Reactor::add_locked(const std::shared_ptr<Source>& source) {
  if (source->fd() < 0) throw std::invalid_argument("Reactor::add_locked: a negative fd");
  const auto slot = static_cast<std::size_t>(source->fd());
  if (slot >= by_fd_.size()) by_fd_.resize(std::max(slot + 1, by_fd_.size() * 2));
  // Never 0 (the wake-up eventfd's id), whatever the sequence wraps to.
  if (next_sequence_ == 0) ++next_sequence_;
  source->id_ = std::uint64_t{next_sequence_++} << 32 | static_cast<std::uint32_t>(source->fd());
  epoll_event event{};
  event.events = source->interest();
  event.data.u64 = source->id_;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, source->fd(), &event) < 0) {
    const int error = errno;
    ::fcntl(source->fd(), F_SETFL, source->original_flags());
    throw_system_error("epoll_ctl(EPOLL_CTL_ADD)", error);
  }
  by_fd_[slot] = source;
}

std::shared_ptr<Source>* Reactor::slot_locked(std::uint64_t id) noexcept {
  const auto slot = static_cast<std::size_t>(id & 0xffffffffu);
  if (slot >= by_fd_.size() || !by_fd_[slot] || by_fd_[slot]->id() != id) return nullptr;
  return &by_fd_[slot];
}

std::shared_ptr<Source> Reactor::take_locked(std::uint64_t id) {
  std::shared_ptr<Source>* slot = slot_locked(id);
  if (slot == nullptr) return nullptr;
  return std::move(*slot);
}

bool Reactor::retire_locked(Source& source) noexcept {
  source.guard().close();
  if (!in_owner_process()) return true;  // the parent's epoll set and flags
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, source.fd(), nullptr) != 0 &&
      (errno == EBADF || errno == ENOENT)) {
    return false;
  }
  ::fcntl(source.fd(), F_SETFL, source.original_flags());
  return true;
}

void Reactor::report_closed_fd(const Source& source) noexcept {
  Failure failure = Failure::verb_failed(
      "epoll_ctl(EPOLL_CTL_DEL)", EBADF,
      "fd " + std::to_string(source.fd()) +
          " was closed while the dispatcher watched it (epoll forgot it then, and "
          "nothing was dispatched from it since): release a watch before closing "
          "what it watches");
  failure.object = &source;
  report(failure);
}

std::shared_ptr<Source> Reactor::remove(std::uint64_t source_id) noexcept {
  std::shared_ptr<Source> source;
  bool intact = true;
  {
    MutexLock lock(mutex_);
    source = take_locked(source_id);
    if (source) intact = retire_locked(*source);
  }
  if (source && !intact) report_closed_fd(*source);
  return source;
}

struct Reactor::PendingHandle::Release final : Registration {
  Release(const std::shared_ptr<Reactor>& reactor, bool wait) noexcept
      : reactor(reactor), process(reactor->process_), wait(wait) {}
  void release() noexcept override {
    if (process.inherited()) return;  // a forked child's copy: inert
    if (auto self = reactor.lock()) {
      auto source = self->remove(source_id);
      if (source && wait) source->guard().wait_idle();
    }
  }
  const std::weak_ptr<Reactor> reactor;
  const OwningProcess process;
  const bool wait;
  std::uint64_t source_id = kWakeupId;  // no source's: set once it joined
};

Reactor::PendingHandle Reactor::prepare_handle(const std::shared_ptr<Reactor>& reactor,
                                               bool wait) {
  if (test_seams::before_handle_allocated != nullptr) test_seams::before_handle_allocated();
  return PendingHandle(std::make_shared<PendingHandle::Release>(reactor, wait));
}

Handle Reactor::PendingHandle::joined(std::uint64_t source_id) && noexcept {
  release_->source_id = source_id;
  return Handle(std::shared_ptr<Registration>(std::move(release_)));
}

void Reactor::wake() noexcept {
  const std::uint64_t one = 1;
  // Only fails when the counter would overflow: it is readable anyway.
  [[maybe_unused]] const auto ignored = ::write(wakeup_.get(), &one, sizeof one);
}

void Reactor::post(Task task) {
  {
    MutexLock lock(mutex_);
    posted_.push_back(std::move(task));
  }
  wake();
}

void Reactor::defer(Task task) {
  IBEV_ASSERT_DISPATCHING(*this);
  // The wake-up keeps fd() readable, so that a loop driving run_once() from
  // its own poller comes back too.
  if (deferred_.empty()) wake();
  deferred_.push_back(std::move(task));
}

// A turn runs at most `batch` of them, oldest first, as a source is served
// within its budget: a thread posting (or injecting) faster than they run
// must not make one turn, and so stop(), wait for the whole backlog.
void Reactor::run_posted() noexcept {
  IBEV_ASSERT_DISPATCHING(*this);
  std::uint64_t count;
  [[maybe_unused]] const auto ignored = ::read(wakeup_.get(), &count, sizeof count);
  bool more;
  {
    MutexLock lock(mutex_);
    const std::size_t n = std::min<std::size_t>(posted_.size(), options_.batch);
    std::move(posted_.begin(), posted_.begin() + static_cast<std::ptrdiff_t>(n),
              std::back_inserter(running_));
    posted_.erase(posted_.begin(), posted_.begin() + static_cast<std::ptrdiff_t>(n));
    more = !posted_.empty();
  }
  if (more) wake();  // the rest next turn, which does not sleep
  for (std::size_t i = 0; i < running_.size(); ++i) {
    if (orphaned.load()) {  // a task destroyed the Dispatcher
      report_never_run(running_.size() - i);
      break;
    }
    reported_call("task posted to the dispatcher", running_[i],
                  [this](Failure failure) { report(failure); });
  }
  running_.clear();
}

std::size_t Reactor::run_turn(int timeout_ms) {
  IBEV_ASSERT_DISPATCHING(*this);
  std::vector<Task> owed;
  owed.swap(deferred_);
  std::array<epoll_event, 32> events;
  int n = ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()),
                       owed.empty() ? timeout_ms : 0);
  turn_started_ns_ = now_ns();
  if (n < 0) {
    if (errno != EINTR) report(Failure::verb_failed("epoll_wait", errno));
    n = 0;
  }
  for (int i = 0; i < n; ++i) {
    const std::uint64_t id = events[i].data.u64;
    if (id == kWakeupId) {
      run_posted();
      continue;
    }
    std::shared_ptr<Source> source;
    {
      MutexLock lock(mutex_);
      if (std::shared_ptr<Source>* slot = slot_locked(id)) source = *slot;
    }
    if (!source) continue;
    if (const auto entered = source->guard().enter()) source->serve(events[i].events);
  }
  // After the ready sources, so that what the deferred work delayed goes
  // first; none once a handler destroyed the Dispatcher (its CQs may be gone).
  for (Task& task : owed) {
    if (orphaned.load()) break;
    task();
  }
  turn_started_ns_ = 0;
  bump(stats_.turns);
  return static_cast<std::size_t>(n) + owed.size();
}

bool Reactor::work_waiting() const noexcept {
  pollfd fd{epoll_.get(), POLLIN, 0};
  return ::poll(&fd, 1, 0) > 0;
}

void Reactor::shut_down() noexcept {
  shut = true;
  // Taken out under the lock, destroyed after it: a source's handler or a
  // task may own a Handle (a timer that re-arms itself holds its own), and
  // that Handle's release takes the lock again. Released now, it finds its
  // source gone and returns.
  std::vector<std::shared_ptr<Source>> retired;
  std::deque<Task> never_run;
  {
    MutexLock lock(mutex_);
    for (std::shared_ptr<Source>& slot : by_fd_) {
      if (slot) {
        static_cast<void>(retire_locked(*slot));  // closed: nothing to give back
        retired.push_back(std::move(slot));
      }
    }
    never_run.swap(posted_);
  }
  std::vector<Task> deferred;
  deferred.swap(deferred_);
  const std::size_t never_run_count = never_run.size();
  retired.clear();
  never_run.clear();
  deferred.clear();
  end_periodic_tasks(*this);
  report_never_run(never_run_count);
}

void Reactor::report_never_run(std::size_t count) noexcept {
  if (count == 0) return;
  Failure failure;
  failure.kind = Failure::Kind::kUndispatched;
  failure.verb = "Dispatcher::~Dispatcher";
  failure.what = std::to_string(count) +
                 " posted task(s) or injected event(s) never dispatched: the "
                 "Dispatcher was destroyed before a run_once() or its thread "
                 "served them";
  report(failure);
}

}  // namespace ibev::detail
