// Internal to ibev: thread rules the compiler checks. Clang's thread-safety
// analysis (-Wthread-safety) proves, for every function it compiles, that a
// field marked IBEV_GUARDED_BY(m) is touched only with `m` held, that a
// function marked IBEV_REQUIRES(m) is called only with it held and one
// marked IBEV_EXCLUDES(m) only without; tools/thread_safety.sh runs it over
// the library. The macros are Abseil's (absl/base/thread_annotations.h) with
// an IBEV_ prefix, and expand to nothing for GCC.
//
// libstdc++'s std::mutex carries no annotations, so the analysis cannot see
// it taken: a mutex guarding annotated fields is a detail::Mutex, held by a
// detail::MutexLock (std::lock_guard) or a detail::UniqueLock
// (std::unique_lock, for a condition variable's wait or an early unlock);
// a std::shared_mutex is a detail::SharedMutex, held by a ReaderLock
// (std::shared_lock) or a WriterLock.
// A condition variable waits on UniqueLock::native(); its predicate is a
// lambda the analysis checks on its own, so it says IBEV_REQUIRES(m) too
// when it reads a guarded field.
//
// The dispatching thread is a rule of its own, checked at run time:
// IBEV_ASSERT_DISPATCHING(d) asserts, in builds without NDEBUG, that the
// calling thread runs `d`'s turn now (`d`: a Dispatcher, or anything with
// its in_dispatcher_thread(); dispatch/dispatcher.h says which thread that
// is). It sits at the top of each function that must run there, as Envoy's
// ASSERT(dispatcher_.isThreadSafe()) does.
#ifndef IBEV_CORE_THREAD_ANNOTATIONS_H_
#define IBEV_CORE_THREAD_ANNOTATIONS_H_

#include <cassert>
#include <mutex>
#include <shared_mutex>

#if defined(__clang__)
#define IBEV_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define IBEV_THREAD_ANNOTATION_(x)
#endif

#define IBEV_CAPABILITY(x) IBEV_THREAD_ANNOTATION_(capability(x))
#define IBEV_SCOPED_CAPABILITY IBEV_THREAD_ANNOTATION_(scoped_lockable)
#define IBEV_GUARDED_BY(x) IBEV_THREAD_ANNOTATION_(guarded_by(x))
#define IBEV_PT_GUARDED_BY(x) IBEV_THREAD_ANNOTATION_(pt_guarded_by(x))
#define IBEV_ACQUIRED_BEFORE(...) IBEV_THREAD_ANNOTATION_(acquired_before(__VA_ARGS__))
#define IBEV_ACQUIRED_AFTER(...) IBEV_THREAD_ANNOTATION_(acquired_after(__VA_ARGS__))
#define IBEV_REQUIRES(...) IBEV_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define IBEV_EXCLUDES(...) IBEV_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
#define IBEV_REQUIRES_SHARED(...) \
  IBEV_THREAD_ANNOTATION_(requires_shared_capability(__VA_ARGS__))
#define IBEV_ACQUIRE(...) IBEV_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define IBEV_ACQUIRE_SHARED(...) IBEV_THREAD_ANNOTATION_(acquire_shared_capability(__VA_ARGS__))
#define IBEV_RELEASE(...) IBEV_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define IBEV_RELEASE_SHARED(...) IBEV_THREAD_ANNOTATION_(release_shared_capability(__VA_ARGS__))
#define IBEV_TRY_ACQUIRE(...) IBEV_THREAD_ANNOTATION_(try_acquire_capability(__VA_ARGS__))
#define IBEV_ASSERT_CAPABILITY(x) IBEV_THREAD_ANNOTATION_(assert_capability(x))
#define IBEV_RETURN_CAPABILITY(x) IBEV_THREAD_ANNOTATION_(lock_returned(x))
#define IBEV_NO_THREAD_SAFETY_ANALYSIS IBEV_THREAD_ANNOTATION_(no_thread_safety_analysis)

// See above. `assert` so that NDEBUG builds pay nothing.
#define IBEV_ASSERT_DISPATCHING(dispatcher) assert((dispatcher).in_dispatcher_thread())

namespace ibev::detail {

// A std::mutex the analysis sees (Lockable, so std::lock_guard and
// std::scoped_lock take it too, unchecked).
class IBEV_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() IBEV_ACQUIRE() { mutex_.lock(); }
  void unlock() IBEV_RELEASE() { mutex_.unlock(); }
  bool try_lock() IBEV_TRY_ACQUIRE(true) { return mutex_.try_lock(); }
  // Tells the analysis the caller holds it, where a lock was taken out of
  // its sight (a lock handed in by the caller); checks nothing at run time.
  void assert_held() const IBEV_ASSERT_CAPABILITY(this) {}

 private:
  friend class UniqueLock;
  std::mutex mutex_;
};

// std::lock_guard for a Mutex.
class IBEV_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mutex) IBEV_ACQUIRE(mutex) : mutex_(mutex) { mutex_.lock(); }
  ~MutexLock() IBEV_RELEASE() { mutex_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mutex_;
};

// std::unique_lock for a Mutex: native() is what std::condition_variable
// waits on (it gives the mutex back held).
class IBEV_SCOPED_CAPABILITY UniqueLock {
 public:
  explicit UniqueLock(Mutex& mutex) IBEV_ACQUIRE(mutex) : lock_(mutex.mutex_) {}
  ~UniqueLock() IBEV_RELEASE() {}
  UniqueLock(const UniqueLock&) = delete;
  UniqueLock& operator=(const UniqueLock&) = delete;

  void lock() IBEV_ACQUIRE() { lock_.lock(); }
  void unlock() IBEV_RELEASE() { lock_.unlock(); }
  std::unique_lock<std::mutex>& native() noexcept { return lock_; }

 private:
  std::unique_lock<std::mutex> lock_;
};

// A std::shared_mutex the analysis sees.
class IBEV_CAPABILITY("mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void lock() IBEV_ACQUIRE() { mutex_.lock(); }
  void unlock() IBEV_RELEASE() { mutex_.unlock(); }
  void lock_shared() IBEV_ACQUIRE_SHARED() { mutex_.lock_shared(); }
  void unlock_shared() IBEV_RELEASE_SHARED() { mutex_.unlock_shared(); }

 private:
  std::shared_mutex mutex_;
};

// std::shared_lock for a SharedMutex.
class IBEV_SCOPED_CAPABILITY ReaderLock {
 public:
  explicit ReaderLock(SharedMutex& mutex) IBEV_ACQUIRE_SHARED(mutex) : mutex_(mutex) {
    mutex_.lock_shared();
  }
  ~ReaderLock() IBEV_RELEASE() { mutex_.unlock_shared(); }
  ReaderLock(const ReaderLock&) = delete;
  ReaderLock& operator=(const ReaderLock&) = delete;

 private:
  SharedMutex& mutex_;
};

// std::lock_guard for a SharedMutex, taken exclusively.
class IBEV_SCOPED_CAPABILITY WriterLock {
 public:
  explicit WriterLock(SharedMutex& mutex) IBEV_ACQUIRE(mutex) : mutex_(mutex) { mutex_.lock(); }
  ~WriterLock() IBEV_RELEASE() { mutex_.unlock(); }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  SharedMutex& mutex_;
};

}  // namespace ibev::detail

#endif  // IBEV_CORE_THREAD_ANNOTATIONS_H_
