// The dispatcher without an RDMA device: injection, the thread rules, stop
// and restart, a vanished device, and bad input. Real devices: tests/softroce.
#define BOOST_TEST_MODULE ibev_dispatch_dispatcher
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <atomic>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <ibev/dispatch/dispatcher.h>
#include <ibev/dispatch/worker_thread.h>
#include "tests/support/testing.h"

using namespace std::chrono_literals;
using ibev::Dispatcher;
using ibev::Element;
using ibev::Event;
using ibev::Registry;
using ibev::testing::Counter;
using ibev::testing::eventually;
using ibev::testing::expect_throw;
using ibev::testing::stays_false_for;

namespace {

Dispatcher::Options collecting(std::vector<ibev::Failure>& failures,
                               std::chrono::milliseconds stall_after = 0ms) {
  Dispatcher::Options options;
  options.on_failure = [&failures](const ibev::Failure& f) { failures.push_back(f); };
  options.stall_after = stall_after;
  return options;
}

struct Fixture {
  ibv_context device{};
  ibv_qp qp{};
  std::vector<ibev::Failure> errors;
  Dispatcher dispatcher{collecting(errors)};
  Registry& registry = dispatcher.registry();
};

}  // namespace

BOOST_FIXTURE_TEST_SUITE(injection, Fixture)

BOOST_AUTO_TEST_CASE(delivered_by_run_once_on_the_calling_thread) {
  std::vector<std::thread::id> ran_on;
  ibev::Handle handler = registry.attach(&qp, [&](const Event& e) {
    BOOST_TEST(e.synthesized());
    BOOST_TEST(dispatcher.in_dispatcher_thread());
    ran_on.push_back(std::this_thread::get_id());
  });
  dispatcher.inject(&device, IBV_EVENT_QP_LAST_WQE_REACHED, &qp);
  BOOST_TEST(ran_on.empty());  // only the dispatching thread delivers

  pollfd ready{dispatcher.fd(), POLLIN, 0};
  BOOST_TEST(::poll(&ready, 1, 1000) == 1);  // fd() says there is work
  BOOST_TEST(dispatcher.run_once(0ms) >= 1u);
  BOOST_TEST(ran_on == std::vector<std::thread::id>{std::this_thread::get_id()});
  BOOST_TEST(dispatcher.stats().injected == 1u);
  BOOST_TEST(!dispatcher.in_dispatcher_thread());
}

// dispatcher.h's way to take inject's address, now that it is overloaded:
// the cast it quotes names the Element overload, which delivers.
BOOST_AUTO_TEST_CASE(the_cast_the_header_quotes_takes_inject_s_address) {
  auto inject_element = std::mem_fn(
      static_cast<void (Dispatcher::*)(ibv_context*, int, Element)>(&Dispatcher::inject));
  int heard = 0;
  ibev::Handle handler = registry.attach(&qp, [&](const Event&) { ++heard; });
  inject_element(dispatcher, &device, IBV_EVENT_QP_FATAL, Element{&qp});
  dispatcher.run_once(0ms);
  BOOST_TEST(heard == 1);
}

BOOST_AUTO_TEST_CASE(delivered_on_the_dispatcher_thread) {
  Counter delivered;
  std::atomic<bool> on_dispatcher{false};
  ibev::Handle listener = registry.listen(&device, [&](const Event& e) {
    BOOST_TEST(e.port().value() == 2);
    on_dispatcher = dispatcher.in_dispatcher_thread();
    delivered.bump();
  });
  dispatcher.start();
  dispatcher.inject(&device, IBV_EVENT_CLIENT_REREGISTER, ibev::Port{2});
  BOOST_REQUIRE(delivered.wait_for(1));
  BOOST_TEST(on_dispatcher.load());
  dispatcher.stop();
}

BOOST_AUTO_TEST_CASE(resolved_when_injected_not_when_delivered) {
  // The object is destroyed and a new one takes its address before the
  // dispatcher delivers: the new object must not hear the old one's event.
  int old_calls = 0, new_calls = 0, unclaimed = 0;
  ibev::Handle observer =
      registry.on_unclaimed([&](const Event&) { ++unclaimed; });
  ibev::Handle old_handler =
      registry.attach(&qp, [&](const Event&) { ++old_calls; });
  dispatcher.inject(&device, IBV_EVENT_QP_FATAL, &qp);
  old_handler.release();
  ibev::Handle new_handler =
      registry.attach(&qp, [&](const Event&) { ++new_calls; });
  dispatcher.run_once(100ms);
  BOOST_TEST(old_calls == 0);
  BOOST_TEST(new_calls == 0);
  BOOST_TEST(unclaimed == 1);
}

BOOST_AUTO_TEST_CASE(a_throwing_handler_does_not_stop_dispatch) {
  int after = 0;
  ibev::Handle broken = registry.attach(
      &qp, [](const Event&) { throw std::runtime_error("handler broke"); });
  ibev::Handle fine = registry.attach(&qp, [&](const Event&) { ++after; });
  dispatcher.inject(&device, IBV_EVENT_PATH_MIG, &qp);
  dispatcher.inject(&device, IBV_EVENT_PATH_MIG_ERR, &qp);
  dispatcher.run_once(100ms);
  BOOST_TEST(after == 2);
  BOOST_TEST(registry.counters(&device).total().handler_failures == 2u);
}

BOOST_AUTO_TEST_CASE(bad_events_are_refused_at_injection) {
  ibv_cq cq{};
  expect_throw<std::invalid_argument>(
      [&] { dispatcher.inject(&device, IBV_EVENT_QP_FATAL, &cq); },
      "IBV_EVENT_QP_FATAL carries a QP, not a CQ");
  expect_throw<std::invalid_argument>(
      [&] { dispatcher.inject(nullptr, IBV_EVENT_PORT_ERR, ibev::Port{1}); },
      "names no device");
  BOOST_TEST(dispatcher.stats().injected == 0u);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_FIXTURE_TEST_SUITE(thread_rules, Fixture)

BOOST_AUTO_TEST_CASE(stop_returns_promptly_and_restart_works) {
  Counter delivered;
  ibev::Handle listener =
      registry.listen(&device, [&](const Event&) { delivered.bump(); });
  for (int round = 1; round <= 3; ++round) {
    dispatcher.start();
    BOOST_TEST(dispatcher.running());
    dispatcher.inject(&device, IBV_EVENT_SM_CHANGE, ibev::Port{1});
    BOOST_REQUIRE(delivered.wait_for(round));
    const auto before = std::chrono::steady_clock::now();
    dispatcher.stop();
    const std::chrono::duration<double, std::milli> took =
        std::chrono::steady_clock::now() - before;
    // A hang guard, not a timing test: bench/ measures the figure.
    BOOST_TEST(took.count() < 1000.0);
    BOOST_TEST_MESSAGE("stop() took " << took.count() << " ms");
    BOOST_TEST(!dispatcher.running());
  }
}

BOOST_AUTO_TEST_CASE(one_driver_at_a_time) {
  dispatcher.start();
  expect_throw<std::logic_error>([&] { dispatcher.start(); }, "running");
  expect_throw<std::logic_error>([&] { dispatcher.run_once(0ms); },
                                 "dispatcher thread is running");
  dispatcher.stop();
  // Stopped: the caller may drive dispatch (the first pass may find stop's
  // wake-up still in the control fd).
  BOOST_CHECK_NO_THROW(dispatcher.run_once(0ms));
}

BOOST_AUTO_TEST_CASE(stop_from_inside_a_handler) {
  Counter delivered;
  ibev::Handle listener = registry.listen(&device, [&](const Event&) {
    dispatcher.stop();  // asks; cannot join itself
    delivered.bump();
  });
  dispatcher.start();
  dispatcher.inject(&device, IBV_EVENT_PORT_ERR, ibev::Port{1});
  BOOST_REQUIRE(delivered.wait_for(1));
  // The thread ends on its own; start() joins it and runs again.
  BOOST_TEST(eventually([&] { return !dispatcher.running(); }, 5s, 1ms));
  listener.release();
  Counter again;
  ibev::Handle second =
      registry.listen(&device, [&](const Event&) { again.bump(); });
  dispatcher.start();
  dispatcher.inject(&device, IBV_EVENT_PORT_ACTIVE, ibev::Port{1});
  BOOST_TEST(again.wait_for(1));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_FIXTURE_TEST_SUITE(devices, Fixture)

// A context whose async fd is a pipe: closing the write end makes the read
// end hang up, as a device's async fd does when the device goes away. The
// dispatcher sees EPOLLHUP before it calls into libibverbs.
BOOST_AUTO_TEST_CASE(a_vanished_device_is_reported_once_and_unwatched) {
  int pipe_fds[2];
  BOOST_REQUIRE(::pipe(pipe_fds) == 0);
  device.async_fd = pipe_fds[0];
  std::vector<Event> heard;
  ibev::Handle listener =
      registry.listen(&device, [&](const Event& e) { heard.push_back(e); });
  ibev::Handle watch = dispatcher.watch_async_events(&device);

  ::close(pipe_fds[1]);
  dispatcher.run_once(1000ms);
  BOOST_REQUIRE_EQUAL(heard.size(), 1u);
  BOOST_TEST(heard[0].code() == IBV_EVENT_DEVICE_FATAL);
  BOOST_TEST(heard[0].synthesized());
  BOOST_TEST((heard[0].loss() == ibev::DeviceLoss::kAsyncFdFailed));
  BOOST_TEST(dispatcher.stats().devices_lost == 1u);
  BOOST_REQUIRE(errors.size() == 1u);
  BOOST_TEST((errors[0].kind == ibev::Failure::Kind::kDeviceLost));
  BOOST_TEST(errors[0].device == &device);

  // No longer watched: the hung-up fd does not wake the loop again.
  BOOST_TEST(dispatcher.run_once(50ms) == 0u);
  BOOST_TEST(heard.size() == 1u);
  watch.release();  // harmless now
  ::close(pipe_fds[0]);
}

// The Device wrapper's seam: its delivery sees each event, the loss first,
// and decides when the listeners hear it.
BOOST_AUTO_TEST_CASE(a_watch_s_delivery_puts_itself_around_the_listeners) {
  int pipe_fds[2];
  BOOST_REQUIRE(::pipe(pipe_fds) == 0);
  device.async_fd = pipe_fds[0];
  std::vector<std::string> order;
  ibev::Handle listener = registry.listen(&device, [&](const Event&) { order.push_back("listener"); });
  ibev::Handle watch = dispatcher.watch_async_events(&device, [&](ibev::Delivery delivery) {
    order.push_back(std::string("before ") + std::string(to_string(delivery.event().loss())));
    registry.deliver(delivery);
    order.push_back("after");
  });
  ::close(pipe_fds[1]);
  dispatcher.run_once(1000ms);
  BOOST_TEST(order == (std::vector<std::string>{"before async fd failed", "listener", "after"}),
             boost::test_tools::per_element());
  watch.release();
  ::close(pipe_fds[0]);
}

BOOST_AUTO_TEST_CASE(device_watchers_need_a_monitor) {
  Dispatcher::Options options = collecting(errors);
  options.device_monitor = ibev::DeviceMonitor::kOff;
  Dispatcher unmonitored(options);
  expect_throw<std::invalid_argument>(
      [&] { (void)unmonitored.watch_devices([](ibev::DeviceChange, const std::string&) {}); },
      "kOff");
  BOOST_TEST((unmonitored.device_monitor() == ibev::DeviceMonitor::kOff));

  BOOST_TEST((dispatcher.device_monitor() == ibev::DeviceMonitor::kOff));  // not started yet
  expect_throw<std::invalid_argument>([&] { (void)dispatcher.watch_devices({}); }, "empty");
}

// This machine's kernel has no RDMA: every kind starts, and says nothing.
BOOST_DATA_TEST_CASE(each_monitor_starts_where_there_is_no_rdma,
                     boost::unit_test::data::make({1, 2, 3}), kind) {
  Dispatcher::Options options = collecting(errors);
  options.device_monitor = static_cast<ibev::DeviceMonitor>(kind);
  Dispatcher monitored(options);
  int heard = 0;
  ibev::Handle watcher =
      monitored.watch_devices([&](ibev::DeviceChange, const std::string&) { ++heard; });
  BOOST_TEST(static_cast<int>(monitored.device_monitor()) == kind);
  for (int turn = 0; turn < 4; ++turn) monitored.run_once(100ms);  // rescans included
  BOOST_TEST(heard == 0);
  BOOST_TEST(errors.empty());
}

BOOST_AUTO_TEST_CASE(watch_refuses_bad_input) {
  int pipe_fds[2];
  BOOST_REQUIRE(::pipe(pipe_fds) == 0);
  device.async_fd = pipe_fds[0];
  expect_throw<std::invalid_argument>([&] { (void)dispatcher.watch_async_events(nullptr); },
                                      "Dispatcher::watch_async_events: the device is null");
  ibev::Handle watch = dispatcher.watch_async_events(&device);
  BOOST_TEST(watch.active());
  expect_throw<std::invalid_argument>([&] { (void)dispatcher.watch_async_events(&device); },
                                      "watched already");
  watch.release();
  ibev::Handle again = dispatcher.watch_async_events(&device);  // released, so allowed
  BOOST_TEST(again.active());
  again.release();
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);

  ibv_context closed{};
  closed.async_fd = 1'000'000;  // not an open fd
  expect_throw<std::system_error>([&] { (void)dispatcher.watch_async_events(&closed); },
                                  "fcntl");
}

BOOST_AUTO_TEST_CASE(watch_completions_refuses_bad_input) {
  ibv_comp_channel channel{};
  ibv_cq cq{};
  auto noop = [](const ibev::CompletionBatch&) {};
  const ibev::CompletionOptions defaults;
  expect_throw<std::invalid_argument>(
      [&] { (void)dispatcher.watch_completions(nullptr, defaults, noop); }, "null");
  expect_throw<std::invalid_argument>(
      [&] { (void)dispatcher.watch_completions(&cq, defaults, noop); },
      "the CQ has no completion channel");
  cq.channel = &channel;
  expect_throw<std::invalid_argument>(
      [&] { (void)dispatcher.watch_completions(&cq, defaults, ibev::CompletionHandler{}); },
      "the handler is empty");
  ibev::CompletionOptions options;
  options.mode = ibev::CompletionMode::kPolled;
  expect_throw<std::invalid_argument>(
      [&] { (void)dispatcher.watch_completions(&cq, options, noop); },
      "a kPolled CQ is polled by the application");
  options = {};
  options.ack_batch = 0;
  expect_throw<std::invalid_argument>(
      [&] { (void)dispatcher.watch_completions(&cq, options, noop); }, "ack_batch");
  options = {};
  options.mode = ibev::CompletionMode::kAdaptive;
  options.poll_budget = std::chrono::seconds(2);
  expect_throw<std::invalid_argument>(
      [&] { (void)dispatcher.watch_completions(&cq, options, noop); }, "poll_budget");
}

BOOST_AUTO_TEST_CASE(a_watch_may_outlive_its_dispatcher) {
  int pipe_fds[2];
  BOOST_REQUIRE(::pipe(pipe_fds) == 0);
  ibv_context other{};
  other.async_fd = pipe_fds[0];
  ibev::Handle survivor;
  {
    Dispatcher short_lived;
    survivor = short_lived.watch_async_events(&other);
  }
  survivor.release();
  BOOST_TEST(!survivor.active());
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
}

BOOST_AUTO_TEST_SUITE_END()

// Any fd an RDMA application also waits on, served in the same loop.
BOOST_FIXTURE_TEST_SUITE(application_fds, Fixture)

struct EventFd {
  EventFd() : fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) { BOOST_REQUIRE(fd >= 0); }
  ~EventFd() { ::close(fd); }
  void signal() const {
    const std::uint64_t one = 1;
    BOOST_REQUIRE(::write(fd, &one, sizeof one) == sizeof one);
  }
  std::uint64_t drain() const {
    std::uint64_t value = 0;
    return ::read(fd, &value, sizeof value) == sizeof value ? value : 0;
  }
  int fd;
};

// Level-triggered, one call per turn: the handler reads when it likes, and is
// called again while the fd stays readable.
BOOST_AUTO_TEST_CASE(an_fd_is_served_each_turn_while_ready) {
  EventFd efd;
  int calls = 0;
  std::uint32_t seen = 0;
  ibev::Handle handle = dispatcher.watch_fd(efd.fd, EPOLLIN, [&](std::uint32_t revents) {
    seen = revents;
    ++calls;
  });
  BOOST_TEST(dispatcher.run_once(0ms) == 0u);
  efd.signal();
  dispatcher.run_once(100ms);
  dispatcher.run_once(100ms);
  BOOST_TEST(calls == 2);  // not read yet: still ready
  BOOST_TEST((seen & EPOLLIN) != 0u);
  BOOST_TEST(efd.drain() == 1u);
  dispatcher.run_once(0ms);
  BOOST_TEST(calls == 2);
  BOOST_TEST(dispatcher.stats().fd_events == 2u);
  handle.release();
  efd.signal();
  BOOST_TEST(dispatcher.run_once(0ms) == 0u);
  BOOST_TEST(calls == 2);
}

// An epoll event read in the same turn as a handler that releases its source
// and watches a new fd with the same number: the event was the old source's,
// and the new one (not readable) must not be served with it.
BOOST_AUTO_TEST_CASE(an_event_of_a_source_that_left_never_reaches_its_fd_s_next_watch) {
  EventFd first, second;
  bool second_called = false, successor_called = false;
  int successor_fd = -1;
  ibev::Handle second_handle =
      dispatcher.watch_fd(second.fd, EPOLLIN, [&](std::uint32_t) { second_called = true; });
  ibev::Handle successor_handle;
  ibev::Handle first_handle = dispatcher.watch_fd(first.fd, EPOLLIN, [&](std::uint32_t) {
    first.drain();
    if (successor_fd >= 0) return;
    const int number = second.fd;
    second_handle.release();
    ::close(second.fd);
    second.fd = -1;
    successor_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);  // the lowest free number
    successor_handle = dispatcher.watch_fd(successor_fd, EPOLLIN,
                                           [&](std::uint32_t) { successor_called = true; });
    BOOST_TEST(successor_fd == number);
  });
  first.signal();  // ready first: epoll reports it first
  second.signal();
  dispatcher.run_once(100ms);
  BOOST_REQUIRE(successor_fd >= 0);
  BOOST_TEST(!second_called);
  BOOST_TEST(!successor_called);
  dispatcher.run_once(0ms);
  BOOST_TEST(!successor_called);
  successor_handle.release();
  ::close(successor_fd);
}

// A timerfd beside the RDMA sources, on the dispatcher's own thread.
BOOST_AUTO_TEST_CASE(a_timerfd_fires_on_the_dispatcher_thread) {
  const int timer = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  BOOST_REQUIRE(timer >= 0);
  itimerspec spec{};
  spec.it_value.tv_nsec = 5'000'000;
  spec.it_interval.tv_nsec = 5'000'000;
  BOOST_REQUIRE(::timerfd_settime(timer, 0, &spec, nullptr) == 0);
  Counter ticks;
  std::atomic<bool> on_dispatcher{true};
  ibev::Handle handle = dispatcher.watch_fd(timer, EPOLLIN, [&](std::uint32_t) {
    std::uint64_t expirations;
    if (::read(timer, &expirations, sizeof expirations) == sizeof expirations) {
      on_dispatcher = on_dispatcher && dispatcher.in_dispatcher_thread();
      ticks.bump();
    }
  });
  dispatcher.start();
  BOOST_TEST(ticks.wait_for(5));
  dispatcher.stop();
  handle.release();
  BOOST_TEST(on_dispatcher.load());
  ::close(timer);
}

// On an executor the fd waits for the handler's call: the loop does not spin
// on an fd the executor has not read yet.
BOOST_AUTO_TEST_CASE(an_fd_on_an_executor_is_not_served_again_until_its_call_returns) {
  EventFd efd;
  std::vector<ibev::Task> queued;
  int calls = 0;
  ibev::Handle handle = dispatcher.watch_fd(
      efd.fd, EPOLLIN,
      [&](std::uint32_t) {
        ++calls;
        efd.drain();
      },
      [&](ibev::Task task) { queued.push_back(std::move(task)); });
  efd.signal();
  dispatcher.run_once(100ms);
  BOOST_TEST(dispatcher.run_once(0ms) == 0u);  // out of the interest set
  BOOST_TEST(queued.size() == 1u);
  BOOST_TEST(calls == 0);
  queued.front()();
  queued.clear();
  BOOST_TEST(calls == 1);
  efd.signal();
  dispatcher.run_once(100ms);  // re-armed by the call
  BOOST_TEST(queued.size() == 1u);
  handle.release();
  queued.front()();  // released before it ran: not called
  BOOST_TEST(calls == 1);
}

BOOST_AUTO_TEST_CASE(watch_fd_refuses_bad_input_and_reports_a_throwing_handler) {
  EventFd efd;
  auto noop = [](std::uint32_t) {};
  expect_throw<std::invalid_argument>([&] { (void)dispatcher.watch_fd(-1, EPOLLIN, noop); },
                                      "negative");
  expect_throw<std::invalid_argument>([&] { (void)dispatcher.watch_fd(efd.fd, 0, noop); },
                                      "no events");
  expect_throw<std::invalid_argument>(
      [&] { (void)dispatcher.watch_fd(efd.fd, EPOLLIN, ibev::FdHandler{}); }, "empty");
  expect_throw<std::invalid_argument>(
      [&] { (void)dispatcher.watch_fd(efd.fd, EPOLLIN | EPOLLET, noop); }, "level-triggered");
  expect_throw<std::system_error>([&] { (void)dispatcher.watch_fd(1'000'000, EPOLLIN, noop); },
                                  "fcntl");
  ibev::Handle handle = dispatcher.watch_fd(efd.fd, EPOLLIN, [&](std::uint32_t) {
    efd.drain();
    throw std::runtime_error("fd handler broke");
  });
  expect_throw<std::invalid_argument>([&] { (void)dispatcher.watch_fd(efd.fd, EPOLLIN, noop); },
                                      "watched already");
  efd.signal();
  dispatcher.run_once(100ms);
  BOOST_REQUIRE(errors.size() == 1u);
  BOOST_TEST((errors[0].kind == ibev::Failure::Kind::kHandlerThrew));
  BOOST_TEST(errors[0].what.find("fd handler broke") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(posted_tasks_run_on_the_dispatching_thread_in_order) {
  std::vector<int> order;
  dispatcher.post([&] { order.push_back(1); });
  dispatcher.post([&] { throw std::runtime_error("task broke"); });
  dispatcher.post([&] { order.push_back(3); });
  BOOST_TEST(order.empty());
  dispatcher.run_once(100ms);
  BOOST_TEST(order == (std::vector<int>{1, 3}));
  BOOST_TEST(errors.size() == 1u);
  expect_throw<std::invalid_argument>([&] { dispatcher.post(ibev::Task{}); }, "empty");
}

// A backlog of posted tasks used to run whole in one turn: a thread posting
// faster than they ran held the dispatching thread (and stop()) for ever.
// A turn runs Options::batch of them, and the next turn does not sleep.
BOOST_AUTO_TEST_CASE(a_turn_runs_a_batch_of_posted_tasks_and_the_rest_follow_at_once) {
  const unsigned batch = Dispatcher::Options{}.batch;
  std::vector<unsigned> ran;
  for (unsigned i = 0; i < 3 * batch + 1; ++i) dispatcher.post([&ran, i] { ran.push_back(i); });
  dispatcher.run_once(0ms);
  BOOST_TEST(ran.size() == batch);
  for (int turn = 0; turn < 3; ++turn) dispatcher.run_once(0ms);  // 0 ms: none may wait
  BOOST_REQUIRE(ran.size() == 3 * batch + 1);
  for (unsigned i = 0; i < ran.size(); ++i) BOOST_TEST(ran[i] == i);
}

BOOST_AUTO_TEST_SUITE_END()

// An application that forgets start() used to see nothing at all.
BOOST_AUTO_TEST_SUITE(watchdog)

// A Dispatcher whose watchdog looks every 12 ms, and the failures it said,
// read from the test's thread while the watchdog writes them.
struct Watched {
  Watched() {
    Dispatcher::Options options;
    options.stall_after = 50ms;
    options.on_failure = [this](const ibev::Failure& f) {
      std::lock_guard<std::mutex> lock(mutex);
      failures.push_back(f);
    };
    dispatcher = std::make_unique<Dispatcher>(options);
  }
  std::vector<ibev::Failure> said() {
    std::lock_guard<std::mutex> lock(mutex);
    return failures;
  }
  std::mutex mutex;
  std::vector<ibev::Failure> failures;
  std::unique_ptr<Dispatcher> dispatcher;
};

BOOST_FIXTURE_TEST_CASE(events_waiting_without_a_dispatch_are_reported_once, Watched) {
  ibv_context device{};
  dispatcher->inject(&device, IBV_EVENT_PORT_ERR, ibev::Port{1});  // and no start()
  BOOST_REQUIRE(eventually([&] { return !said().empty(); }));
  // Still waiting, it is said once, not at every look.
  BOOST_TEST(stays_false_for([&] { return said().size() > 1u; }, 200ms,
                             "the watchdog looks every 12 ms: a repeat comes within 16 looks"));
  const auto failures = said();
  BOOST_REQUIRE(failures.size() == 1u);
  BOOST_TEST((failures[0].kind == ibev::Failure::Kind::kUndispatched));
  BOOST_TEST(failures[0].what.find("call start()") != std::string::npos, failures[0].what);
  dispatcher->run_once(0ms);  // dispatched: nothing more to say
  BOOST_TEST(stays_false_for([&] { return said().size() != 1u; }, 200ms,
                             "the watchdog looks every 12 ms: a report comes within 16 looks"));
  BOOST_TEST(said().size() == 1u);
}

BOOST_FIXTURE_TEST_CASE(a_handler_holding_the_dispatching_thread_is_reported, Watched) {
  std::atomic<bool> done{false};
  dispatcher->post([&] {
    // The stall under test, a duration on purpose: the thread held past
    // stall_after (50 ms) is what the watchdog must report.
    std::this_thread::sleep_for(300ms);
    done = true;
  });
  dispatcher->start();
  BOOST_REQUIRE(eventually([&] { return done.load(); }));
  dispatcher->stop();
  const auto failures = said();
  BOOST_REQUIRE(failures.size() == 1u);
  BOOST_TEST((failures[0].kind == ibev::Failure::Kind::kStalled));
}

// A dispatcher serving promptly says nothing.
BOOST_FIXTURE_TEST_CASE(a_dispatcher_that_keeps_up_is_quiet, Watched) {
  ibv_context device{};
  Counter heard;
  ibev::Handle listener =
      dispatcher->registry().listen(&device, [&](const Event&) { heard.bump(); });
  dispatcher->start();
  for (int i = 1; i <= 20; ++i) {
    dispatcher->inject(&device, IBV_EVENT_PORT_ACTIVE, ibev::Port{1});
    BOOST_REQUIRE(heard.wait_for(i));
    // 20 x 10 ms of prompt serving, and the watchdog says nothing.
    BOOST_TEST(stays_false_for([&] { return !said().empty(); }, 10ms,
                               "the watchdog looks every 12 ms: 20 of these span 16 looks"));
  }
  dispatcher->stop();
  BOOST_TEST(said().empty());
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_CASE(a_worker_thread_runs_tasks_in_order_and_drains_on_destruction) {
  std::vector<int> order;
  std::vector<ibev::Failure> failures;
  {
    ibev::WorkerThread worker([&](const ibev::Failure& f) { failures.push_back(f); });
    ibev::Executor executor = worker.executor();
    for (int i = 0; i < 100; ++i) {
      executor([&order, i, &worker] {
        BOOST_TEST(worker.in_worker_thread());
        order.push_back(i);
      });
    }
    worker.post([] { throw std::runtime_error("task broke"); });
    worker.post([&order] { order.push_back(100); });
  }
  BOOST_REQUIRE(order.size() == 101u);
  for (int i = 0; i <= 100; ++i) BOOST_TEST(order[i] == i);
  BOOST_REQUIRE(failures.size() == 1u);
  BOOST_TEST(failures[0].what == "task broke");
}

// A task's captures die outside the worker's lock: one whose destructor posts
// (a cleanup handed to the same worker, the usual end of a shared_ptr's life)
// must not deadlock the worker. On failure the stuck worker is leaked: joining
// it would hang the test.
BOOST_AUTO_TEST_CASE(a_task_whose_captures_post_when_destroyed_does_not_deadlock_the_worker) {
  struct PostsWhenDestroyed {
    PostsWhenDestroyed(ibev::WorkerThread& w, std::promise<void>& c)
        : worker(w), cleaned_up(c) {}
    PostsWhenDestroyed(const PostsWhenDestroyed&) = delete;
    ~PostsWhenDestroyed() {
      worker.post([&cleaned_up = cleaned_up] { cleaned_up.set_value(); });
    }
    ibev::WorkerThread& worker;
    std::promise<void>& cleaned_up;
  };
  std::promise<void> cleaned_up;
  auto worker = std::make_unique<ibev::WorkerThread>();
  auto captured = std::make_shared<PostsWhenDestroyed>(*worker, cleaned_up);
  worker->post([captured = std::move(captured)] {});
  if (cleaned_up.get_future().wait_for(10s) != std::future_status::ready) {
    static_cast<void>(worker.release());
    BOOST_FAIL("the worker deadlocked destroying a task whose capture posts");
  }
}
