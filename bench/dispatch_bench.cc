// Injected events per second through the Dispatcher's full path (resolve at
// inject, queue, wake the dispatcher thread, deliver to a QP handler).
// Prints figures; never fails on timing. bazel run -c opt //bench:dispatch_bench
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include <ibev/dispatch/dispatcher.h>

int main() {
  constexpr int kEvents = 1'000'000;
  ibev::Dispatcher dispatcher;
  ibev::Registry& registry = dispatcher.registry();
  ibv_context device{};
  ibv_qp qp{};
  std::atomic<int> delivered{0};
  ibev::Handle handler = registry.attach(
      &qp, [&](const ibev::Event&) { delivered.fetch_add(1, std::memory_order_relaxed); });
  dispatcher.start();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kEvents; ++i) dispatcher.inject(&device, IBV_EVENT_COMM_EST, &qp);
  while (delivered.load() < kEvents) std::this_thread::yield();
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  dispatcher.stop();
  std::printf("inject events=%d seconds=%.3f events_per_s=%.0f ns_per_event=%.1f\n", kEvents,
              took.count(), kEvents / took.count(), took.count() * 1e9 / kEvents);
  return 0;
}
