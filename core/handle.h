// ibev::Handle: the one owning handle of everything ibev registers: an object's
// event handler or a device listener (Registry), a device's async fd, a CQ's
// completions or an application fd served by a Dispatcher.
//
// Move-only. release() (or destruction) undoes the registration, once; after
// it, active() is false. The wait rule is the same for every handle: released
// on a thread that is not running the handler, release() returns only when
// the handler is not running and never will again (so its captures may be
// destroyed); released from inside the handler itself (or from anything that
// handler calls), it returns at once and the handler is not called again. A
// handle may outlive what made it (a Registry, a Dispatcher): releasing it
// then does nothing. In a forked child, releasing an inherited handle touches
// nothing of the parent's (see dispatch/dispatcher.h).
//
// Threads: release() may run on any thread, the dispatching thread and an
// executor's included, and from inside any handler. One Handle is one
// object: two threads must not release (or move, or assign) the same Handle
// at once; to release from several places, give it one owner (a struct
// under the application's lock) or release it on one thread. Do not release
// it while holding a lock that its handler takes: the release waits for the
// handler (unless it is that handler).
#ifndef IBEV_CORE_HANDLE_H_
#define IBEV_CORE_HANDLE_H_

#include <functional>
#include <utility>

namespace ibev {

class [[nodiscard]] Handle {
 public:
  Handle() noexcept = default;
  // `release` runs once, from release() or the destructor; it must not throw.
  explicit Handle(std::function<void()> release) noexcept
      : release_(std::move(release)) {}
  Handle(Handle&& other) noexcept : release_(std::exchange(other.release_, {})) {}
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      release();
      release_ = std::exchange(other.release_, {});
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { release(); }

  void release() noexcept {
    if (auto release = std::exchange(release_, {})) release();
  }
  bool active() const noexcept { return static_cast<bool>(release_); }

 private:
  std::function<void()> release_;
};

}  // namespace ibev

#endif  // IBEV_CORE_HANDLE_H_
