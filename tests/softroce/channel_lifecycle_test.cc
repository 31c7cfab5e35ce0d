// Completion channels and CQs whose Dispatcher goes first, or whose channel
// is watched again the moment its last CQ left it. Raw verbs objects and a
// Dispatcher of the test's own, on rxe0.
#define BOOST_TEST_MODULE ibev_softroce_channel_lifecycle
#include <fcntl.h>

#include <atomic>
#include <cerrno>
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>
#include <memory>
#include <string>
#include <system_error>
#include <vector>
#include <functional>
#include <thread>

#include <ibev/dispatch/dispatcher.h>
#include <ibev/dispatch/test_seams.h>
#include <ibev/ibev_c.h>

#include "tests/softroce/rdma_fixture.h"
#include "tests/softroce/verbs_fixture.h"

using namespace ibev;
using namespace ibev::testing;
using namespace std::chrono_literals;

namespace {

struct ChannelDeleter {
  void operator()(ibv_comp_channel* c) const noexcept { ibv_destroy_comp_channel(c); }
};
using ChannelPtr = std::unique_ptr<ibv_comp_channel, ChannelDeleter>;

// Two RC QPs on one device, both on `cq`, connected to each other; one
// 64-byte message at a time from a to b.
struct Traffic {
  Traffic(ibv_pd* pd, ibv_cq* cq) {
    ibv_qp_init_attr init{};
    init.send_cq = init.recv_cq = cq;
    init.qp_type = IBV_QPT_RC;
    init.cap = {8, 8, 1, 1, 0};
    a.reset(ibv_create_qp(pd, &init));
    b.reset(ibv_create_qp(pd, &init));
    BOOST_REQUIRE(a && b);
    connect_rc_pair(a.get(), b.get());
    mr.reset(ibv_reg_mr(pd, buffer, sizeof buffer, IBV_ACCESS_LOCAL_WRITE));
    BOOST_REQUIRE(mr);
  }
  void message() {
    ibv_sge to{reinterpret_cast<std::uintptr_t>(buffer + 64), 64, mr->lkey};
    ibv_recv_wr recv{};
    recv.sg_list = &to;
    recv.num_sge = 1;
    ibv_recv_wr* bad_recv = nullptr;
    BOOST_REQUIRE(ibv_post_recv(b.get(), &recv, &bad_recv) == 0);
    ibv_sge from{reinterpret_cast<std::uintptr_t>(buffer), 64, mr->lkey};
    ibv_send_wr send{};
    send.sg_list = &from;
    send.num_sge = 1;
    send.opcode = IBV_WR_SEND;
    send.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad_send = nullptr;
    BOOST_REQUIRE(ibv_post_send(a.get(), &send, &bad_send) == 0);
  }
  char buffer[128] = {};
  QpPtr a, b;
  MrPtr mr;
};

std::function<void(ibv_comp_channel*)> on_channel_retired;

}  // namespace

// Events read but not yet acked (ack_batch 32) used to be acked on release
// only while the Dispatcher existed: destroying the CQ after it then waited
// for ever.
BOOST_AUTO_TEST_CASE(a_cq_outliving_its_dispatcher_is_destroyed_without_waiting) {
  ContextPtr context = open_device(test_device());
  PdPtr pd(ibv_alloc_pd(context.get()));
  ChannelPtr channel(ibv_create_comp_channel(context.get()));
  BOOST_REQUIRE(pd && channel);
  ibv_cq* cq = ibv_create_cq(context.get(), 64, nullptr, channel.get(), 0);
  BOOST_REQUIRE(cq);
  auto traffic = std::make_unique<Traffic>(pd.get(), cq);

  std::atomic<std::size_t> completions{0};
  Handle watch;
  {
    Dispatcher dispatcher;
    CompletionOptions options;
    options.ack_batch = 32;
    watch = dispatcher.watch_completions(
        cq, options, [&](const CompletionBatch& batch) { completions += batch.size; });
    dispatcher.start();
    for (std::size_t i = 1; i <= 3; ++i) {
      traffic->message();
      BOOST_REQUIRE(eventually([&] { return completions.load() >= 2 * i; }));
    }
    BOOST_REQUIRE(dispatcher.completion_stats(cq).events >= 1u);
    BOOST_REQUIRE(dispatcher.completion_stats(cq).ack_calls == 0u);  // awaiting their ack
  }
  traffic.reset();
  BOOST_TEST(finishes_within(
      [&] {
        watch.release();
        ibv_destroy_cq(cq);
      },
      10s));
}

// A memory region (and so its domain and Device) held past the Env and
// Dispatcher that made it used to reach the freed Dispatcher when dropped
// (ASan: heap-use-after-free in Device::close). Either order of teardown:
// after the Dispatcher, what needs it says ENODEV, and dropping runs the
// destroy verbs only; before it, as always.
BOOST_DATA_TEST_CASE(verbs_objects_dropped_after_or_before_their_dispatcher,
                     boost::unit_test::data::make({true, false}), dispatcher_first) {
  auto env = std::make_unique<Env>(test_device());
  std::vector<char> memory(4096);
  auto mr = MemoryRegion::create(env->pd, memory.data(), memory.size(), IBV_ACCESS_LOCAL_WRITE);
  auto cq = CompletionQueue::create(env->device, [](const CompletionBatch&) {}, nullptr);
  std::shared_ptr<QueuePair> qp;
  {
    QueuePair::Options options;  // holds the CQ too
    options.send_cq = options.recv_cq = cq;
    qp = QueuePair::create(env->pd, nullptr, options);
  }
  std::weak_ptr<Device> device = env->device;
  const auto gone = [](const std::system_error& e) {
    return e.code() == std::errc::no_such_device;
  };
  if (dispatcher_first) {
    env.reset();
    BOOST_REQUIRE(!device.expired());  // the memory region holds it
    BOOST_CHECK_EXCEPTION(device.lock()->dispatcher(), std::system_error, gone);
    // A listener nobody would deliver to (it was accepted, inert).
    BOOST_CHECK_EXCEPTION((void)device.lock()->on_event(EventFilter(), [](const Event&) {}),
                          std::system_error, gone);
    BOOST_CHECK_EXCEPTION(
        CompletionQueue::create(device.lock(), [](const CompletionBatch&) {}, nullptr),
        std::system_error, gone);
    BOOST_CHECK_EXCEPTION(qp->drain(), std::system_error, gone);
    BOOST_TEST(cq->served_by() == nullptr);
    BOOST_TEST(cq->completion_stats().events == 0u);
  }
  BOOST_TEST(finishes_within(
      [&] {
        qp.reset();
        cq.reset();
        mr.reset();
      },
      10s));
  env.reset();
  BOOST_TEST(device.expired());  // closed whole
}

// Releasing a channel's last CQ takes the channel out of the epoll set and
// gives its fd its flags back; a CQ watched on the channel right then must
// find it either whole or gone. That used to be done in two steps with the
// lock dropped between them: a new watch could slip in (EEXIST), or have its
// fd made blocking under it, and the dispatcher then sat in read() for ever.
// The seam runs the new watch exactly where that gap was.
BOOST_AUTO_TEST_CASE(a_channel_watched_again_as_its_last_cq_leaves) {
  ContextPtr context = open_device(test_device());
  PdPtr pd(ibv_alloc_pd(context.get()));
  ChannelPtr channel(ibv_create_comp_channel(context.get()));
  BOOST_REQUIRE(pd && channel);
  CqPtr first(ibv_create_cq(context.get(), 16, nullptr, channel.get(), 0));
  CqPtr second(ibv_create_cq(context.get(), 64, nullptr, channel.get(), 0));
  BOOST_REQUIRE(first && second);
  Traffic traffic(pd.get(), second.get());

  Dispatcher dispatcher;
  dispatcher.start();
  std::atomic<std::size_t> completions{0};
  Handle leaving = dispatcher.watch_completions(first.get(), {}, [](const CompletionBatch&) {});
  Handle joining;
  bool seam_ran = false;
  on_channel_retired = [&](ibv_comp_channel* retired) {
    if (retired != channel.get() || seam_ran) return;
    seam_ran = true;
    joining = dispatcher.watch_completions(
        second.get(), {}, [&](const CompletionBatch& batch) { completions += batch.size; });
  };
  detail::test_seams::after_channel_retired = [](ibv_comp_channel* c) { on_channel_retired(c); };
  leaving.release();
  detail::test_seams::after_channel_retired = nullptr;

  BOOST_REQUIRE(seam_ran);
  BOOST_REQUIRE(joining.active());
  BOOST_TEST((::fcntl(channel->fd, F_GETFL) & O_NONBLOCK) != 0,
             "the channel's fd was made blocking while watched");
  for (std::size_t i = 1; i <= 5; ++i) {
    traffic.message();
    BOOST_REQUIRE_MESSAGE(eventually([&] { return completions.load() >= 2 * i; }),
                          "message " << i << " never delivered: is the dispatcher stuck?");
  }
  joining.release();
  dispatcher.stop();
}

// The same in C, as ibev_c.h's Lifetime promises: a device outliving its
// dispatcher answers ENODEV to ibev_device_listen.
BOOST_AUTO_TEST_CASE(a_c_device_listener_after_its_dispatcher_is_enodev) {
  const ibev_dispatcher_attr attr{};
  ibev_dispatcher* dispatcher = ibev_dispatcher_create(&attr);
  BOOST_REQUIRE_MESSAGE(dispatcher, ibev_last_error());
  ibev_device* device = ibev_device_open(dispatcher, test_device().c_str());
  BOOST_REQUIRE_MESSAGE(device, ibev_last_error());
  ibev_dispatcher_destroy(dispatcher);
  errno = 0;
  ibev_handle* listener =
      ibev_device_listen(device, nullptr, [](const ibev_event*, void*) {}, nullptr);
  BOOST_TEST(listener == nullptr);
  BOOST_TEST(errno == ENODEV);
  BOOST_TEST(std::string(ibev_last_error()).find("ibev_device_listen") != std::string::npos,
             ibev_last_error());
  ibev_handle_release(listener);
  ibev_device_destroy(device);
}
