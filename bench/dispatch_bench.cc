// Injected events per second through the Dispatcher's full path (resolve at
// inject, queue, wake the dispatcher thread, deliver to a QP handler), with
// the handler on the dispatching thread, on a WorkerThread, and on a
// Boost.Asio strand: what moving delivery to an executor costs per event.
// kRounds interleaved rounds, the three placements in a shuffled order each
// round, after a warm-up round that is not reported: the machine's drift and
// any order effect then fall on each placement alike, and the ratios are
// paired by round. The medians come first (scripts take the first match),
// then every round's figures. Also how long stop() takes on a running, idle
// Dispatcher (wake its thread, join it). Prints figures; never fails on
// timing.
//   bazel run -c opt //bench:dispatch_bench
#include <ibev/dispatch/asio.h>
#include <ibev/dispatch/dispatcher.h>
#include <ibev/dispatch/worker_thread.h>

#include "bench/cpu_time.h"
#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <future>
#include <numeric>
#include <random>
#include <thread>
#include <utility>
#include <vector>

namespace {

using bench::cpu_seconds;

constexpr int kEvents = 1'000'000;
constexpr int kRounds = 15;
// Fixed, and printed, so that a run's placement order can be replayed.
constexpr std::uint32_t kOrderSeed = 20'240'611;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Figures {
  double seconds = 0;        // wall, first inject to last handler call
  double cpu_ns = 0;         // the process's CPU per event, every thread
  double inject_cpu_ns = 0;  // the injecting thread's CPU per event, its loop only
  int position = 0;          // 1..3: where the placement ran in its round
};

// The process's CPU per event (every thread: the injecting one, the
// dispatching one, the executor's), from the first inject to the last
// handler call. Meanwhile the main thread sleeps on a future that the last
// handler call sets: a spin-wait would be counted as the placement's cost,
// and one that delivers sooner would "save" spin. The injecting thread's own
// CPU is taken around the inject loop alone (RUSAGE_THREAD). Wall time per
// event is printed too, but with an executor the work is spread over one
// more thread, so wall time is not its cost.
Figures run(ibev::Executor executor) {
  ibev::Dispatcher dispatcher;
  ibv_context device{};
  ibv_qp qp{};
  std::atomic<int> delivered{0};
  // Declared before the Handle, so that it outlives the handler's last call
  // (releasing the Handle waits for a running handler).
  std::promise<void> all_delivered;
  std::future<void> done = all_delivered.get_future();
  ibev::Handle handler = dispatcher.registry().attach(
      &qp, ibev::EventFilter{},
      [&](const ibev::Event&) {
        if (delivered.fetch_add(1, std::memory_order_relaxed) + 1 == kEvents) {
          all_delivered.set_value();
        }
      },
      std::move(executor));
  dispatcher.start();
  const double process_before = cpu_seconds();
  const double thread_before = cpu_seconds(RUSAGE_THREAD);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kEvents; ++i) dispatcher.inject(&device, IBV_EVENT_COMM_EST, &qp);
  const double inject_cpu = cpu_seconds(RUSAGE_THREAD) - thread_before;
  done.wait();
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  const double process_cpu = cpu_seconds() - process_before;
  dispatcher.stop();
  Figures figures;
  figures.seconds = took.count();
  figures.cpu_ns = process_cpu * 1e9 / kEvents;
  figures.inject_cpu_ns = inject_cpu * 1e9 / kEvents;
  return figures;
}

// The figures of an inject line, after its name and placement.
void print_inject_figures(double seconds, double cpu_ns, double inject_cpu_ns) {
  std::printf(
      " events=%d seconds=%.3f events_per_s=%.0f ns_per_event=%.1f cpu_ns_per_event=%.1f "
      "inject_cpu_ns_per_event=%.1f\n",
      kEvents, seconds, kEvents / seconds, seconds * 1e9 / kEvents, cpu_ns, inject_cpu_ns);
}

void stop_time() {
  constexpr int kStopRounds = 21;
  std::vector<double> ms;
  for (int i = 0; i < kStopRounds; ++i) {
    ibev::Dispatcher dispatcher;
    dispatcher.start();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // asleep in epoll_wait
    const auto start = std::chrono::steady_clock::now();
    dispatcher.stop();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  }
  const std::vector<double> in_order = ms;
  std::sort(ms.begin(), ms.end());
  std::printf("stop rounds=%d median_ms=%.3f max_ms=%.3f\n", kStopRounds, ms[kStopRounds / 2],
              ms.back());
  // Every round's value too, in round order, for scripts to compute their
  // own statistics from.
  std::printf("stop_ms");
  for (const double v : in_order) std::printf(" %.3f", v);
  std::printf("\n");
}

}  // namespace

int main() {
  // The executors live through every round; between their own runs their
  // threads sleep, which costs the other placements nothing.
  ibev::WorkerThread worker;
  boost::asio::io_context io;
  auto work = boost::asio::make_work_guard(io);
  std::thread io_thread([&] { io.run(); });
  struct Placement {
    const char* where;
    ibev::Executor executor;
    std::vector<Figures> rounds;
  };
  std::array<Placement, 3> placements{{
      {"dispatcher", {}, {}},
      {"worker", worker.executor(), {}},
      {"asio_strand", ibev::asio_executor(boost::asio::make_strand(io)), {}},
  }};
  std::mt19937 rng(kOrderSeed);
  std::array<std::size_t, 3> order;
  std::iota(order.begin(), order.end(), 0);
  for (int round = 0; round <= kRounds; ++round) {  // round 0: the warm-up
    std::shuffle(order.begin(), order.end(), rng);
    for (std::size_t position = 0; position < order.size(); ++position) {
      Placement& p = placements[order[position]];
      Figures figures = run(p.executor);
      figures.position = static_cast<int>(position) + 1;
      if (round > 0) p.rounds.push_back(figures);
    }
  }
  work.reset();
  io_thread.join();

  std::printf("dispatch_bench rounds=%d warmup_rounds=1 order_seed=%u "
              "(placements in an order shuffled by mt19937(order_seed) each round)\n",
              kRounds, kOrderSeed);
  // Medians over the rounds of each round's figures, then of each round's
  // ratios (paired: both figures from the same round).
  for (const Placement& p : placements) {
    std::vector<double> seconds, cpu_ns, inject_cpu_ns;
    for (const Figures& f : p.rounds) {
      seconds.push_back(f.seconds);
      cpu_ns.push_back(f.cpu_ns);
      inject_cpu_ns.push_back(f.inject_cpu_ns);
    }
    std::printf("inject where=%s rounds=%d", p.where, kRounds);
    print_inject_figures(median(seconds), median(cpu_ns), median(inject_cpu_ns));
  }
  const std::vector<Figures>& inline_rounds = placements[0].rounds;
  std::vector<double> worker_ratio, strand_ratio;
  for (int r = 0; r < kRounds; ++r) {
    worker_ratio.push_back(placements[1].rounds[r].cpu_ns / inline_rounds[r].cpu_ns);
    strand_ratio.push_back(placements[2].rounds[r].cpu_ns / inline_rounds[r].cpu_ns);
  }
  std::printf("executor_cost cpu_ratios worker_ratio=%.2f asio_strand_ratio=%.2f\n",
              median(worker_ratio), median(strand_ratio));
  for (int r = 0; r < kRounds; ++r) {
    for (const Placement& p : placements) {
      const Figures& f = p.rounds[r];
      // Not "inject": scripts take the "inject" lines as the medians, one per
      // placement.
      std::printf("inject_round round=%d where=%s position=%d", r + 1, p.where, f.position);
      print_inject_figures(f.seconds, f.cpu_ns, f.inject_cpu_ns);
    }
    std::printf(
        "executor_cost round=%d dispatcher_ns_per_event=%.1f worker_ns_per_event=%.1f "
        "strand_ns_per_event=%.1f worker_ratio=%.4f strand_ratio=%.4f\n",
        r + 1, inline_rounds[r].cpu_ns, placements[1].rounds[r].cpu_ns,
        placements[2].rounds[r].cpu_ns, worker_ratio[r], strand_ratio[r]);
  }
  stop_time();
  return 0;
}
