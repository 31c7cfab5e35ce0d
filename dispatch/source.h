// Internal to dispatch/: one fd in the reactor's epoll set, serving itself.
//
// The reactor knows no kinds of source: it finds the Source an epoll event
// names and calls serve(). Each kind (a device's async events, a completion
// channel, an application's fd) is one class in one file, and reads top-down
// there from the fd being ready to the handler being called.
#ifndef IBEV_DISPATCH_SOURCE_H_
#define IBEV_DISPATCH_SOURCE_H_

#include <cstdint>

#include <ibev/core/call_guard.h>

namespace ibev::detail {

class Source {
 public:
  // `original_flags`: the fd's flags before the source made it non-blocking,
  // given back when it leaves the reactor.
  Source(int fd, int original_flags) noexcept : fd_(fd), original_flags_(original_flags) {}
  virtual ~Source() = default;
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;

  // What epoll reported. Serves at most one turn's budget; never throws
  // (failures go to the reactor's sink). Called with guard() entered.
  virtual void serve(std::uint32_t revents) noexcept = 0;
  // The events it waits for (EPOLLIN unless it says otherwise).
  virtual std::uint32_t interest() const noexcept;

  int fd() const noexcept { return fd_; }
  int original_flags() const noexcept { return original_flags_; }
  std::uint64_t id() const noexcept { return id_; }
  // Held while the reactor serves the source: releasing its handle closes it
  // and waits until the reactor is done with it.
  CallGuard& guard() noexcept { return guard_; }

 private:
  friend class Reactor;
  const int fd_;
  const int original_flags_;
  std::uint64_t id_ = 0;  // set by Reactor::add_locked
  CallGuard guard_;
};

// Makes `fd` non-blocking; returns its previous flags, for restoring. Throws
// std::system_error (fcntl).
int make_nonblocking(int fd);

}  // namespace ibev::detail

#endif  // IBEV_DISPATCH_SOURCE_H_
