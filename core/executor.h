// ibev::Executor: where a handler runs, chosen per subscription, like the
// kernel's ib_poll_context (IB_POLL_DIRECT / SOFTIRQ / WORKQUEUE).
//
// An empty Executor (the default) runs handlers on the dispatching thread, as
// they are resolved. Any other is a function that takes a task and runs it
// later on a thread of its choosing (dispatch/worker_thread.h has a plain
// worker thread; dispatch/asio.h adapts a Boost.Asio executor or strand). Only
// delivery moves: events are still read, resolved and acked on the
// dispatching thread, in order; an executor that runs its tasks in order (a
// strand, one worker thread) keeps one subscription's events in order.
//
// A handler released before its task runs is not called (the release rule of
// core/handle.h holds on the executor's thread too). An executor must accept
// tasks from the dispatching thread without blocking for long; a task it
// drops is a handler call lost.
#ifndef IBEV_CORE_EXECUTOR_H_
#define IBEV_CORE_EXECUTOR_H_

#include <functional>

namespace ibev {

using Task = std::function<void()>;
using Executor = std::function<void(Task)>;

}  // namespace ibev

#endif  // IBEV_CORE_EXECUTOR_H_
