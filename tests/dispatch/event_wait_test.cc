// Waits on an object's event without RDMA: injected events, a device whose
// async fd hangs up (its loss), timeouts from the loop's timer, cancels.
#define BOOST_TEST_MODULE ibev_event_wait
#include <ibev/dispatch/event_wait.h>

#include <fcntl.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/testing.h"

using namespace std::chrono_literals;
using ibev::Dispatcher;
using ibev::WaitResult;

namespace {

struct Fixture {
  Fixture() {
    Dispatcher::Options options;
    options.device_monitor = ibev::DeviceMonitor::kOff;
    options.stall_after = 0ms;
    dispatcher = std::make_unique<Dispatcher>(options);
    qp.context = &device;
  }
  ibv_context device{};
  ibv_qp qp{};
  std::unique_ptr<Dispatcher> dispatcher;
};

std::string outcome(const WaitResult& result) { return std::string(ibev::to_string(result.outcome)); }

// Drives the loop from this thread until `done`, or 5 s.
bool run_until(Dispatcher& dispatcher, const std::function<bool()>& done) {
  const auto limit = std::chrono::steady_clock::now() + 5s;
  while (!done()) {
    if (std::chrono::steady_clock::now() > limit) return false;
    dispatcher.run_once(10ms);
  }
  return true;
}

// Until what was posted or injected before it has been delivered: posted
// work runs in order, so a marker posted last has run after all of it.
bool settle(Dispatcher& dispatcher) {
  auto marker = std::make_shared<std::atomic<bool>>(false);
  dispatcher.post([marker] { *marker = true; });
  return run_until(dispatcher, [&] { return marker->load(); });
}

// Runs turns for `period`: for what must NOT happen within it (an absence
// is proved only by waiting past the moment it would have come).
void run_for(Dispatcher& dispatcher, std::chrono::milliseconds period) {
  const auto until = std::chrono::steady_clock::now() + period;
  while (std::chrono::steady_clock::now() < until) dispatcher.run_once(5ms);
}

}  // namespace

BOOST_FIXTURE_TEST_SUITE(event_wait, Fixture)

BOOST_AUTO_TEST_CASE(an_event_after_the_wait_fires_it_once) {
  dispatcher->start();
  ibev::EventWait wait = ibev::wait_for(*dispatcher, &qp, {IBV_EVENT_QP_LAST_WQE_REACHED}, 10s);
  BOOST_TEST(!wait.result().has_value());
  dispatcher->inject(&device, IBV_EVENT_COMM_EST, &qp);  // not what it waits for
  dispatcher->inject(&device, IBV_EVENT_QP_LAST_WQE_REACHED, &qp);
  dispatcher->inject(&device, IBV_EVENT_QP_LAST_WQE_REACHED, &qp);  // the repeat is absorbed
  const WaitResult result = wait.wait();
  BOOST_TEST(outcome(result) == "event");
  BOOST_REQUIRE(result.event.has_value());
  BOOST_TEST(result.event->code() == IBV_EVENT_QP_LAST_WQE_REACHED);
  BOOST_TEST(result.event->qp() == &qp);
  BOOST_TEST(outcome(wait.wait()) == "event");  // the same, again
}

BOOST_AUTO_TEST_CASE(nothing_comes_it_times_out_on_its_own_clock) {
  // Not even dispatched: the blocking form needs no turn to time out.
  // The timeout counts from the wait's creation.
  const auto started = std::chrono::steady_clock::now();
  ibev::EventWait wait = ibev::wait_for(*dispatcher, &qp, {IBV_EVENT_COMM_EST}, 50ms);
  BOOST_TEST(outcome(wait.wait()) == "timed out");
  BOOST_TEST((std::chrono::steady_clock::now() - started >= 50ms));
}

BOOST_AUTO_TEST_CASE(the_callback_form_fires_once_with_the_event_or_the_timeout) {
  std::vector<std::string> first, second;
  ibev::Handle heard = ibev::wait_for(*dispatcher, &qp, {IBV_EVENT_COMM_EST}, 10s,
                                      [&](const WaitResult& r) { first.push_back(outcome(r)); });
  dispatcher->inject(&device, IBV_EVENT_COMM_EST, &qp);
  dispatcher->inject(&device, IBV_EVENT_COMM_EST, &qp);
  BOOST_REQUIRE(settle(*dispatcher));  // both injected events delivered
  BOOST_TEST(first == std::vector<std::string>{"event"});
  ibev::Handle timed = ibev::wait_for(*dispatcher, &qp, {IBV_EVENT_QP_FATAL}, 30ms,
                                      [&](const WaitResult& r) { second.push_back(outcome(r)); });
  BOOST_REQUIRE(run_until(*dispatcher, [&] { return !second.empty(); }));
  dispatcher->inject(&device, IBV_EVENT_QP_FATAL, &qp);  // after its timeout: not heard
  BOOST_REQUIRE(settle(*dispatcher));
  BOOST_TEST(second == std::vector<std::string>{"timed out"});
  BOOST_TEST(first.size() == 1u);
}

BOOST_AUTO_TEST_CASE(a_released_wait_is_never_called) {
  int calls = 0;
  ibev::Handle waiting = ibev::wait_for(*dispatcher, &qp, {IBV_EVENT_COMM_EST}, 20ms,
                                        [&](const WaitResult&) { ++calls; });
  waiting.release();
  dispatcher->inject(&device, IBV_EVENT_COMM_EST, &qp);
  BOOST_REQUIRE(settle(*dispatcher));  // the event: delivered to nobody
  run_for(*dispatcher, 100ms);         // an absence: past its 20 ms timeout
  BOOST_TEST(calls == 0);
  ibev::EventWait cancelled = ibev::wait_for(*dispatcher, &qp, {IBV_EVENT_COMM_EST}, 1s);
  cancelled.cancel();
  BOOST_CHECK_THROW(cancelled.wait(), std::logic_error);
  BOOST_CHECK_THROW(ibev::EventWait().wait(), std::logic_error);
}

// The device's async fd hangs up: the wait ends with the loss.
BOOST_AUTO_TEST_CASE(the_device_s_loss_ends_a_wait) {
  int pipe_fds[2];
  BOOST_REQUIRE(::pipe(pipe_fds) == 0);
  device.async_fd = pipe_fds[0];
  ibev::Handle watch = dispatcher->watch_async_events(&device);
  ibev::EventWait wait = ibev::wait_for(*dispatcher, &qp, {IBV_EVENT_QP_FATAL}, 10s);
  // An injected DEVICE_FATAL is a test of handlers, not a loss.
  dispatcher->inject(&device, IBV_EVENT_DEVICE_FATAL, ibev::WholeDevice{});
  BOOST_REQUIRE(settle(*dispatcher));
  BOOST_TEST(!wait.result().has_value());
  dispatcher->start();
  ::close(pipe_fds[1]);
  const WaitResult result = wait.wait();
  BOOST_TEST(outcome(result) == "device lost");
  BOOST_REQUIRE(result.event.has_value());
  BOOST_TEST((result.event->loss() == ibev::DeviceLoss::kAsyncFdFailed));
  dispatcher->stop();
  watch.release();
  ::close(pipe_fds[0]);
}

BOOST_AUTO_TEST_CASE(waiting_on_the_dispatching_thread_is_refused) {
  dispatcher->start();
  std::promise<std::string> said;
  dispatcher->post([&] {
    ibev::EventWait wait = ibev::wait_for(*dispatcher, &qp, {IBV_EVENT_COMM_EST}, 1s);
    try {
      wait.wait();
      said.set_value("waited");
    } catch (const std::logic_error& e) {
      said.set_value(e.what());
    }
  });
  auto future = said.get_future();
  BOOST_REQUIRE(future.wait_for(5s) == std::future_status::ready);
  BOOST_TEST(future.get().find("dispatching thread") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(bad_waits_are_refused) {
  BOOST_CHECK_THROW(ibev::wait_for(*dispatcher, static_cast<ibv_qp*>(nullptr),
                                   {IBV_EVENT_COMM_EST}, 1s),
                    std::invalid_argument);
  BOOST_CHECK_THROW(ibev::wait_for(*dispatcher, &qp, {IBV_EVENT_COMM_EST}, -1ms),
                    std::invalid_argument);
  BOOST_CHECK_THROW(ibev::wait_for(*dispatcher, &qp, {IBV_EVENT_PORT_ACTIVE}, 1s),
                    std::invalid_argument);  // a port event on a QP
  BOOST_CHECK_THROW(ibev::wait_for(*dispatcher, &qp, {IBV_EVENT_COMM_EST}, 1s, {}),
                    std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(call_after_runs_once_and_a_cancelled_one_never) {
  dispatcher->start();
  std::promise<std::thread::id> ran;
  std::atomic<int> runs{0};
  ibev::Handle once = dispatcher->call_after(20ms, [&] {
    if (++runs == 1) ran.set_value(std::this_thread::get_id());
  });
  auto future = ran.get_future();
  BOOST_REQUIRE(future.wait_for(5s) == std::future_status::ready);
  BOOST_TEST((future.get() != std::this_thread::get_id()));
  std::atomic<int> cancelled_runs{0};
  ibev::Handle cancelled = dispatcher->call_after(20ms, [&] { ++cancelled_runs; });
  cancelled.release();
  BOOST_TEST(ibev::testing::stays_false_for(
      [&] { return cancelled_runs.load() != 0 || runs.load() != 1; }, 150ms,
      "the cancelled timer was due 20 ms after it was made, seven times over"));
  BOOST_TEST(runs.load() == 1);
  BOOST_TEST(cancelled_runs.load() == 0);
  BOOST_CHECK_THROW(dispatcher->call_after(-1ms, [] {}), std::invalid_argument);
  ibv_cq cq{};
  BOOST_CHECK_THROW(dispatcher->take_completion(&cq, 1, 2, [](const ibv_wc&) {}),
                    std::invalid_argument);  // no channel, not watched
}

// A periodic timer runs again and again on the dispatching thread, and not
// once more after its handle is released.
BOOST_AUTO_TEST_CASE(call_every_runs_until_released) {
  dispatcher->start();
  std::atomic<int> runs{0};
  ibev::Handle every = dispatcher->call_every(10ms, [&] { ++runs; });
  BOOST_REQUIRE(ibev::testing::eventually([&] { return runs.load() >= 5; }));
  every.release();
  const int after_release = runs.load();
  BOOST_TEST(ibev::testing::stays_false_for([&] { return runs.load() != after_release; }, 100ms,
                                            "a 10 ms timer still armed runs within ten periods"));
  BOOST_TEST(runs.load() == after_release);
  BOOST_CHECK_THROW(dispatcher->call_every(0ms, [] {}), std::invalid_argument);
  BOOST_CHECK_THROW(dispatcher->call_every(10ms, {}), std::invalid_argument);
}

// Open fds of this process (the timers are timerfds).
std::size_t open_fds() {
  std::size_t count = 0;
  for (int fd = 0; fd < 4096; ++fd) count += ::fcntl(fd, F_GETFD) != -1 ? 1 : 0;
  return count;
}

// Periodic tasks of one period share one timerfd, and run together: 50
// connections' keepalives wake the loop once a period, not 50 times. A
// second period is a second timer; the last release of a period closes its
// timer.
BOOST_AUTO_TEST_CASE(periodic_tasks_of_one_period_share_one_timer) {
  dispatcher->start();
  const std::size_t before = open_fds();
  constexpr int kTasks = 50;
  std::vector<std::atomic<int>> runs(kTasks);
  std::vector<ibev::Handle> every;
  for (int i = 0; i < kTasks; ++i) {
    every.push_back(dispatcher->call_every(20ms, [&runs, i] { ++runs[i]; }));
  }
  std::atomic<int> other{0};
  ibev::Handle slower = dispatcher->call_every(30ms, [&] { ++other; });
  BOOST_TEST(open_fds() == before + 2);
  BOOST_REQUIRE(ibev::testing::eventually([&] {
    for (const auto& r : runs) {
      if (r.load() < 3) return false;
    }
    return other.load() >= 3;
  }));
  every.clear();
  BOOST_TEST(open_fds() == before + 1);
  slower.release();
  BOOST_TEST(open_fds() == before);
}

// Each task of a shared timer keeps its own executor, its own release (a
// task released from inside its own run stops, the others go on) and its
// own failure: one that throws is reported, and runs again.
BOOST_AUTO_TEST_CASE(a_shared_timers_tasks_keep_their_executor_release_and_failures) {
  std::vector<ibev::Failure> failures;
  std::mutex failures_mutex;
  Dispatcher::Options options;
  options.device_monitor = ibev::DeviceMonitor::kOff;
  options.stall_after = 0ms;
  options.on_failure = [&](const ibev::Failure& f) {
    std::lock_guard<std::mutex> lock(failures_mutex);
    failures.push_back(f);
  };
  Dispatcher loop(options);
  loop.start();
  std::atomic<int> handed{0}, on_executor{0}, self_released{0}, throwing{0};
  ibev::Handle a = loop.call_every(
      10ms, [&] { ++on_executor; },
      [&](ibev::Task task) {
        ++handed;
        task();
      });
  ibev::Handle b;
  std::mutex b_mutex;
  {
    std::lock_guard<std::mutex> lock(b_mutex);
    b = loop.call_every(10ms, [&] {
      ++self_released;
      std::lock_guard<std::mutex> held(b_mutex);
      b.release();  // from inside its own run: returns at once
    });
  }
  ibev::Handle c = loop.call_every(10ms, [&] {
    ++throwing;
    throw std::runtime_error("periodic");
  });
  BOOST_REQUIRE(ibev::testing::eventually(
      [&] { return on_executor.load() >= 5 && throwing.load() >= 3; }));
  BOOST_TEST(handed.load() >= on_executor.load());
  BOOST_TEST(self_released.load() == 1);
  std::lock_guard<std::mutex> lock(failures_mutex);
  BOOST_REQUIRE(!failures.empty());
  BOOST_TEST((failures.front().kind == ibev::Failure::Kind::kHandlerThrew));
  BOOST_TEST(failures.front().what.find("periodic") != std::string::npos, failures.front().what);
}

// A task whose executor has not run its last run yet is passed by: the
// executor's queue holds one run of it, however many periods go by.
BOOST_AUTO_TEST_CASE(a_periodic_task_waiting_on_its_executor_is_not_handed_again) {
  dispatcher->start();
  std::mutex queue_mutex;
  std::vector<ibev::Task> queue;
  std::atomic<int> runs{0}, ticks{0};
  ibev::Handle slow = dispatcher->call_every(
      10ms, [&] { ++runs; },
      [&](ibev::Task task) {
        std::lock_guard<std::mutex> lock(queue_mutex);
        queue.push_back(std::move(task));
      });
  ibev::Handle counter = dispatcher->call_every(10ms, [&] { ++ticks; });
  BOOST_REQUIRE(ibev::testing::eventually([&] { return ticks.load() >= 10; }));
  std::vector<ibev::Task> waiting;
  {
    std::lock_guard<std::mutex> lock(queue_mutex);
    waiting.swap(queue);
  }
  BOOST_TEST(waiting.size() == 1u);
  for (auto& task : waiting) task();
  BOOST_TEST(runs.load() == 1);
  BOOST_REQUIRE(ibev::testing::eventually([&] {
    std::lock_guard<std::mutex> lock(queue_mutex);
    return queue.size() == 1u;
  }));
  slow.release();
  std::lock_guard<std::mutex> lock(queue_mutex);
  for (auto& task : queue) task();  // released: runs nothing
  BOOST_TEST(runs.load() == 1);
}

// An executor that refuses a run (throws) is reported, and the next tick
// hands the task again.
BOOST_AUTO_TEST_CASE(a_periodic_task_whose_executor_refused_a_run_is_handed_the_next) {
  dispatcher->start();
  std::atomic<int> offered{0}, runs{0};
  ibev::Handle every = dispatcher->call_every(
      10ms, [&] { ++runs; },
      [&](ibev::Task task) {
        if (++offered == 1) throw std::runtime_error("full");
        task();
      });
  BOOST_TEST(ibev::testing::eventually([&] { return runs.load() >= 3; }));
  BOOST_TEST(offered.load() >= 4);
}

// A periodic task may destroy its Dispatcher: the tasks of its period after
// it in that tick are not run, and none runs again.
BOOST_AUTO_TEST_CASE(a_periodic_task_destroying_the_dispatcher_ends_its_group) {
  dispatcher->start();
  std::atomic<bool> armed{false}, destroyed{false};
  std::atomic<int> after{0};
  std::unique_ptr<Dispatcher> doomed = std::move(dispatcher);
  ibev::Handle first = doomed->call_every(10ms, [&] {
    if (armed && !destroyed) {
      doomed.reset();
      destroyed = true;
    }
  });
  ibev::Handle second = doomed->call_every(10ms, [&] {
    if (destroyed) ++after;
  });
  armed = true;  // from here on the dispatching thread owns `doomed`
  BOOST_REQUIRE(ibev::testing::eventually([&] { return destroyed.load(); }));
  BOOST_TEST(ibev::testing::stays_false_for([&] { return after.load() != 0; }, 50ms,
                                            "`second`, every 10 ms, would run within five periods"));
  BOOST_TEST(after.load() == 0);
}

BOOST_AUTO_TEST_SUITE_END()
