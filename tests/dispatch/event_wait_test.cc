// Waits on an object's event without RDMA: injected events, a device whose
// async fd hangs up (its loss), timeouts from the loop's timer, cancels.
#define BOOST_TEST_MODULE ibev_event_wait
#include <ibev/dispatch/event_wait.h>

#include <unistd.h>

#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

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
  dispatcher->start();
  std::promise<std::string> first, second;
  std::atomic<int> calls{0};
  ibev::Handle heard = ibev::wait_for(*dispatcher, &qp, {IBV_EVENT_COMM_EST}, 10s,
                                      [&](const WaitResult& r) {
                                        ++calls;
                                        first.set_value(outcome(r));
                                      });
  dispatcher->inject(&device, IBV_EVENT_COMM_EST, &qp);
  dispatcher->inject(&device, IBV_EVENT_COMM_EST, &qp);
  BOOST_REQUIRE(first.get_future().wait_for(5s) == std::future_status::ready);
  ibev::Handle timed = ibev::wait_for(*dispatcher, &qp, {IBV_EVENT_QP_FATAL}, 30ms,
                                      [&](const WaitResult& r) { second.set_value(outcome(r)); });
  auto timed_out = second.get_future();
  BOOST_REQUIRE(timed_out.wait_for(5s) == std::future_status::ready);
  BOOST_TEST(timed_out.get() == "timed out");
  std::this_thread::sleep_for(100ms);
  BOOST_TEST(calls.load() == 1);
}

BOOST_AUTO_TEST_CASE(a_released_wait_is_never_called) {
  dispatcher->start();
  std::atomic<int> calls{0};
  ibev::Handle waiting = ibev::wait_for(*dispatcher, &qp, {IBV_EVENT_COMM_EST}, 20ms,
                                        [&](const WaitResult&) { ++calls; });
  waiting.release();
  dispatcher->inject(&device, IBV_EVENT_COMM_EST, &qp);
  std::this_thread::sleep_for(200ms);
  BOOST_TEST(calls.load() == 0);
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
  dispatcher->start();
  ibev::EventWait wait = ibev::wait_for(*dispatcher, &qp, {IBV_EVENT_QP_FATAL}, 10s);
  // An injected DEVICE_FATAL is a test of handlers, not a loss.
  dispatcher->inject(&device, IBV_EVENT_DEVICE_FATAL, ibev::WholeDevice{});
  std::this_thread::sleep_for(100ms);
  BOOST_TEST(!wait.result().has_value());
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
  std::this_thread::sleep_for(150ms);
  BOOST_TEST(runs.load() == 1);
  BOOST_TEST(cancelled_runs.load() == 0);
  BOOST_CHECK_THROW(dispatcher->call_after(-1ms, [] {}), std::invalid_argument);
  ibv_cq cq{};
  BOOST_CHECK_THROW(dispatcher->take_completion(&cq, 1, 2, [](const ibv_wc&) {}),
                    std::invalid_argument);  // no channel, not watched
}

BOOST_AUTO_TEST_SUITE_END()
