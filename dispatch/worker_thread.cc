// Locking: `mutex_` guards the task queue and `done_` and is a leaf: no task
// runs, and no task is destroyed, while it is held (a task's captures may post
// here, or release a Handle that waits for this thread).
#include <ibev/dispatch/worker_thread.h>

#include <stdexcept>
#include <utility>

namespace ibev {

WorkerThread::WorkerThread(FailureSink on_failure)
    : on_failure_(std::move(on_failure)), thread_([this] { run(); }) {}

WorkerThread::~WorkerThread() {
  {
    detail::MutexLock lock(mutex_);
    done_ = true;
  }
  ready_.notify_all();
  thread_.join();
}

void WorkerThread::post(Task task) {
  if (!task) throw std::invalid_argument("WorkerThread::post: the task is empty");
  {
    detail::MutexLock lock(mutex_);
    tasks_.push_back(std::move(task));
  }
  ready_.notify_one();
}

Executor WorkerThread::executor() noexcept {
  return [this](Task task) { post(std::move(task)); };
}

bool WorkerThread::in_worker_thread() const noexcept {
  return std::this_thread::get_id() == thread_.get_id();
}

void WorkerThread::run() {
  detail::UniqueLock lock(mutex_);
  for (;;) {
    ready_.wait(lock.native(), [this]() IBEV_REQUIRES(mutex_) { return done_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // done, and everything posted has run
    Task task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    reported_call("task on a WorkerThread", task,
                  [this](const Failure& failure) { send_to(on_failure_, failure); });
    task = nullptr;  // its captures may post here: destroyed unlocked
    lock.lock();
  }
}

}  // namespace ibev
