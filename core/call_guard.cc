// Locking. A guard has no mutex of its own: entering and leaving are its two
// atomics, sequentially consistent (call_guard.h says why that is enough),
// and the stack of guards entered on a thread is that thread's alone. The
// only locks here are the 16 wait stripes' mutexes, each shared by every guard
// whose address lands on it, and each a leaf: wait_idle() holds its stripe's
// across the condition wait (which releases it while asleep), and
// release_one() of a closed guard takes it for an empty critical section
// before notifying, so a leave cannot fall between a waiter's check and its
// sleep. No stripe is held while another is, nor while a guarded call runs
// (it runs between enter() and leave(), with nothing of this file held), nor
// across any call out. Guards sharing a stripe wake each other's waiters,
// which recheck their own count and sleep again. The rule for callers
// (call_guard.h): wait_idle() waits for calls on other threads, so it must
// not be called holding a lock that such a call may take.
#include <ibev/core/call_guard.h>
#include <ibev/core/thread_annotations.h>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <vector>

namespace ibev::detail {
namespace {

// Guards entered on this thread, innermost last (handlers may deliver events
// themselves, so calls nest).
std::vector<const CallGuard*>& entered_here() {
  thread_local std::vector<const CallGuard*> stack;
  return stack;
}

// Waiting is rare (a release racing a running handler), so guards share a few
// mutex/condition pairs instead of carrying one each: that keeps a handler at
// a few dozen bytes when a million objects are registered.
struct WaitStripe {
  Mutex mutex;
  std::condition_variable idle;
};

WaitStripe& stripe_for(const CallGuard* guard) {
  static std::array<WaitStripe, 16> stripes;
  return stripes[std::hash<const CallGuard*>{}(guard) % stripes.size()];
}

}  // namespace

bool CallGuard::try_enter() noexcept {
  running_.fetch_add(1);
  if (closed_.load()) {
    release_one();
    return false;
  }
  entered_here().push_back(this);
  return true;
}

void CallGuard::leave() noexcept {
  entered_here().pop_back();
  release_one();
}

void CallGuard::release_one() noexcept {
  running_.fetch_sub(1);
  if (closed_.load()) {
    // Taking the mutex orders this notify after the waiter's predicate check.
    WaitStripe& stripe = stripe_for(this);
    { MutexLock lock(stripe.mutex); }
    stripe.idle.notify_all();
  }
}

bool CallGuard::running_here() const noexcept {
  const auto& stack = entered_here();
  return std::find(stack.begin(), stack.end(), this) != stack.end();
}

bool CallGuard::inside_any() noexcept { return !entered_here().empty(); }

void CallGuard::wait_idle() noexcept {
  const auto& stack = entered_here();
  const auto own =
      static_cast<std::uint32_t>(std::count(stack.begin(), stack.end(), this));
  WaitStripe& stripe = stripe_for(this);
  UniqueLock lock(stripe.mutex);
  stripe.idle.wait(lock.native(), [&] { return running_.load() <= own; });
}

}  // namespace ibev::detail
