// The dispatcher without an RDMA device: injection, the thread rules, stop
// and restart, a vanished device, and bad input. Real devices: tests/softroce.
#define BOOST_TEST_MODULE ibev_dispatch_dispatcher
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <ibev/dispatch/dispatcher.h>

using namespace std::chrono_literals;
using ibev::Dispatcher;
using ibev::Event;
using ibev::Registry;

namespace {

// Counts calls and lets a test wait for them, bounded.
class Counter {
 public:
  void bump() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++count_;
    changed_.notify_all();
  }
  bool wait_for(int count, std::chrono::milliseconds limit = 5s) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, limit, [&] { return count_ >= count; });
  }
  int count() {
    std::lock_guard<std::mutex> lock(mutex_);
    return count_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int count_ = 0;
};

template <typename Exception>
void expect_throw(const std::function<void()>& call, const std::string& fragment) {
  try {
    call();
    BOOST_ERROR("expected an exception mentioning " + fragment);
  } catch (const Exception& e) {
    BOOST_TEST(std::string(e.what()).find(fragment) != std::string::npos,
               "'" << e.what() << "' should mention '" << fragment << "'");
  }
}

struct Fixture {
  Registry registry;
  ibv_context device{};
  ibv_qp qp{};
  std::vector<std::string> errors;
  Dispatcher dispatcher{registry, Dispatcher::Options{
                                      16, [this](std::string_view what) {
                                        errors.emplace_back(what);
                                      }}};
};

}  // namespace

BOOST_FIXTURE_TEST_SUITE(injection, Fixture)

BOOST_AUTO_TEST_CASE(delivered_by_run_once_on_the_calling_thread) {
  std::vector<std::thread::id> ran_on;
  ibev::Attachment handler = registry.attach(&qp, [&](const Event& e) {
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

BOOST_AUTO_TEST_CASE(delivered_on_the_dispatcher_thread) {
  Counter delivered;
  std::atomic<bool> on_dispatcher{false};
  ibev::Attachment listener = registry.listen(&device, [&](const Event& e) {
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
  ibev::Attachment observer =
      registry.on_unclaimed([&](const Event&) { ++unclaimed; });
  ibev::Attachment old_handler =
      registry.attach(&qp, [&](const Event&) { ++old_calls; });
  dispatcher.inject(&device, IBV_EVENT_QP_FATAL, &qp);
  old_handler.release();
  ibev::Attachment new_handler =
      registry.attach(&qp, [&](const Event&) { ++new_calls; });
  dispatcher.run_once(100ms);
  BOOST_TEST(old_calls == 0);
  BOOST_TEST(new_calls == 0);
  BOOST_TEST(unclaimed == 1);
}

BOOST_AUTO_TEST_CASE(a_throwing_handler_does_not_stop_dispatch) {
  int after = 0;
  ibev::Attachment broken = registry.attach(
      &qp, [](const Event&) { throw std::runtime_error("handler broke"); });
  ibev::Attachment fine = registry.attach(&qp, [&](const Event&) { ++after; });
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
  ibev::Attachment listener =
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
  ibev::Attachment listener = registry.listen(&device, [&](const Event&) {
    dispatcher.stop();  // asks; cannot join itself
    delivered.bump();
  });
  dispatcher.start();
  dispatcher.inject(&device, IBV_EVENT_PORT_ERR, ibev::Port{1});
  BOOST_REQUIRE(delivered.wait_for(1));
  // The thread ends on its own; start() joins it and runs again.
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (dispatcher.running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  BOOST_TEST(!dispatcher.running());
  listener.release();
  Counter again;
  ibev::Attachment second =
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
  ibev::Attachment listener =
      registry.listen(&device, [&](const Event& e) { heard.push_back(e); });
  ibev::Watch watch = dispatcher.watch(&device);

  ::close(pipe_fds[1]);
  dispatcher.run_once(1000ms);
  BOOST_REQUIRE_EQUAL(heard.size(), 1u);
  BOOST_TEST(heard[0].code() == IBV_EVENT_DEVICE_FATAL);
  BOOST_TEST(heard[0].synthesized());
  BOOST_TEST(dispatcher.stats().devices_lost == 1u);
  BOOST_TEST(errors.size() == 1u);

  // No longer watched: the hung-up fd does not wake the loop again.
  BOOST_TEST(dispatcher.run_once(50ms) == 0u);
  BOOST_TEST(heard.size() == 1u);
  watch.release();  // harmless now
  ::close(pipe_fds[0]);
}

BOOST_AUTO_TEST_CASE(watch_refuses_bad_input) {
  int pipe_fds[2];
  BOOST_REQUIRE(::pipe(pipe_fds) == 0);
  device.async_fd = pipe_fds[0];
  expect_throw<std::invalid_argument>([&] { (void)dispatcher.watch(nullptr); },
                                      "Dispatcher::watch: the device is null");
  ibev::Watch watch = dispatcher.watch(&device);
  BOOST_TEST(watch.active());
  expect_throw<std::invalid_argument>([&] { (void)dispatcher.watch(&device); },
                                      "watched already");
  watch.release();
  ibev::Watch again = dispatcher.watch(&device);  // released, so allowed
  BOOST_TEST(again.active());
  again.release();
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);

  ibv_context closed{};
  closed.async_fd = 1'000'000;  // not an open fd
  expect_throw<std::system_error>([&] { (void)dispatcher.watch(&closed); },
                                  "fcntl");
}

BOOST_AUTO_TEST_CASE(watch_completions_refuses_bad_input) {
  ibv_comp_channel channel{}, other{};
  ibv_cq cq{};
  cq.channel = &other;
  auto noop = [](const ibev::CompletionBatch&) {};
  expect_throw<std::invalid_argument>(
      [&] { (void)dispatcher.watch_completions(nullptr, &cq, noop); }, "null");
  expect_throw<std::invalid_argument>(
      [&] {
        (void)dispatcher.watch_completions(&channel, &cq, ibev::CompletionHandler{});
      },
      "the handler is empty");
  expect_throw<std::invalid_argument>(
      [&] { (void)dispatcher.watch_completions(&channel, &cq, noop); },
      "not created on this channel");
  cq.channel = &channel;
  expect_throw<std::invalid_argument>(
      [&] {
        (void)dispatcher.watch_completions(&channel, &cq, noop,
                                           ibev::CompletionOptions{0, 16, false, {}});
      },
      "ack_batch");
  expect_throw<std::invalid_argument>(
      [&] {
        (void)dispatcher.watch_completions(
            &channel, &cq, noop,
            ibev::CompletionOptions{1, 16, false, std::chrono::seconds(2)});
      },
      "poll_budget");
}

BOOST_AUTO_TEST_CASE(a_watch_may_outlive_its_dispatcher) {
  int pipe_fds[2];
  BOOST_REQUIRE(::pipe(pipe_fds) == 0);
  ibv_context other{};
  other.async_fd = pipe_fds[0];
  ibev::Watch survivor;
  {
    Dispatcher short_lived(registry);
    survivor = short_lived.watch(&other);
  }
  survivor.release();
  BOOST_TEST(!survivor.active());
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
}

BOOST_AUTO_TEST_SUITE_END()
