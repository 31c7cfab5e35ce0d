// Where handlers run, on a real device: a slow event handler on a worker
// thread leaves completions alone; completion handlers on an executor; two
// dispatchers on two threads each serving their own CQs; and Device::close()
// tearing down everything made on a device from inside a DEVICE_FATAL
// handler.
#define BOOST_TEST_MODULE ibev_softroce_executors
#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <future>
#include <iostream>
#include <string>
#include <thread>

#include <ibev/dispatch/worker_thread.h>
#include <ibev/verbs/test_seams.h>

#include "tests/softroce/rdma_fixture.h"
#include "tests/softroce/verbs_fixture.h"
#include "tests/support/testing.h"

using namespace ibev;
using namespace ibev::testing;
using namespace std::chrono_literals;

namespace {

// Two connected RC QPs whose receive CQ is `recv_cq`; one message at a time.
struct Link {
  Link(const std::shared_ptr<ProtectionDomain>& pd, std::shared_ptr<CompletionQueue> recv_cq)
      : mr(MemoryRegion::create(pd, buffer.data(), buffer.size(), IBV_ACCESS_LOCAL_WRITE)) {
    QueuePair::Options options;
    options.send_cq = plain_cq(pd->device());
    options.recv_cq = plain_cq(pd->device());
    from = QueuePair::create(pd, nullptr, options);
    options.recv_cq = std::move(recv_cq);
    to = QueuePair::create(pd, nullptr, options);
    connect_rc_pair(*from, *to);
  }
  void message(std::uint64_t id) {
    post_recv(*to, *mr, buffer.data(), id);
    post_send(*from, *mr, buffer.data() + 64, id);
  }
  std::array<char, 128> buffer{};
  std::shared_ptr<MemoryRegion> mr;
  std::shared_ptr<QueuePair> from, to;
};

// The process's fds on RDMA devices: uverbs files ("/dev/infiniband/
// uverbs0") and their async and completion channels ("anon_inode:
// [infinibandevent]"). Counted by what they are, not all of them: any
// thread may hold a file open for a moment (the device monitor's look at
// sysfs; a count of all fds once took 12 before and 10 after, under ASan).
std::size_t rdma_fds() {
  std::size_t count = 0;
  if (DIR* dir = ::opendir("/proc/self/fd")) {
    while (const dirent* entry = ::readdir(dir)) {
      const std::string link = std::string("/proc/self/fd/") + entry->d_name;
      char target[256] = {};
      const ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
      if (n > 0 && std::string(target, n).find("infiniband") != std::string::npos) ++count;
    }
    ::closedir(dir);
  }
  return count;
}

}  // namespace

// The kernel's IB_POLL_WORKQUEUE: a handler that blocks goes to a worker, and
// the dispatching thread keeps serving completions meanwhile. On the
// dispatching thread the same handler would hold every completion back until
// it returned.
BOOST_AUTO_TEST_CASE(a_slow_event_handler_on_a_worker_does_not_delay_completions) {
  Env env{test_device()};
  WorkerThread worker;
  std::atomic<bool> slow_running{false}, slow_done{false};
  std::promise<bool> completion;  // whether the slow handler was still running
  const std::shared_future<bool> delivered = completion.get_future().share();
  // Holds its thread until the completion was delivered (at most 10 s): had
  // this handler held the completion back, it would come after those 10 s,
  // with slow_done set.
  Handle slow = env.device->on_event(
      EventFilter{IBV_EVENT_SM_CHANGE},
      [&slow_running, &slow_done, delivered](const Event&) {
        slow_running = true;
        delivered.wait_for(10s);
        slow_done = true;
      },
      worker.executor());
  std::atomic<bool> once{false};
  auto cq = CompletionQueue::create(
      env.device,
      [&](const CompletionBatch& batch) {
        if (batch.size > 0 && !once.exchange(true)) completion.set_value(!slow_done.load());
      },
      nullptr);
  Link link(env.pd, cq);
  env.dispatcher.inject(env.device->context(), IBV_EVENT_SM_CHANGE, Port{1});
  BOOST_REQUIRE(eventually([&] { return slow_running.load(); }));
  link.message(1);
  BOOST_REQUIRE(delivered.wait_for(20s) == std::future_status::ready);
  BOOST_TEST(delivered.get(), "the completion waited for the slow handler");
  BOOST_TEST(env.errors().empty());
}

BOOST_AUTO_TEST_CASE(completion_handlers_run_on_their_executor_with_a_copy_of_the_batch) {
  Env env{test_device()};
  WorkerThread worker;
  std::promise<std::pair<bool, std::uint64_t>> seen;  // on the worker? wr_id
  CompletionQueue::Options options;
  options.completion.executor = worker.executor();
  auto cq = CompletionQueue::create(
      env.device,
      [&](const CompletionBatch& batch) {
        seen.set_value({worker.in_worker_thread(), batch.begin()->wr_id});
      },
      nullptr, options);
  Link link(env.pd, cq);
  link.message(42);
  auto result = seen.get_future();
  BOOST_REQUIRE(result.wait_for(20s) == std::future_status::ready);
  const auto [on_worker, wr_id] = result.get();
  BOOST_TEST(on_worker);
  BOOST_TEST(wr_id == 42u);
  BOOST_TEST(cq->completion_stats().completions == 1u);
}

// Per-thread CQs (SPDK's poll groups, the kernel's CQ pool): each dispatcher
// serves its own CQs on its own thread, and both carry traffic.
BOOST_AUTO_TEST_CASE(two_dispatchers_on_two_threads_serve_their_own_cqs) {
  Env env{test_device()};
  Dispatcher second;
  second.start();
  constexpr int kMessages = 20;
  std::atomic<int> on_first{0}, on_second{0}, misplaced{0};
  auto cq_a = CompletionQueue::create(
      env.device,
      [&](const CompletionBatch& batch) {
        if (!env.dispatcher.in_dispatcher_thread()) ++misplaced;
        on_first += static_cast<int>(batch.size);
      },
      nullptr);
  CompletionQueue::Options options;
  options.dispatcher = &second;
  auto cq_b = CompletionQueue::create(
      env.device,
      [&](const CompletionBatch& batch) {
        if (!second.in_dispatcher_thread()) ++misplaced;
        on_second += static_cast<int>(batch.size);
      },
      nullptr, options);
  Link a(env.pd, cq_a), b(env.pd, cq_b);
  for (int i = 1; i <= kMessages; ++i) {
    a.message(i);
    b.message(i);
    eventually([&] { return on_first >= i && on_second >= i; }, 20s, 1ms);
    BOOST_REQUIRE_MESSAGE(on_first == i && on_second == i, "message " << i);
  }
  BOOST_TEST(misplaced.load() == 0);
  BOOST_TEST(cq_b->completion_stats().completions == static_cast<std::uint64_t>(kMessages));
  BOOST_TEST(second.stats().work_completions == static_cast<std::uint64_t>(kMessages));
  cq_b.reset();
  b.to.reset();
  second.stop();
}

// After DEVICE_FATAL an application tears down everything of the device
// from the handler, without finding every shared_ptr: the objects stay valid
// C++ objects, their rdma-core objects and the context are gone (the fds
// with them), and using them says ENODEV.
BOOST_AUTO_TEST_CASE(device_close_tears_down_everything_made_on_it) {
  Dispatcher dispatcher;
  dispatcher.start();
  // The device monitor's fd is the Dispatcher's, for as long as it lives.
  Handle monitor = dispatcher.watch_devices([](DeviceChange, const std::string&) {});
  const std::size_t fds_before = rdma_fds();
  auto device = Device::open(dispatcher, test_device());
  auto pd = ProtectionDomain::create(device);
  auto event_cq = CompletionQueue::create(device, [](const CompletionBatch&) {}, nullptr);
  auto srq = SharedReceiveQueue::create(pd, nullptr);
  QueuePair::Options options;
  options.send_cq = options.recv_cq = event_cq;
  options.srq = srq;
  auto qp = QueuePair::create(pd, nullptr, options);
  std::array<char, 64> memory{};
  auto mr = MemoryRegion::create(pd, memory.data(), memory.size(), IBV_ACCESS_LOCAL_WRITE);
  BOOST_REQUIRE(rdma_fds() >= fds_before + 3);  // uverbs, async, the CQ's channel

  std::promise<void> closed;
  Handle on_fatal = device->on_event(EventFilter{IBV_EVENT_DEVICE_FATAL}, [&](const Event&) {
    device->close();
    closed.set_value();
  });
  dispatcher.inject(device->context(), IBV_EVENT_DEVICE_FATAL, WholeDevice{});
  BOOST_REQUIRE(closed.get_future().wait_for(20s) == std::future_status::ready);

  BOOST_TEST(device->context() == nullptr);
  BOOST_TEST(qp->get() == nullptr);
  BOOST_TEST(event_cq->get() == nullptr);
  BOOST_TEST(srq->get() == nullptr);
  BOOST_TEST(mr->get() == nullptr);
  BOOST_TEST(pd->get() == nullptr);
  BOOST_TEST(rdma_fds() == fds_before);  // the uverbs fd, async fd and channel
  try {
    (void)ProtectionDomain::create(device);
    BOOST_ERROR("a closed device made a protection domain");
  } catch (const std::system_error& e) {
    BOOST_TEST(e.code().value() == ENODEV);
    BOOST_TEST(std::string(e.what()).find("ibv_alloc_pd") != std::string::npos, e.what());
  }
  ibv_recv_wr wr{};
  BOOST_CHECK_THROW(qp->post_recv(wr), std::system_error);
  device->close();  // idempotent
  on_fatal.release();
  qp.reset();  // and dropping them afterwards destroys nothing twice
  mr.reset();
  srq.reset();
  event_cq.reset();
  pd.reset();
  device.reset();
  BOOST_TEST(dispatcher.stats().failures == 0u);
  dispatcher.stop();
}

// The dispatching thread's close() once it holds the Device's close lock.
std::atomic<std::promise<void>*> close_lock_taken{nullptr};
void tell_close_lock_taken(ibv_context*) {
  if (std::promise<void>* taken = close_lock_taken.exchange(nullptr)) taken->set_value();
}

// A completion handler on an executor calls Device::close() while the
// dispatching thread closes the same Device: the dispatching thread held the
// close lock and, closing the CQ, waited for that very handler, which waited
// for the lock, for ever. A close() from inside a handler now leaves the work
// to the close() at it. The seam holds the handler's close() until the
// dispatching thread's holds the lock. A deadlock cannot be unwound: after
// 20 s the case says so and ends the process.
BOOST_AUTO_TEST_CASE(a_handler_on_an_executor_and_the_dispatching_thread_close_the_device_at_once) {
  Env env{test_device()};
  WorkerThread worker;
  std::promise<void> lock_taken;
  const std::shared_future<void> taken = lock_taken.get_future().share();
  std::promise<bool> handler_closed;  // whether the dispatching thread's close began first
  const std::shared_ptr<Device> device = env.device;
  Dispatcher& dispatcher = env.dispatcher;
  std::atomic<bool> once{false};
  // The message's posts happen before the closes free its QPs through the
  // device, which TSan cannot see: the handler waits for this first.
  std::promise<void> posted;
  const std::shared_future<void> message_posted = posted.get_future().share();
  CompletionQueue::Options options;
  options.completion.executor = worker.executor();
  auto cq = CompletionQueue::create(
      device,
      [&](const CompletionBatch&) {
        if (once.exchange(true)) return;
        message_posted.wait();
        dispatcher.post([device] { device->close(); });
        const bool first = taken.wait_for(20s) == std::future_status::ready;
        device->close();
        handler_closed.set_value(first);
      },
      nullptr, options);
  Link link(env.pd, cq);
  close_lock_taken = &lock_taken;
  detail::test_seams::device_closing = &tell_close_lock_taken;
  link.message(1);
  posted.set_value();
  auto closed = handler_closed.get_future();
  if (closed.wait_for(20s) != std::future_status::ready) {
    std::cerr << "a_handler_on_an_executor_and_the_dispatching_thread_close_the_device_at_once: "
                 "the handler's Device::close() and the dispatching thread's wait for each "
                 "other (deadlock)"
              << std::endl;
    std::_Exit(1);
  }
  detail::test_seams::device_closing = nullptr;
  BOOST_TEST(closed.get(), "the dispatching thread's close() had not begun");
  BOOST_TEST(eventually([&] { return device->context() == nullptr; }, 20s, 1ms));
  BOOST_TEST(cq->get() == nullptr);
  BOOST_TEST(env.errors().empty(), env.failures.summary());
}
