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

void CallGuard::wait_idle() noexcept {
  const auto& stack = entered_here();
  const auto own =
      static_cast<std::uint32_t>(std::count(stack.begin(), stack.end(), this));
  WaitStripe& stripe = stripe_for(this);
  UniqueLock lock(stripe.mutex);
  stripe.idle.wait(lock.native(), [&] { return running_.load() <= own; });
}

}  // namespace ibev::detail
