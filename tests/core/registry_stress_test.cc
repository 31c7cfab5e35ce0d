// Many threads attaching and releasing while others route a million events:
// every event is delivered exactly once (to the handlers attached when it was
// resolved, or to the unclaimed observers), and no handler runs after its
// release returned. Meant to run under --config=tsan and --config=asan too.
#define BOOST_TEST_MODULE ibev_core_registry_stress
#include <array>
#include <atomic>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include <ibev/core/registry.h>

using ibev::Handle;
using ibev::Event;
using ibev::Registry;

namespace {

constexpr int kAttachers = 8;
constexpr int kRouters = 4;
constexpr int kEventsPerRouter = 250'000;  // 1M in all
constexpr int kObjects = 64;

struct HandlerState {
  std::atomic<bool> released{false};
};

}  // namespace

BOOST_AUTO_TEST_CASE(attach_release_and_route_concurrently) {
  Registry registry;
  ibv_context device{};
  std::array<ibv_qp, kObjects> qps{};

  std::atomic<std::uint64_t> handler_calls{0};
  std::atomic<std::uint64_t> calls_after_release{0};
  std::atomic<std::uint64_t> unclaimed_seen{0};
  std::atomic<bool> routing{true};

  Handle unclaimed = registry.on_unclaimed(
      [&](const Event&) { unclaimed_seen.fetch_add(1, std::memory_order_relaxed); });

  auto make_handler = [&](std::shared_ptr<HandlerState> state) {
    return [&, state](const Event&) {
      if (state->released.load()) calls_after_release.fetch_add(1);
      handler_calls.fetch_add(1, std::memory_order_relaxed);
    };
  };

  std::vector<std::thread> attachers;
  std::atomic<std::uint64_t> attach_cycles{0};
  for (int t = 0; t < kAttachers; ++t) {
    attachers.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::uniform_int_distribution<int> pick(0, kObjects - 1);
      std::vector<std::pair<Handle, std::shared_ptr<HandlerState>>> held;
      while (routing.load()) {
        auto state = std::make_shared<HandlerState>();
        if (rng() % 8 == 0) {
          held.emplace_back(registry.listen(&device, make_handler(state)), state);
        } else {
          held.emplace_back(registry.attach(&qps[pick(rng)], make_handler(state)),
                            state);
        }
        if (held.size() > 4) {
          const std::size_t victim = rng() % held.size();
          held[victim].first.release();
          held[victim].second->released.store(true);
          held.erase(held.begin() + static_cast<long>(victim));
        }
        attach_cycles.fetch_add(1, std::memory_order_relaxed);
        // Paced, so that 8 attachers on a small machine leave the routers CPU:
        // a duration on purpose, as nothing is waited for.
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
      for (auto& [attachment, state] : held) {
        attachment.release();
        state->released.store(true);
      }
    });
  }

  std::atomic<std::uint64_t> ran_total{0}, events_without_handler{0};
  std::vector<std::thread> routers;
  for (int t = 0; t < kRouters; ++t) {
    routers.emplace_back([&, t] {
      std::mt19937 rng(100 + t);
      std::uniform_int_distribution<int> pick(0, kObjects - 1);
      for (int i = 0; i < kEventsPerRouter; ++i) {
        const Event event =
            i % 16 == 0
                ? Event::synthesize(&device, IBV_EVENT_PORT_ERR, ibev::Port{1})
                : Event::synthesize(&device, IBV_EVENT_COMM_EST,
                                    &qps[pick(rng)]);
        // Resolve and deliver apart, as a dispatcher does around its ack,
        // sometimes with a reschedule in between to widen the window.
        const auto delivery = registry.resolve(event);
        if (i % 64 == 0) std::this_thread::yield();
        const std::size_t ran = registry.deliver(delivery);
        ran_total.fetch_add(ran, std::memory_order_relaxed);
        if (ran == 0) events_without_handler.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }

  // Counters are readable while delivery goes on.
  std::thread reader([&] {
    std::uint64_t last = 0;
    while (routing.load()) {
      const auto total = registry.counters(&device).total();
      const std::uint64_t seen = total.delivered + total.unclaimed;
      BOOST_CHECK_GE(seen, last);
      last = seen;
      std::this_thread::yield();
    }
  });

  for (auto& r : routers) r.join();
  routing = false;
  for (auto& a : attachers) a.join();
  reader.join();

  constexpr std::uint64_t kEvents =
      std::uint64_t{kRouters} * kEventsPerRouter;
  const auto totals = registry.counters(&device).total();
  BOOST_TEST_MESSAGE("attach/release cycles: " << attach_cycles.load()
                     << ", delivered: " << totals.delivered
                     << ", unclaimed: " << totals.unclaimed);
  BOOST_TEST(calls_after_release.load() == 0u);
  BOOST_TEST(handler_calls.load() == ran_total.load());
  BOOST_TEST(totals.delivered + totals.unclaimed == kEvents);
  BOOST_TEST(totals.unclaimed == events_without_handler.load());
  BOOST_TEST(unclaimed_seen.load() == events_without_handler.load());
  BOOST_TEST(totals.handler_failures == 0u);
  // Both outcomes must have happened, or the test proved little.
  BOOST_TEST(totals.delivered > 0u);
  BOOST_TEST(totals.unclaimed > 0u);
  BOOST_TEST(attach_cycles.load() > 1000u);
}
