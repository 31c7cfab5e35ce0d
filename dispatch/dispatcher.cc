// Locking. `DispatcherState::mutex` guards the tables of sources and the
// injection queue; a ChannelSource's `mutex` guards its CQs and their unacked
// counts, and is taken inside the tables' mutex, never the other way round.
// A source leaves the epoll set and gets its fd's flags back under the tables'
// mutex, in the same critical section that takes it out of the tables: so a
// new watch of the same fd (a CQ joining a channel whose last CQ just left)
// finds either the old source whole or none at all. `Dispatcher::control_`
// serialises start() and stop() (and the thread handle) among application
// threads; the dispatcher thread never takes it. CallGuards (core/) make a
// release wait until the dispatcher is done with the thing released.
//
// Fork: the epoll fd and the watched fds' file descriptions are shared with a
// forked child. Everything that would touch them checks that it runs in the
// process that made the Dispatcher; in a child every handle is inert.
#include <ibev/dispatch/dispatcher.h>

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ibev/core/call_guard.h>
#include <ibev/core/happens_before.h>
#include <ibev/dispatch/test_seams.h>

namespace ibev {
namespace detail {

void (*test_seams::after_channel_retired)(ibv_comp_channel*) = nullptr;

namespace {

[[noreturn]] void throw_system_error(int error, const char* verb) {
  throw std::system_error(error, std::generic_category(), verb);
}

class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) noexcept : fd_(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const noexcept { return fd_; }

 private:
  int fd_;
};

// Makes `fd` non-blocking; returns its previous flags, for restoring.
int make_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0) throw_system_error(errno, "fcntl(F_GETFL)");
  if (::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    throw_system_error(errno, "fcntl(F_SETFL, O_NONBLOCK)");
  }
  return flags;
}

std::string describe(const char* what, const void* object) {
  std::ostringstream out;
  out << what << ' ' << object;
  return out.str();
}

constexpr std::uint64_t kControlId = 0;

}  // namespace

// One fd in the epoll set. `guard` is held while the dispatcher serves it, so
// that releasing its watch can wait until the dispatcher is done with it.
struct Source {
  enum class Kind { kDevice, kChannel };
  Source(Kind k, std::uint64_t i, int f, int flags)
      : kind(k), id(i), fd(f), original_flags(flags) {}
  const Kind kind;
  const std::uint64_t id;
  const int fd;
  const int original_flags;
  CallGuard guard;
};

struct DeviceSource : Source {
  DeviceSource(std::uint64_t id, ibv_context* d, int flags)
      : Source(Kind::kDevice, id, d->async_fd, flags), device(d) {}
  ibv_context* const device;
};

struct CqEntry {
  CqEntry(ibv_cq* c, CompletionHandler h, CompletionOptions o)
      : cq(c), handler(std::move(h)), options(o) {}
  ibv_cq* const cq;
  const CompletionHandler handler;
  const CompletionOptions options;
  CallGuard guard;              // held while re-arming and draining
  unsigned unacked = 0;         // under the channel's mutex
  // Adaptive mode: since when the CQ has given nothing, kept across turns so
  // that a turn boundary does not restart the quiet period. Dispatching
  // thread only.
  std::chrono::steady_clock::time_point quiet_since{};
  std::atomic<std::uint64_t> events{0}, ack_calls{0}, empty_events{0},
      completions{0}, polled{0}, yields{0};
};

struct ChannelSource : Source {
  ChannelSource(std::uint64_t id, ibv_comp_channel* c, int flags)
      : Source(Kind::kChannel, id, c->fd, flags), channel(c) {}
  ibv_comp_channel* const channel;
  // Taken around ibv_get_cq_event and the ack count, and by a release, so
  // that a release sees every event read for its CQ and acks it.
  std::mutex mutex;
  std::unordered_map<ibv_cq*, std::shared_ptr<CqEntry>> cqs;
};

struct DispatcherState {
  DispatcherState(Registry& r, Dispatcher::Options o)
      : registry(r),
        options(std::move(o)),
        epoll(::epoll_create1(EPOLL_CLOEXEC)),
        control(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (epoll.get() < 0) throw_system_error(errno, "epoll_create1");
    if (control.get() < 0) throw_system_error(errno, "eventfd");
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = kControlId;
    if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, control.get(), &event) < 0) {
      throw_system_error(errno, "epoll_ctl(ADD eventfd)");
    }
    if (options.batch == 0) {
      throw std::invalid_argument("Dispatcher: Options::batch must be at least 1");
    }
  }

  void wake() noexcept {
    const std::uint64_t one = 1;
    // Only fails when the counter would overflow: it is readable anyway.
    [[maybe_unused]] const auto ignored = ::write(control.get(), &one, sizeof one);
  }

  // False in a child forked after the Dispatcher was made.
  bool in_owner_process() const noexcept { return ::getpid() == owner; }

  void report(const std::string& what) noexcept {
    errors.fetch_add(1, std::memory_order_relaxed);
    try {
      if (options.on_error) {
        options.on_error(what);
      } else {
        std::fprintf(stderr, "ibev dispatcher: %s\n", what.c_str());
      }
    } catch (...) {
      std::fprintf(stderr, "ibev dispatcher: %s (on_error threw)\n", what.c_str());
    }
  }

  std::shared_ptr<Source> find(std::uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = sources.find(id);
    return it == sources.end() ? nullptr : it->second;
  }

  // Puts `source` in the epoll set and the table of sources; the caller holds
  // `mutex`. On failure gives the fd its flags back and throws.
  void add_locked(const std::shared_ptr<Source>& source) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = source->id;
    if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, source->fd, &event) < 0) {
      const int error = errno;
      ::fcntl(source->fd, F_SETFL, source->original_flags);
      throw_system_error(error, "epoll_ctl(EPOLL_CTL_ADD)");
    }
    sources.emplace(source->id, source);
  }

  // Takes the source out of the tables; the caller holds `mutex`.
  std::shared_ptr<Source> take_locked(std::uint64_t id) {
    auto it = sources.find(id);
    if (it == sources.end()) return nullptr;
    std::shared_ptr<Source> source = std::move(it->second);
    sources.erase(it);
    if (source->kind == Source::Kind::kDevice) {
      devices.erase(static_cast<DeviceSource&>(*source).device);
    } else {
      channels.erase(static_cast<ChannelSource&>(*source).channel);
    }
    return source;
  }

  // Serves it no more, takes its fd out of the epoll set and gives the fd its
  // flags back; the caller holds `mutex` (see the top of the file). The fd may
  // be closed already (a device gone): then there is nothing to undo. In a
  // forked child the epoll set and the flags are the parent's: untouched.
  //
  // Returns false when the fd turned out closed behind the dispatcher's back
  // (epoll forgets a closed fd silently, so nothing was dispatched from it
  // since): the caller reports that, outside the lock.
  bool retire_locked(Source& source) noexcept {
    source.guard.close();
    if (!in_owner_process()) return true;
    if (::epoll_ctl(epoll.get(), EPOLL_CTL_DEL, source.fd, nullptr) != 0 &&
        (errno == EBADF || errno == ENOENT)) {
      return false;
    }
    ::fcntl(source.fd, F_SETFL, source.original_flags);
    return true;
  }

  void report_closed_behind_our_back(const Source& source) noexcept {
    report("fd " + std::to_string(source.fd) +
           " was closed while the dispatcher watched it (epoll forgot it then, "
           "and nothing was dispatched from it since): release a watch before "
           "closing what it watches");
  }

  // take_locked() and retire_locked() in one critical section; returns the
  // source (null if gone already) for the caller to wait until it is idle.
  std::shared_ptr<Source> remove(std::uint64_t id) {
    std::shared_ptr<Source> source;
    bool intact = true;
    {
      std::lock_guard<std::mutex> lock(mutex);
      source = take_locked(id);
      if (source) intact = retire_locked(*source);
    }
    if (!intact) report_closed_behind_our_back(*source);
    return source;
  }

  // The Dispatcher is gone and its thread with it: every fd still watched
  // gets its flags back (watches held on are inert from now on), and
  // injected events nobody will dispatch are said, not dropped silently.
  void shut_down() noexcept {
    std::size_t undelivered = 0;
    {
      std::lock_guard<std::mutex> lock(mutex);
      while (!sources.empty()) {
        if (auto source = take_locked(sources.begin()->first)) {
          static_cast<void>(retire_locked(*source));  // closed: nothing to give back
        }
      }
      undelivered = injected_queue.size();
      injected_queue.clear();
    }
    if (undelivered > 0) {
      report(std::to_string(undelivered) +
             " injected event(s) never dispatched: the Dispatcher was destroyed "
             "before a run_once() or its thread served them");
    }
  }

  Registry& registry;
  const Dispatcher::Options options;
  FileDescriptor epoll;
  FileDescriptor control;

  std::mutex mutex;  // the tables and the injection queue
  std::uint64_t next_id = kControlId + 1;
  std::unordered_map<std::uint64_t, std::shared_ptr<Source>> sources;
  std::unordered_map<ibv_context*, std::uint64_t> devices;
  std::unordered_map<ibv_comp_channel*, std::shared_ptr<ChannelSource>> channels;
  std::deque<Delivery> injected_queue;
  // CQs that used their budget, to be served again next turn before the
  // dispatcher sleeps. Only the dispatching thread touches it.
  std::vector<std::shared_ptr<CqEntry>> requeued;

  const pid_t owner = ::getpid();
  std::atomic<bool> stop_requested{false};
  std::atomic<bool> thread_running{false};  // between start() and its join
  std::atomic<bool> driving{false};         // a thread is inside run_once
  std::atomic<std::thread::id> dispatcher_thread{};
  // Destroyed from inside its own handler: the thread, which holds the state,
  // shuts it down itself when its loop ends.
  std::atomic<bool> orphaned{false};

  std::atomic<std::uint64_t> async_events{0}, injected{0}, devices_lost{0},
      completion_events{0}, cq_ack_calls{0}, empty_completion_events{0},
      empty_channel_reads{0}, work_completions{0}, errors{0};
};

namespace {

void deliver_guarded(DispatcherState& state, const Delivery& delivery) {
  try {
    state.registry.deliver(delivery);
  } catch (const std::exception& e) {
    state.report(std::string("Registry::deliver: ") + e.what());
  }
}

void lose_device(DispatcherState& state, DeviceSource& source,
                 const std::string& why) {
  state.report(describe("async fd of device", source.device) + " failed (" +
               why + "); sending DEVICE_FATAL to its listeners");
  state.remove(source.id);
  state.devices_lost.fetch_add(1, std::memory_order_relaxed);
  try {
    deliver_guarded(state, state.registry.resolve(Event::synthesize(
                               source.device, IBV_EVENT_DEVICE_FATAL,
                               WholeDevice{})));
  } catch (const std::exception& e) {
    state.report(std::string("DEVICE_FATAL not delivered: ") + e.what());
  }
}

void serve_device(DispatcherState& state, DeviceSource& source,
                  std::uint32_t revents) {
  if ((revents & (EPOLLERR | EPOLLHUP)) != 0) {
    lose_device(state, source, (revents & EPOLLERR) ? "EPOLLERR" : "EPOLLHUP");
    return;
  }
  for (unsigned i = 0; i < state.options.batch; ++i) {
    ibv_async_event raw;
    if (ibv_get_async_event(source.device, &raw) != 0) {
      const int error = errno;
      if (error == EAGAIN || error == EWOULDBLOCK) return;
      if (error == EINTR) continue;
      lose_device(state, source,
                  std::string("ibv_get_async_event: ") + std::strerror(error));
      return;
    }
    state.async_events.fetch_add(1, std::memory_order_relaxed);
    // Resolve before the ack: once acked, the object may be destroyed and its
    // address reused, and the event must not reach the newcomer.
    std::optional<Delivery> delivery;
    try {
      delivery.emplace(state.registry.resolve(Event::from_async(source.device, raw)));
    } catch (const std::exception& e) {
      state.report(std::string("Registry::resolve: ") + e.what());
    }
    ibv_ack_async_event(&raw);
    if (delivery) deliver_guarded(state, *delivery);
    // Released from a handler: the device may be closed already.
    if (source.guard.closed()) return;
  }
}

// Polls `entry`'s CQ until it is empty, the watch is released or `limit`
// completions were taken, handing each batch to the handler; returns how
// many it took (== limit: the CQ may hold more).
std::uint64_t drain(DispatcherState& state, CqEntry& entry, std::uint64_t limit) {
  std::array<ibv_wc, 256> wcs;
  std::uint64_t drained = 0;
  while (drained < limit && !entry.guard.closed()) {
    const auto want = std::min<std::uint64_t>(entry.options.poll_batch, limit - drained);
    const int n = ibv_poll_cq(entry.cq, static_cast<int>(want), wcs.data());
    if (n < 0) {
      state.report(describe("ibv_poll_cq failed for CQ", entry.cq));
      break;
    }
    if (n == 0) break;
    drained += static_cast<std::uint64_t>(n);
    entry.completions.fetch_add(static_cast<std::uint64_t>(n),
                                std::memory_order_relaxed);
    state.work_completions.fetch_add(static_cast<std::uint64_t>(n),
                                     std::memory_order_relaxed);
    acquire_before_completion(entry.cq);  // what was written before the post
    try {
      entry.handler(CompletionBatch{entry.cq, wcs.data(), static_cast<std::size_t>(n)});
    } catch (const std::exception& e) {
      state.report(describe("completion handler of CQ", entry.cq) + " threw: " +
                   e.what());
    } catch (...) {
      state.report(describe("completion handler of CQ", entry.cq) +
                   " threw a non-std exception");
    }
  }
  return drained;
}

void rearm(DispatcherState& state, CqEntry& entry) {
  if (int rc = ibv_req_notify_cq(entry.cq, entry.options.solicited_only ? 1 : 0);
      rc != 0) {
    state.report(describe("ibv_req_notify_cq failed for CQ", entry.cq) + ": " +
                 std::strerror(rc));
  }
}

// One turn of a CQ, after its channel event (`for_event`) or when it was
// requeued: drain, re-arm, drain again. The first drain runs the handler
// before the re-arm's system call, so a reply to a completion goes out one
// verb sooner than with arm-then-drain; the drain after the re-arm takes
// whatever landed before it, and a completion landing after it raises a new
// event, even if this drain takes it (that event then finds the CQ empty). In
// adaptive mode, keep polling between the first drain and the re-arm while
// completions come, until the CQ has been quiet for the poll budget.
//
// The turn is bounded: at most `budget` completions, and adaptive polling at
// most one poll budget long. A turn that ends on its bound leaves the CQ
// unarmed and requeued, so the dispatcher serves every other ready source and
// comes back without sleeping (the kernel's cq.c requeues its poll work the
// same way). `drained`: completions taken for this event already.
void serve_cq(DispatcherState& state, const std::shared_ptr<CqEntry>& shared,
              std::uint64_t drained, bool for_event) {
  CqEntry& entry = *shared;
  const std::uint64_t budget = entry.options.budget;
  const auto yield = [&] {
    entry.yields.fetch_add(1, std::memory_order_relaxed);
    state.requeued.push_back(shared);
  };
  const auto poll_budget = entry.options.poll_budget;
  const bool adaptive = poll_budget.count() > 0;
  drained += drain(state, entry, budget - std::min(drained, budget));
  if (adaptive && (for_event || drained > 0)) {
    entry.quiet_since = std::chrono::steady_clock::now();
  }
  if (drained >= budget) return yield();
  if (adaptive) {
    // Reading the clock costs more than an empty poll: look every 64 polls.
    const auto turn_start = std::chrono::steady_clock::now();
    for (unsigned empty = 0; !entry.guard.closed(); ++empty) {
      if (const std::uint64_t more = drain(state, entry, budget - drained); more > 0) {
        drained += more;
        entry.polled.fetch_add(more, std::memory_order_relaxed);
        entry.quiet_since = std::chrono::steady_clock::now();
        if (drained >= budget || entry.quiet_since - turn_start >= poll_budget) {
          return yield();
        }
        empty = 0;
      } else if (empty % 64 == 63) {
        const auto now = std::chrono::steady_clock::now();
        if (now - entry.quiet_since >= poll_budget) break;  // quiet: arm and sleep
        if (now - turn_start >= poll_budget) return yield();
      }
    }
  }
  if (!entry.guard.closed()) {
    rearm(state, entry);
    drained += drain(state, entry, budget - drained);
    if (drained >= budget) return yield();
  }
  if (drained == 0 && for_event) {
    entry.empty_events.fetch_add(1, std::memory_order_relaxed);
    state.empty_completion_events.fetch_add(1, std::memory_order_relaxed);
  }
}

// What epoll's report of a channel tells before any read. A CQ raises one
// event per arm, and it is re-armed only after its event is read: so the
// channel holds at most one event per watched CQ, and reading more would only
// find EAGAIN, a system call on every wake-up of a latency-bound loop
// (anything raised while serving keeps the level-triggered fd ready for the
// next pass). A channel that serves one CQ can only hold that CQ's event.
struct ChannelReport {
  unsigned events_to_read;
  std::shared_ptr<CqEntry> only_cq;
};

ChannelReport inspect(DispatcherState& state, ChannelSource& source) {
  std::lock_guard<std::mutex> lock(source.mutex);
  const std::size_t watched = std::max<std::size_t>(source.cqs.size(), 1);
  return {static_cast<unsigned>(std::min<std::size_t>(state.options.batch, watched)),
          source.cqs.size() == 1 ? source.cqs.begin()->second : nullptr};
}

void serve_channel(DispatcherState& state, ChannelSource& source) {
  const ChannelReport report = inspect(state, source);
  // With one CQ on the channel, drain it before reading its event: the
  // handler's reply then costs no system call after the wake-up. Reading the
  // event, counting it and re-arming follow, so the arm still precedes the
  // last drain. (If that CQ was released meanwhile, the event read below is
  // a stale one: acked there; this drain then found the CQ closed or empty.)
  std::uint64_t drained_early = 0;
  if (report.only_cq && report.only_cq->guard.try_enter()) {
    drained_early = drain(state, *report.only_cq, report.only_cq->options.budget);
    report.only_cq->guard.leave();
  }
  for (unsigned i = 0; i < report.events_to_read && !source.guard.closed(); ++i) {
    std::shared_ptr<CqEntry> entry;
    {
      std::lock_guard<std::mutex> lock(source.mutex);
      ibv_cq* cq = nullptr;
      void* cq_context = nullptr;
      if (ibv_get_cq_event(source.channel, &cq, &cq_context) != 0) {
        const int error = errno;
        if (error == EAGAIN || error == EWOULDBLOCK) {
          state.empty_channel_reads.fetch_add(1, std::memory_order_relaxed);
        } else if (error != EINTR) {
          state.report(describe("ibv_get_cq_event failed on channel",
                                source.channel) + ": " + std::strerror(error));
        }
        return;
      }
      state.completion_events.fetch_add(1, std::memory_order_relaxed);
      auto it = source.cqs.find(cq);
      if (it == source.cqs.end()) {
        // Its watch was released after the event was raised: ack it here so
        // that destroying the CQ does not wait.
        ibv_ack_cq_events(cq, 1);
        state.cq_ack_calls.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      entry = it->second;
      entry->events.fetch_add(1, std::memory_order_relaxed);
      if (++entry->unacked >= entry->options.ack_batch) {
        ibv_ack_cq_events(cq, entry->unacked);
        entry->unacked = 0;
        entry->ack_calls.fetch_add(1, std::memory_order_relaxed);
        state.cq_ack_calls.fetch_add(1, std::memory_order_relaxed);
      }
    }
    if (!entry->guard.try_enter()) continue;
    serve_cq(state, entry,
             entry == report.only_cq ? std::exchange(drained_early, 0) : 0, true);
    entry->guard.leave();
  }
}

void serve_injected(DispatcherState& state) {
  std::deque<Delivery> ready;
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    ready.swap(state.injected_queue);
  }
  for (const Delivery& delivery : ready) deliver_guarded(state, delivery);
}

// One turn: every ready source once, each within its budget, then the CQs
// the last turn requeued (after, so that what they delayed goes first). With
// CQs owed a turn it does not sleep.
std::size_t run_pass(DispatcherState& state, int timeout_ms) {
  std::vector<std::shared_ptr<CqEntry>> owed;
  owed.swap(state.requeued);
  std::array<epoll_event, 32> events;
  int n = ::epoll_wait(state.epoll.get(), events.data(), static_cast<int>(events.size()),
                       owed.empty() ? timeout_ms : 0);
  if (n < 0) {
    if (errno != EINTR) state.report(std::string("epoll_wait: ") + std::strerror(errno));
    n = 0;
  }
  for (int i = 0; i < n; ++i) {
    const std::uint64_t id = events[i].data.u64;
    if (id == kControlId) {
      std::uint64_t count;
      [[maybe_unused]] const auto ignored =
          ::read(state.control.get(), &count, sizeof count);
      serve_injected(state);
      continue;
    }
    std::shared_ptr<Source> source = state.find(id);
    if (!source || !source->guard.try_enter()) continue;
    if (source->kind == Source::Kind::kDevice) {
      serve_device(state, static_cast<DeviceSource&>(*source), events[i].events);
    } else {
      serve_channel(state, static_cast<ChannelSource&>(*source));
    }
    source->guard.leave();
  }
  for (const std::shared_ptr<CqEntry>& entry : owed) {
    if (!entry->guard.try_enter()) continue;  // released meanwhile
    serve_cq(state, entry, 0, false);
    entry->guard.leave();
  }
  return static_cast<std::size_t>(n) + owed.size();
}

// The dispatcher thread's body. It holds the state, not the Dispatcher: a
// handler may destroy the Dispatcher, and the loop then ends after it.
void run_loop(const std::shared_ptr<DispatcherState>& state) {
  state->dispatcher_thread = std::this_thread::get_id();
  while (!state->stop_requested.load()) run_pass(*state, -1);
  state->dispatcher_thread = std::thread::id{};
  if (state->orphaned.load()) state->shut_down();
}

void require_owner_process(const DispatcherState& state, const char* verb) {
  if (!state.in_owner_process()) {
    throw std::logic_error(std::string(verb) +
                           ": in a forked child; only the process that made the "
                           "Dispatcher can dispatch (ibv_fork_init(3))");
  }
}

}  // namespace
}  // namespace detail

using detail::DispatcherState;

CompletionStats CompletionWatch::stats() const noexcept {
  if (!entry_) return {};
  return {entry_->events.load(),      entry_->ack_calls.load(),
          entry_->empty_events.load(), entry_->completions.load(),
          entry_->polled.load(),       entry_->yields.load()};
}

Dispatcher::Dispatcher(Registry& registry) : Dispatcher(registry, Options{}) {}

Dispatcher::Dispatcher(Registry& registry, Options options)
    : state_(std::make_shared<DispatcherState>(registry, std::move(options))) {}

Dispatcher::~Dispatcher() {
  if (!state_->in_owner_process()) {
    // A forked child's copy: the parent's thread does not exist here, and the
    // epoll set and fds are the parent's. Nothing to join, nothing to undo.
    static_cast<void>(thread_.release());  // leaked on purpose: no thread here
    return;
  }
  if (in_dispatcher_thread()) {
    // Destroyed by one of its own handlers: the thread cannot join itself. It
    // holds the state, finishes the handler, stops and shuts down. The lock:
    // start() may still be publishing the handle of this very thread (a
    // handler can run before start() returns).
    std::lock_guard<std::mutex> lock(control_);
    state_->orphaned = true;
    state_->stop_requested = true;
    state_->wake();
    thread_->detach();
    return;
  }
  stop();
  state_->shut_down();
}

void Dispatcher::start() {
  detail::require_owner_process(*state_, "Dispatcher::start");
  if (in_dispatcher_thread()) {
    throw std::logic_error("Dispatcher::start: called from the dispatcher thread");
  }
  std::lock_guard<std::mutex> lock(control_);
  if (thread_) {
    if (!state_->stop_requested.load()) {
      throw std::logic_error("Dispatcher::start: the dispatcher thread is running");
    }
    thread_->join();  // stopped from inside a handler, not joined yet
    thread_.reset();
  }
  if (state_->driving.load()) {
    throw std::logic_error("Dispatcher::start: run_once() is in progress");
  }
  state_->stop_requested = false;
  state_->thread_running = true;
  thread_ = std::make_unique<std::thread>(
      [state = state_] { detail::run_loop(state); });
}

void Dispatcher::stop() {
  if (in_dispatcher_thread()) {  // it cannot join itself: start() or ~ will
    state_->stop_requested = true;
    state_->wake();
    return;
  }
  std::lock_guard<std::mutex> lock(control_);
  if (!thread_ || !state_->in_owner_process()) return;
  state_->stop_requested = true;
  state_->wake();
  thread_->join();
  thread_.reset();
  state_->thread_running = false;
}

bool Dispatcher::running() const noexcept {
  return state_->thread_running.load() && !state_->stop_requested.load();
}

bool Dispatcher::in_dispatcher_thread() const noexcept {
  return state_->dispatcher_thread.load() == std::this_thread::get_id();
}

int Dispatcher::fd() const noexcept { return state_->epoll.get(); }

std::size_t Dispatcher::run_once(std::chrono::milliseconds timeout) {
  detail::require_owner_process(*state_, "Dispatcher::run_once");
  if (running()) {
    throw std::logic_error("Dispatcher::run_once: the dispatcher thread is running");
  }
  if (state_->driving.exchange(true)) {
    throw std::logic_error("Dispatcher::run_once: called again while running");
  }
  const auto previous = state_->dispatcher_thread.exchange(std::this_thread::get_id());
  std::size_t served = 0;
  try {
    served = detail::run_pass(*state_, static_cast<int>(timeout.count()));
  } catch (...) {
    state_->dispatcher_thread = previous;
    state_->driving = false;
    throw;
  }
  state_->dispatcher_thread = previous;
  state_->driving = false;
  return served;
}

Watch Dispatcher::watch(ibv_context* device) {
  if (device == nullptr) {
    throw std::invalid_argument("Dispatcher::watch: the device is null");
  }
  DispatcherState& state = *state_;
  std::lock_guard<std::mutex> lock(state.mutex);
  if (state.devices.count(device) != 0) {
    throw std::invalid_argument("Dispatcher::watch: the device is watched already");
  }
  const std::uint64_t id = state.next_id++;
  state.add_locked(std::make_shared<detail::DeviceSource>(
      id, device, detail::make_nonblocking(device->async_fd)));
  state.devices.emplace(device, id);
  return Watch([weak = std::weak_ptr<DispatcherState>(state_), id,
                owner = state.owner]() noexcept {
    if (::getpid() != owner) return;  // a forked child's copy: inert
    if (auto state = weak.lock()) {
      if (auto source = state->remove(id)) source->guard.wait_idle();
    }
  });
}

CompletionWatch Dispatcher::watch_completions(ibv_comp_channel* channel,
                                              ibv_cq* cq,
                                              CompletionHandler handler,
                                              CompletionOptions options) {
  const char* verb = "Dispatcher::watch_completions";
  if (channel == nullptr || cq == nullptr) {
    throw std::invalid_argument(std::string(verb) + ": the channel or CQ is null");
  }
  if (!handler) {
    throw std::invalid_argument(std::string(verb) + ": the handler is empty");
  }
  if (cq->channel != channel) {
    throw std::invalid_argument(std::string(verb) +
                                ": the CQ was not created on this channel");
  }
  if (options.ack_batch == 0 || options.poll_batch == 0 || options.poll_batch > 256 ||
      options.budget == 0) {
    throw std::invalid_argument(std::string(verb) +
                                ": ack_batch and budget must be >= 1, poll_batch 1..256");
  }
  if (options.poll_budget.count() < 0 ||
      options.poll_budget > std::chrono::seconds(1)) {
    throw std::invalid_argument(std::string(verb) + ": poll_budget must be 0..1 s");
  }
  DispatcherState& state = *state_;
  auto entry = std::make_shared<detail::CqEntry>(cq, std::move(handler), options);
  std::shared_ptr<detail::ChannelSource> source;
  {
    // Lock order: the tables, then a channel.
    std::lock_guard<std::mutex> lock(state.mutex);
    auto it = state.channels.find(channel);
    if (it != state.channels.end()) {
      source = it->second;
    } else {
      const std::uint64_t id = state.next_id++;
      source = std::make_shared<detail::ChannelSource>(
          id, channel, detail::make_nonblocking(channel->fd));
      state.add_locked(source);
      state.channels.emplace(channel, source);
    }
    std::lock_guard<std::mutex> channel_lock(source->mutex);
    if (!source->cqs.emplace(cq, entry).second) {
      throw std::invalid_argument(std::string(verb) + ": the CQ is watched already");
    }
  }

  Watch watch([weak = std::weak_ptr<DispatcherState>(state_),
               weak_source = std::weak_ptr<detail::ChannelSource>(source), entry,
               owner = state.owner]() noexcept {
    if (::getpid() != owner) return;  // a forked child's copy: inert
    entry->guard.close();
    // Every event read for this CQ was counted in `unacked`: ack them all,
    // so that ibv_destroy_cq does not wait, whether or not the Dispatcher
    // still exists (gone, its thread is joined and nothing else counts).
    const auto ack_leftovers = [&entry] {
      if (entry->unacked == 0) return false;
      ibv_ack_cq_events(entry->cq, entry->unacked);
      entry->unacked = 0;
      entry->ack_calls.fetch_add(1, std::memory_order_relaxed);
      return true;
    };
    auto state = weak.lock();
    auto source = weak_source.lock();
    std::shared_ptr<detail::Source> retired;
    bool closed_behind_our_back = false;
    if (state && source) {
      std::lock_guard<std::mutex> lock(state->mutex);
      std::lock_guard<std::mutex> channel_lock(source->mutex);
      source->cqs.erase(entry->cq);
      if (ack_leftovers()) state->cq_ack_calls.fetch_add(1, std::memory_order_relaxed);
      // The last CQ of the channel: stop watching the channel, so that it
      // can be destroyed. A CQ watched on it later adds it again.
      if (source->cqs.empty()) {
        retired = state->take_locked(source->id);
        if (retired && !state->retire_locked(*retired)) closed_behind_our_back = true;
      }
    } else {
      ack_leftovers();
    }
    if (closed_behind_our_back) state->report_closed_behind_our_back(*retired);
    if (retired && detail::test_seams::after_channel_retired != nullptr) {
      detail::test_seams::after_channel_retired(entry->cq->channel);
    }
    entry->guard.wait_idle();
    if (retired) retired->guard.wait_idle();
  });

  // Stage I: armed before the caller can make any completion arrive.
  if (int rc = ibv_req_notify_cq(cq, options.solicited_only ? 1 : 0); rc != 0) {
    watch.release();
    detail::throw_system_error(rc, "ibv_req_notify_cq");
  }
  return CompletionWatch(entry, std::move(watch));
}

void Dispatcher::inject(ibv_context* device, int code, Element element) {
  DispatcherState& state = *state_;
  Delivery delivery =
      state.registry.resolve(Event::synthesize(device, code, element));
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    state.injected_queue.push_back(std::move(delivery));
  }
  state.injected.fetch_add(1, std::memory_order_relaxed);
  state.wake();
}

DispatcherStats Dispatcher::stats() const noexcept {
  const DispatcherState& s = *state_;
  return {s.async_events.load(),      s.injected.load(),
          s.devices_lost.load(),      s.completion_events.load(),
          s.cq_ack_calls.load(),      s.empty_completion_events.load(),
          s.empty_channel_reads.load(), s.work_completions.load(),
          s.errors.load()};
}

}  // namespace ibev
