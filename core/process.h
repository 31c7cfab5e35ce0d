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
// dear for a handle released per QP): each process has a number, made new in
// every forked child by a pthread_atfork handler.
//
// Thread-safety: any thread; an OwningProcess is immutable.
#ifndef IBEV_CORE_PROCESS_H_
#define IBEV_CORE_PROCESS_H_

#include <cstdint>

namespace ibev::detail {

class OwningProcess {
 public:
  // The calling process.
  OwningProcess() noexcept : number_(current()) {}

  // True in a child forked after this was made.
  bool inherited() const noexcept { return current() != number_; }

 private:
  static std::uint64_t current() noexcept;

  std::uint64_t number_;
};

}  // namespace ibev::detail

#endif  // IBEV_CORE_PROCESS_H_
