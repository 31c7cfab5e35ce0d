// Injected events per second through the Dispatcher's full path (resolve at
// inject, queue, wake the dispatcher thread, deliver to a QP handler), with
// the handler on the dispatching thread, on a WorkerThread, and on a
// Boost.Asio strand: what moving delivery to an executor costs per event.
// Also how long stop() takes on a running, idle Dispatcher (wake its thread,
// join it). Prints figures; never fails on timing.
//   bazel run -c opt //bench:dispatch_bench
#include <ibev/dispatch/asio.h>
#include <ibev/dispatch/dispatcher.h>
#include <ibev/dispatch/worker_thread.h>

#include "bench/cpu_time.h"
#include <algorithm>
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

namespace {

using bench::cpu_seconds;

constexpr int kEvents = 1'000'000;

// The process's CPU per event (every thread: the injecting one, the
// dispatching one, the executor's), from the first inject to the last
// handler call; wall time per event is printed too, but with an executor the
// work is spread over one more thread, so wall time is not its cost.
double run(const char* where, ibev::Executor executor) {
  ibev::Dispatcher dispatcher;
  ibv_context device{};
  ibv_qp qp{};
  std::atomic<int> delivered{0};
  ibev::Handle handler = dispatcher.registry().attach(
      &qp, ibev::EventFilter{},
      [&](const ibev::Event&) { delivered.fetch_add(1, std::memory_order_relaxed); },
      std::move(executor));
  dispatcher.start();
  const double cpu_before = cpu_seconds();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kEvents; ++i) dispatcher.inject(&device, IBV_EVENT_COMM_EST, &qp);
  while (delivered.load() < kEvents) std::this_thread::yield();
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  const double cpu_ns = (cpu_seconds() - cpu_before) * 1e9 / kEvents;
  dispatcher.stop();
  std::printf(
      "inject where=%s events=%d seconds=%.3f events_per_s=%.0f ns_per_event=%.1f "
      "cpu_ns_per_event=%.1f\n",
      where, kEvents, took.count(), kEvents / took.count(), took.count() * 1e9 / kEvents, cpu_ns);
  return cpu_ns;
}

void stop_time() {
  constexpr int kRounds = 21;
  std::vector<double> ms;
  for (int i = 0; i < kRounds; ++i) {
    ibev::Dispatcher dispatcher;
    dispatcher.start();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // asleep in epoll_wait
    const auto start = std::chrono::steady_clock::now();
    dispatcher.stop();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  }
  std::sort(ms.begin(), ms.end());
  std::printf("stop rounds=%d median_ms=%.3f max_ms=%.3f\n", kRounds, ms[kRounds / 2], ms.back());
}

}  // namespace

int main() {
  const double inline_ns = run("dispatcher", {});
  double worker_ns = 0, strand_ns = 0;
  {
    ibev::WorkerThread worker;
    worker_ns = run("worker", worker.executor());
  }
  {
    boost::asio::io_context io;
    auto work = boost::asio::make_work_guard(io);
    std::thread thread([&] { io.run(); });
    strand_ns = run("asio_strand", ibev::asio_executor(boost::asio::make_strand(io)));
    work.reset();
    thread.join();
  }
  std::printf("executor_cost cpu_ratios worker_ratio=%.2f asio_strand_ratio=%.2f\n",
              worker_ns / inline_ns, strand_ns / inline_ns);
  stop_time();
  return 0;
}
