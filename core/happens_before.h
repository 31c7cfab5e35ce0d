// Internal: happens-before edges that run through the RDMA device, told to
// ThreadSanitizer.
//
// A thread writes a buffer, posts a work request, and the completion handler
// (on the dispatcher thread) reads what came of it. The order is real: the
// post reaches the device, the device completes it, the completion channel's
// fd wakes the dispatcher. But that path runs through the kernel and memory
// the device writes, where TSan cannot see it, so without these calls it
// reports the handler's reads as races. The post side releases on the CQ the
// completion will arrive on; the dispatcher acquires on it before handing the
// completions to the handler. Both are free unless built with TSan.
#ifndef IBEV_CORE_HAPPENS_BEFORE_H_
#define IBEV_CORE_HAPPENS_BEFORE_H_

#if defined(__SANITIZE_THREAD__)
#define IBEV_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define IBEV_TSAN 1
#endif
#endif

#ifdef IBEV_TSAN
extern "C" void __tsan_acquire(void* address);
extern "C" void __tsan_release(void* address);
#endif

namespace ibev::detail {

// Before posting work whose completion will arrive on the CQ at `cq`.
inline void release_before_post(const void* cq) noexcept {
#ifdef IBEV_TSAN
  __tsan_release(const_cast<void*>(cq));
#else
  static_cast<void>(cq);
#endif
}

// Before handing completions of the CQ at `cq` to a handler.
inline void acquire_before_completion(const void* cq) noexcept {
#ifdef IBEV_TSAN
  __tsan_acquire(const_cast<void*>(cq));
#else
  static_cast<void>(cq);
#endif
}

}  // namespace ibev::detail

#endif  // IBEV_CORE_HAPPENS_BEFORE_H_
