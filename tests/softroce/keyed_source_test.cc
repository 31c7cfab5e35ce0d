// A source of events that name their objects by number, added from outside
// ibev's sources, as a DevX event channel would be (mlx5dv_devx_get_event
// gives an object's id and an event type; rxe has no DevX, so a pipe
// carries (QP number, event code) records in its place). Adding it is this
// file and its BUILD entry: its fd is served by the Dispatcher
// (watch_fd), each record becomes an Event by Event::synthesize(device,
// code, ObjectNumber) and the Registry routes it by the open key to the
// QP's own handler, as it routes what the async fd says by address. No
// file of core/, dispatch/ or verbs/ changes.
#define BOOST_TEST_MODULE ibev_softroce_keyed_source
#include <fcntl.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <ibev/verbs/queue_pair.h>

#include "tests/softroce/rdma_fixture.h"
#include "tests/softroce/verbs_fixture.h"
#include "tests/support/testing.h"

using namespace ibev;
using namespace ibev::testing;
using namespace std::chrono_literals;

namespace {

// The stand-in for a DevX event channel of one device: what raise() writes
// is read on the dispatching thread and routed.
class NumberedEventSource {
 public:
  NumberedEventSource(Dispatcher& dispatcher, std::shared_ptr<Device> device)
      : registry_(dispatcher.registry()), device_(std::move(device)) {
    BOOST_REQUIRE(::pipe2(fds_, O_NONBLOCK | O_CLOEXEC) == 0);
    served_ = dispatcher.watch_fd(fds_[0], EPOLLIN, [this](std::uint32_t) { serve(); });
  }
  ~NumberedEventSource() {
    served_.release();
    ::close(fds_[0]);
    ::close(fds_[1]);
  }

  void raise(std::uint32_t qp_num, ibv_event_type code) {
    const Record record{qp_num, code};
    BOOST_REQUIRE(::write(fds_[1], &record, sizeof record) == sizeof record);
  }

 private:
  struct Record {
    std::uint32_t number;
    ibv_event_type code;
  };
  void serve() {
    Record record;
    while (::read(fds_[0], &record, sizeof record) == sizeof record) {
      registry_.route(Event::synthesize(device_->context(), record.code,
                                        ObjectNumber{ElementKind::kQp, record.number}));
    }
  }

  Registry& registry_;
  const std::shared_ptr<Device> device_;
  int fds_[2] = {-1, -1};
  Handle served_;
};

// Who heard which QP's event, and on which thread.
struct Heard {
  std::mutex mutex;
  std::vector<std::uint32_t> numbers;
  std::vector<std::thread::id> threads;
  Handler as_handler() {
    return [this](const Event& event) {
      std::lock_guard<std::mutex> lock(mutex);
      numbers.push_back(event.object_number() ? event.object_number()->number : 0);
      threads.push_back(std::this_thread::get_id());
    };
  }
  std::size_t count() {
    std::lock_guard<std::mutex> lock(mutex);
    return numbers.size();
  }
};

}  // namespace

// A QP's number raised by the source reaches that QP's handler, on the
// dispatching thread; a number no QP has reaches the unclaimed observers;
// the number of a QP since closed reaches nobody.
BOOST_AUTO_TEST_CASE(a_source_keyed_by_qp_number_reaches_the_qps_handler) {
  Env env{test_device()};
  auto cq = plain_cq(env.device);
  QueuePairOptions options;
  options.send_cq = cq;
  options.recv_cq = cq;
  Heard heard_a, heard_b;
  auto a = QueuePair::create(env.pd, heard_a.as_handler(), options);
  auto b = QueuePair::create(env.pd, heard_b.as_handler(), options);
  std::atomic<int> unclaimed{0};
  Handle observer = env.dispatcher.registry().on_unclaimed([&](const Event&) { ++unclaimed; });
  std::atomic<std::thread::id> dispatching{};
  env.dispatcher.post([&] { dispatching = std::this_thread::get_id(); });
  BOOST_REQUIRE(eventually([&] { return dispatching.load() != std::thread::id{}; }));
  NumberedEventSource source(env.dispatcher, env.device);

  source.raise(a->qp_num(), IBV_EVENT_QP_FATAL);
  BOOST_REQUIRE(eventually([&] { return heard_a.count() == 1u; }));
  BOOST_TEST(heard_a.numbers.front() == a->qp_num());
  BOOST_TEST((heard_a.threads.front() == dispatching.load()));
  BOOST_TEST(heard_b.count() == 0u);

  const std::uint32_t nobody = std::max(a->qp_num(), b->qp_num()) + 1000;
  source.raise(nobody, IBV_EVENT_QP_FATAL);
  BOOST_REQUIRE(eventually([&] { return unclaimed.load() == 1; }));

  const std::uint32_t closed = b->qp_num();
  b->close();
  source.raise(closed, IBV_EVENT_QP_REQ_ERR);
  source.raise(a->qp_num(), IBV_EVENT_COMM_EST);  // after it, through the same pipe
  BOOST_REQUIRE(eventually([&] { return heard_a.count() == 2u; }));
  BOOST_TEST(heard_b.count() == 0u);
  BOOST_TEST(unclaimed.load() == 2);  // the closed QP's number is nobody's
  BOOST_TEST(env.errors().empty(), env.failures.summary());
}
