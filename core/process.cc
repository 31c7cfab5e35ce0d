#include <ibev/core/process.h>

#include <pthread.h>

namespace ibev::detail {

std::atomic<pid_t> process_id{0};

namespace {

void forked_child() noexcept { process_id.store(::getpid(), std::memory_order_relaxed); }

}  // namespace

namespace {
// Before main(), so that the handler runs ahead of any registered later (an
// application's own, releasing ibev objects in its child).
const OwningProcess kRegisteredAtLoad;
}  // namespace

pid_t OwningProcess::current() noexcept {
  // Once, before any OwningProcess has an id. The handler first: a fork in
  // between runs it, so a child never keeps its parent's id. Unregistered
  // (pthread_atfork fails only without memory), process_id stays 0.
  static const bool registered = [] {
    if (::pthread_atfork(nullptr, nullptr, &forked_child) != 0) return false;
    process_id.store(::getpid(), std::memory_order_relaxed);
    return true;
  }();
  static_cast<void>(registered);
  const pid_t now = process_id.load(std::memory_order_relaxed);
  return now != 0 ? now : ::getpid();
}

}  // namespace ibev::detail
