// Internal to ibev: whether code runs in the process that made something, or
// in a child forked after it was made.
//
// A forked child copies its parent's memory as the parent's threads left it:
// a mutex one of them held stays held, a CallGuard still counts a handler that
// was running on a thread the child does not have, and an rdma-core object is
// the parent's (a destroy verb in the child destroys it there). So everything
// of ibev that a release would lock, wait for or destroy records its
// OwningProcess, and in another process touches none of it: a forked child
// may only let go of what it inherited (ibv_fork_init(3)).
//
// inherited() is a load, not getpid(2) (a system call since glibc 2.25, too
// dear for a handle released per QP): the process id is kept in memory and
// set anew in every forked child by a pthread_atfork handler, registered
// when the library loads (without one, when it could not be registered, it
// is asked of the kernel each time). A child made without fork() runs no
// atfork handler: inherited_now() asks the kernel, where a verb follows.
//
// Thread-safety: any thread; an OwningProcess is immutable. Its size is a
// pid_t's, which verbs/ownership.h's layout (and so the wrappers') keeps.
#ifndef IBEV_CORE_PROCESS_H_
#define IBEV_CORE_PROCESS_H_

#include <sys/types.h>
#include <unistd.h>

#include <atomic>

namespace ibev::detail {

// This process's id once the fork handler is registered (the first
// OwningProcess does it), 0 while it is not.
extern std::atomic<pid_t> process_id;

class OwningProcess {
 public:
  // The calling process.
  OwningProcess() noexcept : id_(current()) {}

  // True in a child forked after this was made.
  bool inherited() const noexcept {
    const pid_t now = process_id.load(std::memory_order_relaxed);
    return (now != 0 ? now : ::getpid()) != id_;
  }
  // The same, asked of the kernel: for a decision a verb follows anyway (a
  // destroy), so that a child made without fork() (clone(2), _Fork(3)),
  // which no atfork handler hears of, is caught there too.
  bool inherited_now() const noexcept { return ::getpid() != id_; }

 private:
  static pid_t current() noexcept;

  pid_t id_;
};

}  // namespace ibev::detail

#endif  // IBEV_CORE_PROCESS_H_
