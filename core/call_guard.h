// Internal to ibev: the wait half of "release waits for the handler".
//
// Boost.Signals2 disconnects without waiting for a call in progress. The
// kernel does wait (ib_unregister_event_handler takes the device's rwsem), and
// so must ibev: once a handler's Handle is released, the handler's captures
// may be gone. CallGuard counts calls in progress; close() stops new ones
// from starting and wait_idle() waits for the others to return. A call
// running on the closing thread itself is not waited for (it would be waiting
// for itself): that is what makes releasing a handle from inside its own
// handler safe. A call is entered only through enter(), whose result leaves
// it, so no early return can leave a call counted for good.
//
// Locking: the few mutexes waiters share (call_guard.cc) are leaves. Never
// call wait_idle() holding a lock that a guarded call may take.
#ifndef IBEV_CORE_CALL_GUARD_H_
#define IBEV_CORE_CALL_GUARD_H_

#include <atomic>
#include <cstdint>

namespace ibev::detail {

class CallGuard {
 public:
  // A call in progress on this thread, from enter() to the end of its scope:
  // `if (const auto entered = guard.enter()) { ... }`. Neither copied nor
  // moved, so it is left on the thread that entered.
  class [[nodiscard]] Entered {
   public:
    Entered(const Entered&) = delete;
    Entered& operator=(const Entered&) = delete;
    ~Entered() {
      if (guard_ != nullptr) guard_->leave();
    }
    explicit operator bool() const noexcept { return guard_ != nullptr; }

   private:
    friend class CallGuard;
    explicit Entered(CallGuard* guard) noexcept : guard_(guard) {}
    CallGuard* const guard_;
  };

  CallGuard() = default;
  CallGuard(const CallGuard&) = delete;
  CallGuard& operator=(const CallGuard&) = delete;

  // Marks a call as started on this thread; false (nothing started) once
  // closed.
  Entered enter() noexcept { return Entered(try_enter() ? this : nullptr); }

  // After close() returns, try_enter() fails.
  void close() noexcept { closed_.store(true); }
  bool closed() const noexcept { return closed_.load(); }

  // Blocks until no call is in progress on another thread. Call after close().
  void wait_idle() noexcept;
  // Whether this thread is inside a call (it entered and has not left).
  bool running_here() const noexcept;
  // Whether this thread is inside a call of any guard: a handler ibev runs
  // (inline or on an executor), which a release on another thread may be
  // waiting for.
  static bool inside_any() noexcept;

 private:
  bool try_enter() noexcept;
  void leave() noexcept;
  void release_one() noexcept;

  // Both seq_cst: try_enter increments then reads closed_, close() writes
  // closed_ then wait_idle reads running_, so one of them sees the other.
  std::atomic<std::uint32_t> running_{0};
  std::atomic<bool> closed_{false};
};

}  // namespace ibev::detail

#endif  // IBEV_CORE_CALL_GUARD_H_
