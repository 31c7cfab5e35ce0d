// Bounded turns: one CQ under continuous inflow, in adaptive mode with a long
// poll budget (it would poll for as long as completions keep coming), must not
// starve the rest of the loop. While it is saturated, an injected event, a
// second CQ's completion, stop() and a real port event are each served within
// a bounded number of the busy CQ's completions (counts, not wall time).
#define BOOST_TEST_MODULE ibev_softroce_fairness
#include <fcntl.h>
#include <poll.h>

#include <atomic>
#include <boost/test/unit_test.hpp>
#include <future>
#include <iostream>
#include <mutex>
#include <thread>

#include "tests/softroce/rdma_fixture.h"
#include "tests/softroce/verbs_fixture.h"

using namespace ibev;
using namespace ibev::testing;
using namespace std::chrono_literals;

namespace {

constexpr unsigned kBudget = 16;
constexpr int kSlots = 256;
// A turn in progress finishes (kBudget), the next serves what waited: in a
// quiet host that is what the counts show (0 to 16). The rest of the bound is
// this thread's own scheduling: on a 1-vCPU VM under a loaded host it can sit
// descheduled between issuing an action and the count being read while the
// dispatcher serves turns (up to ~200 seen under ASan). Without bounded turns
// the counts have no bound at all: the adaptive CQ was polled for as long as
// traffic lasted, and the injected event was not served within 20 s.
constexpr std::uint64_t kBound = 24 * kBudget;

struct Saturated {
  Env env{test_device()};
  std::array<char, 64 * (kSlots + 2)> buffer{};
  std::shared_ptr<MemoryRegion> mr = MemoryRegion::create(
      env.pd, buffer.data(), buffer.size(), IBV_ACCESS_LOCAL_WRITE);
  std::atomic<std::uint64_t> busy{0};  // the busy CQ's completions, handled
  // The busy CQ's handler re-posting, against teardown: declared before the
  // QP that holds the CQ, so they outlive every call of its handler.
  std::mutex posting;
  bool stopping = false;  // under `posting`
  std::shared_ptr<QueuePair> receiver;
  std::shared_ptr<CompletionQueue> busy_cq;
  std::shared_ptr<CompletionQueue> send_cq = plain_cq(env.device, 256);
  std::shared_ptr<QueuePair> sender;
  std::atomic<bool> sending{true};
  std::thread traffic;

  Saturated() {
    CompletionQueue::Options options;
    options.cqe = 512;
    options.completion.mode = CompletionMode::kAdaptive;
    options.completion.poll_budget = std::chrono::milliseconds(500);
    options.completion.budget = kBudget;
    busy_cq = CompletionQueue::create(
        env.device,
        [this](const CompletionBatch& batch) {
          std::lock_guard<std::mutex> lock(posting);
          for (const ibv_wc& wc : batch) {
            ++busy;
            // Keep the receive queue full: the inflow never stops for lack of it.
            if (wc.status == IBV_WC_SUCCESS && !stopping) {
              post_recv(*receiver, *mr, slot(static_cast<int>(wc.wr_id)), wc.wr_id);
            }
          }
        },
        nullptr, options);
    receiver = qp(plain_cq(env.device), busy_cq);
    sender = qp(send_cq, plain_cq(env.device));
    connect_rc_pair(*sender, *receiver);
    for (int i = 0; i < kSlots; ++i) post_recv(*receiver, *mr, slot(i), i);
    traffic = std::thread([this] { send_until_told(); });
  }
  // The traffic stops, then the busy CQ's handler posts no more: it must not
  // post into `receiver` while that is destroyed (posting racing a QP's
  // destruction is the application's to prevent, as with ibv_destroy_qp).
  ~Saturated() {
    sending = false;
    traffic.join();
    std::lock_guard<std::mutex> lock(posting);
    stopping = true;
  }

  std::shared_ptr<QueuePair> qp(std::shared_ptr<CompletionQueue> send,
                                std::shared_ptr<CompletionQueue> recv) {
    QueuePair::Options options;
    options.send_cq = std::move(send);
    options.recv_cq = std::move(recv);
    options.cap = {128, 512, 1, 1, 0};
    return QueuePair::create(env.pd, nullptr, options);
  }
  char* slot(int i) { return buffer.data() + 64 * i; }

  // Sends with at most 32 in flight, reaping its own send completions.
  void send_until_told() {
    std::uint64_t posted = 0, done = 0;
    while (sending) {
      if (posted - done < 32) {
        post_send(*sender, *mr, slot(kSlots), posted++);
      } else {
        // A pause, not a wait: the loop runs until told to stop, reaping
        // its own completions; 100 us spares the CPU while 32 are in flight.
        std::this_thread::sleep_for(100us);
      }
      ibv_wc wcs[16];
      const int n = ibv_poll_cq(send_cq->get(), 16, wcs);
      if (n > 0) done += static_cast<std::uint64_t>(n);
    }
  }

  // Bounded in time, not in sleeps: each sleep may last much longer than
  // asked on a vCPU this test saturates.
  void wait_until_saturated() {
    const std::uint64_t start = busy;
    BOOST_REQUIRE_MESSAGE(eventually([&] { return busy >= start + 200; }),
                          "the busy CQ never got busy: " << busy - start << " in 20 s");
  }
};

// Each phase in the log as it starts: a guest timeout names where it was.
void phase(const char* name) { std::cout << "fairness: " << name << std::endl; }

// Waits on its own context's async fd, as a raw-verbs application does, for
// the first PORT_ERR, on a thread of its own: the busy count when it came, or
// an exception after `limit`.
std::future<std::uint64_t> raw_port_err_watch(ibv_context* raw,
                                              const std::atomic<std::uint64_t>& busy,
                                              std::chrono::milliseconds limit) {
  const int flags = fcntl(raw->async_fd, F_GETFL);
  BOOST_REQUIRE(flags >= 0 && fcntl(raw->async_fd, F_SETFL, flags | O_NONBLOCK) == 0);
  return std::async(std::launch::async, [raw, &busy, limit]() -> std::uint64_t {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd fd{raw->async_fd, POLLIN, 0};
      if (::poll(&fd, 1, 100) <= 0) continue;
      ibv_async_event event;
      if (ibv_get_async_event(raw, &event) != 0) continue;
      const bool port_err = event.event_type == IBV_EVENT_PORT_ERR;
      ibv_ack_async_event(&event);
      if (port_err) return busy.load();
    }
    throw std::runtime_error("a raw watcher heard no PORT_ERR");
  });
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_saturated_cq_delays_everything_else_by_a_turn_at_most) {
  phase("saturating");
  Saturated s;
  s.wait_until_saturated();

  // An injected event.
  {
    phase("an injected event");
    std::promise<std::uint64_t> heard_at;
    Handle listener = s.env.device->on_event(
        EventFilter{IBV_EVENT_SM_CHANGE},
        [&](const Event&) { heard_at.set_value(s.busy.load()); });
    s.env.dispatcher.inject(s.env.device->context(), IBV_EVENT_SM_CHANGE, Port{1});
    const std::uint64_t sent_at = s.busy;  // inject() resolved and woke it
    auto heard = heard_at.get_future();
    BOOST_REQUIRE(heard.wait_for(20s) == std::future_status::ready);
    const std::uint64_t at = heard.get();
    const std::uint64_t waited = at > sent_at ? at - sent_at : 0;
    BOOST_TEST_MESSAGE("injected event waited for " << waited << " busy completions");
    BOOST_TEST(waited <= kBound);
  }

  // A second CQ's completion.
  {
    phase("a second CQ's completion");
    std::promise<std::uint64_t> delivered_at;
    std::atomic<bool> once{false};
    auto quiet_cq = CompletionQueue::create(
        s.env.device,
        [&](const CompletionBatch& batch) {
          if (batch.size > 0 && !once.exchange(true)) delivered_at.set_value(s.busy.load());
        },
        nullptr);
    auto from = s.qp(plain_cq(s.env.device), plain_cq(s.env.device));
    auto to = s.qp(plain_cq(s.env.device), quiet_cq);
    connect_rc_pair(*from, *to);
    post_recv(*to, *s.mr, s.slot(kSlots + 1), 1);
    post_send(*from, *s.mr, s.slot(kSlots + 1), 2);
    const std::uint64_t posted_at = s.busy;
    auto delivered = delivered_at.get_future();
    BOOST_REQUIRE(delivered.wait_for(20s) == std::future_status::ready);
    const std::uint64_t at = delivered.get();
    const std::uint64_t waited = at > posted_at ? at - posted_at : 0;
    BOOST_TEST_MESSAGE("second CQ waited for " << waited << " busy completions");
    BOOST_TEST(waited <= kBound);
  }

  // stop(), then dispatch resumes.
  {
    phase("stop() and start()");
    const std::uint64_t asked_at = s.busy;
    s.env.dispatcher.stop();
    const std::uint64_t waited = s.busy - asked_at;
    BOOST_TEST_MESSAGE("stop() waited for " << waited << " busy completions");
    BOOST_TEST(waited <= kBound);
    s.env.dispatcher.start();
    s.wait_until_saturated();
  }

  // A real port event through the device's async fd. The kernel's own path
  // (the netdev change, rxe, uverbs) is slow on a VM whose CPU this test
  // saturates; what ibev adds is measured against a raw-verbs watcher on a
  // context of its own, reading its async fd on a thread of its own.
  {
    phase("a real port event");
    ContextPtr raw = open_device(test_device());
    auto raw_heard = raw_port_err_watch(raw.get(), s.busy, 20s);
    std::promise<std::uint64_t> heard_at;
    std::atomic<bool> once{false};
    Handle listener = s.env.device->on_event(
        EventFilter{IBV_EVENT_PORT_ERR}, [&](const Event&) {
          if (!once.exchange(true)) heard_at.set_value(s.busy.load());
        });
    run_command("ip link set " + test_netdev() + " down");
    auto heard = heard_at.get_future();
    BOOST_REQUIRE(heard.wait_for(20s) == std::future_status::ready);
    const std::uint64_t ours = heard.get(), theirs = raw_heard.get();  // bounded: 20 s
    const std::uint64_t waited = ours > theirs ? ours - theirs : 0;
    BOOST_TEST_MESSAGE("PORT_ERR reached ibev's listener " << waited
                       << " busy completions after a raw watcher");
    BOOST_TEST(waited <= kBound);
    run_command("ip link set " + test_netdev() + " up");
  }
  phase("done");
  BOOST_TEST(s.busy_cq->completion_stats().yields > 0u);
}
