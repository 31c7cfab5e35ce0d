// ibev inside a Boost.Asio io_context: the Dispatcher served by the
// io_context's thread through AsioDriver, and handlers posted to an Asio
// strand through asio_executor().
#define BOOST_TEST_MODULE ibev_dispatch_asio
#include <sys/eventfd.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <thread>
#include <vector>

#include <ibev/dispatch/asio.h>
#include <ibev/dispatch/dispatcher.h>

using namespace std::chrono_literals;
using ibev::Dispatcher;
using ibev::Event;

BOOST_AUTO_TEST_CASE(the_io_context_thread_dispatches) {
  boost::asio::io_context io;
  Dispatcher dispatcher;
  ibev::AsioDriver driver(io, dispatcher);
  ibv_context device{};
  std::vector<std::thread::id> heard_on;
  ibev::Handle listener = dispatcher.registry().listen(&device, [&](const Event& e) {
    heard_on.push_back(std::this_thread::get_id());
    if (heard_on.size() == 3) io.stop();
    BOOST_TEST(e.synthesized());
  });
  for (int i = 0; i < 3; ++i) dispatcher.inject(&device, IBV_EVENT_PORT_ACTIVE, ibev::Port{1});
  io.run_for(5s);
  BOOST_REQUIRE(heard_on.size() == 3u);
  for (const auto& id : heard_on) BOOST_TEST((id == std::this_thread::get_id()));
}

// An application fd and a timer of the application's own, in one io_context.
BOOST_AUTO_TEST_CASE(ibev_sources_and_asio_work_share_the_loop) {
  boost::asio::io_context io;
  Dispatcher dispatcher;
  ibev::AsioDriver driver(io, dispatcher);
  const int efd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  BOOST_REQUIRE(efd >= 0);
  int fd_calls = 0, asio_calls = 0;
  ibev::Handle watch = dispatcher.watch_fd(efd, EPOLLIN, [&](std::uint32_t) {
    std::uint64_t value;
    if (::read(efd, &value, sizeof value) == sizeof value) ++fd_calls;
    if (fd_calls == 2) io.stop();
  });
  boost::asio::post(io, [&] {
    ++asio_calls;
    const std::uint64_t one = 1;
    BOOST_REQUIRE(::write(efd, &one, sizeof one) == sizeof one);
  });
  boost::asio::post(io, [&] {
    ++asio_calls;
    dispatcher.post([&] {
      const std::uint64_t one = 1;
      BOOST_REQUIRE(::write(efd, &one, sizeof one) == sizeof one);
    });
  });
  io.run_for(5s);
  BOOST_TEST(asio_calls == 2);
  BOOST_TEST(fd_calls == 2);
  watch.release();
  ::close(efd);
}

// Handlers on a strand: run by whichever thread runs the io_context, in
// order, never two at once; resolution stays on the dispatching thread.
BOOST_AUTO_TEST_CASE(handlers_on_a_strand_run_in_order) {
  boost::asio::io_context io;
  auto strand = boost::asio::make_strand(io);
  Dispatcher dispatcher;
  ibv_context device{};
  std::vector<int> order;
  ibev::Handle listener = dispatcher.registry().listen(
      &device, ibev::EventFilter{}, [&](const Event& e) { order.push_back(*e.port()); },
      ibev::asio_executor(strand));
  for (int port = 1; port <= 5; ++port) {
    dispatcher.inject(&device, IBV_EVENT_PORT_ACTIVE, ibev::Port{port});
  }
  dispatcher.run_once(100ms);  // resolved and handed to the strand
  BOOST_TEST(order.empty());
  std::thread runner([&] { io.run(); });
  runner.join();
  BOOST_TEST(order == (std::vector<int>{1, 2, 3, 4, 5}));
}

BOOST_AUTO_TEST_CASE(a_driver_refuses_a_dispatcher_with_its_own_thread) {
  boost::asio::io_context io;
  Dispatcher dispatcher;
  dispatcher.start();
  BOOST_CHECK_THROW(ibev::AsioDriver(io, dispatcher), std::logic_error);
  dispatcher.stop();
}
