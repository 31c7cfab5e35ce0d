// ibev with Boost.Asio: handlers on an Asio executor, and a Dispatcher served
// by an io_context instead of a thread of its own.
//
// asio_executor(ex) turns any Asio executor (io_context::get_executor(), a
// strand: make_strand(io)) into an ibev Executor: handlers are posted to it,
// so they run where the application's other Asio handlers run, in order on a
// strand.
//
// AsioDriver runs a Dispatcher inside an io_context: the Dispatcher's fd()
// is registered as a posix::stream_descriptor, and each time it is readable
// one turn runs (run_once(0)) on the io_context's thread, which is then the
// dispatching thread. The Dispatcher's own thread must not be started. The
// driver must be destroyed on the io_context's thread, or after its run() has
// returned; destroying it cancels the wait (the Dispatcher stays usable).
//
// Header-only: include it only where Boost.Asio is wanted (Debian's
// libboost-dev has it).
#ifndef IBEV_DISPATCH_ASIO_H_
#define IBEV_DISPATCH_ASIO_H_

#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <chrono>
#include <memory>
#include <utility>

#include <ibev/core/executor.h>
#include <ibev/core/failure.h>
#include <ibev/dispatch/dispatcher.h>

namespace ibev {

template <typename AsioExecutor>
Executor asio_executor(AsioExecutor executor) {
  return [executor](Task task) { boost::asio::post(executor, std::move(task)); };
}

class AsioDriver {
 public:
  // Throws std::system_error (dup) or std::logic_error (the Dispatcher's
  // thread is running).
  AsioDriver(boost::asio::io_context& io, Dispatcher& dispatcher)
      : dispatcher_(dispatcher), state_(std::make_shared<State>(io)) {
    if (dispatcher.running()) {
      throw std::logic_error("AsioDriver: the Dispatcher's own thread is running");
    }
    // A dup: the descriptor object closes what it holds, and the epoll fd
    // stays the Dispatcher's.
    const int fd = ::dup(dispatcher.fd());
    if (fd < 0) throw_system_error("dup", errno);
    state_->descriptor.assign(fd);
    arm(state_, dispatcher_);
  }
  ~AsioDriver() {
    state_->stopped = true;
    boost::system::error_code ignored;
    state_->descriptor.cancel(ignored);
    state_->descriptor.close(ignored);
  }
  AsioDriver(const AsioDriver&) = delete;
  AsioDriver& operator=(const AsioDriver&) = delete;

 private:
  struct State {
    explicit State(boost::asio::io_context& io) : descriptor(io) {}
    boost::asio::posix::stream_descriptor descriptor;
    bool stopped = false;
  };

  static void arm(const std::shared_ptr<State>& state, Dispatcher& dispatcher) {
    state->descriptor.async_wait(
        boost::asio::posix::stream_descriptor::wait_read,
        [weak = std::weak_ptr<State>(state), &dispatcher](const boost::system::error_code& ec) {
          auto state = weak.lock();
          if (!state || state->stopped || ec) return;
          dispatcher.run_once(std::chrono::milliseconds(0));
          arm(state, dispatcher);
        });
  }

  Dispatcher& dispatcher_;
  std::shared_ptr<State> state_;
};

}  // namespace ibev

#endif  // IBEV_DISPATCH_ASIO_H_
