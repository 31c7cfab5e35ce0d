// tools/thread_safety.sh must reject this file when UNLOCKED_READ is
// defined (a guarded field read without its mutex) and accept it otherwise:
// thread_safety_test.sh checks both, so the check is shown able to fail.
#include <ibev/core/thread_annotations.h>

namespace {

class Counter {
 public:
  void add() IBEV_EXCLUDES(mutex_) {
    ibev::detail::MutexLock lock(mutex_);
    ++count_;
  }
  int count() IBEV_EXCLUDES(mutex_) {
#ifdef UNLOCKED_READ
    return count_;
#else
    ibev::detail::MutexLock lock(mutex_);
    return count_;
#endif
  }

 private:
  ibev::detail::Mutex mutex_;
  int count_ IBEV_GUARDED_BY(mutex_) = 0;
};

}  // namespace

int main() {
  Counter counter;
  counter.add();
  return counter.count() == 1 ? 0 : 1;
}
