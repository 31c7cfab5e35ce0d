#include <ibev/core/process.h>

#include <pthread.h>
#include <unistd.h>

#include <atomic>

namespace ibev::detail {
namespace {

std::atomic<std::uint64_t> forks{0};  // this process's number: forks in its line

void forked_child() noexcept { forks.fetch_add(1, std::memory_order_relaxed); }

// The number of the calling process. Fixed at the first call, before any
// OwningProcess is made: counting forks, or, if the handler cannot be
// registered (pthread_atfork fails only without memory), the process id. A
// child inherits the choice, so both numbers are never compared.
bool counting_forks() noexcept {
  static const bool registered = ::pthread_atfork(nullptr, nullptr, &forked_child) == 0;
  return registered;
}

}  // namespace

std::uint64_t OwningProcess::current() noexcept {
  if (counting_forks()) return forks.load(std::memory_order_relaxed);
  return static_cast<std::uint64_t>(::getpid());
}

}  // namespace ibev::detail
