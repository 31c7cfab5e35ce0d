// ibev::WorkerThread: a plain thread that runs tasks in the order given, the
// simplest Executor (core/executor.h), the kernel's IB_POLL_WORKQUEUE in
// userspace. Handlers that block (a database write, a log flush) go here so
// that the dispatching thread keeps serving completions.
//
// Thread-safety: executor() and post() may be called from any thread. A task
// that throws is handed to the FailureSink given at construction (empty:
// stderr) and the thread goes on. Destruction runs the tasks already posted,
// then joins; posting after destruction began is a bug the destructor cannot
// see, so stop posting first (release the handles that use it). Not from its
// own thread.
#ifndef IBEV_DISPATCH_WORKER_THREAD_H_
#define IBEV_DISPATCH_WORKER_THREAD_H_

#include <condition_variable>
#include <deque>
#include <thread>

#include <ibev/core/executor.h>
#include <ibev/core/failure.h>
#include <ibev/core/thread_annotations.h>

namespace ibev {

class WorkerThread {
 public:
  explicit WorkerThread(FailureSink on_failure = {});
  ~WorkerThread();
  WorkerThread(const WorkerThread&) = delete;
  WorkerThread& operator=(const WorkerThread&) = delete;

  void post(Task task) IBEV_EXCLUDES(mutex_);
  // An Executor posting here; valid while the WorkerThread lives.
  Executor executor() noexcept;
  bool in_worker_thread() const noexcept;

 private:
  void run() IBEV_EXCLUDES(mutex_);

  const FailureSink on_failure_;
  detail::Mutex mutex_;
  std::condition_variable ready_;
  std::deque<Task> tasks_ IBEV_GUARDED_BY(mutex_);
  bool done_ IBEV_GUARDED_BY(mutex_) = false;
  std::thread thread_;  // last: starts when the rest is ready
};

}  // namespace ibev

#endif  // IBEV_DISPATCH_WORKER_THREAD_H_
