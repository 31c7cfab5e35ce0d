// Smoke test of the soft-RoCE harness: two RC QPs on the test device, over
// loopback, exchange messages both ways.
#define BOOST_TEST_MODULE ibev_softroce_loopback
#include <array>
#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tests/softroce/rdma_fixture.h"

using namespace ibev::testing;
using namespace std::chrono_literals;

BOOST_AUTO_TEST_CASE(rc_pair_exchanges_messages_both_ways) {
  ContextPtr context = open_device(test_device());
  PdPtr pd(ibv_alloc_pd(context.get()));
  BOOST_REQUIRE(pd);
  CqPtr cq(ibv_create_cq(context.get(), 16, nullptr, nullptr, 0));
  BOOST_REQUIRE(cq);

  ibv_qp_init_attr init{};
  init.send_cq = cq.get();
  init.recv_cq = cq.get();
  init.qp_type = IBV_QPT_RC;
  init.cap = {4, 4, 1, 1, 0};
  QpPtr a(ibv_create_qp(pd.get(), &init));
  QpPtr b(ibv_create_qp(pd.get(), &init));
  BOOST_REQUIRE(a && b);
  connect_rc_pair(a.get(), b.get());

  // Four 64-byte slots: a's send and receive, b's send and receive.
  std::array<char, 256> buffer{};
  MrPtr mr(ibv_reg_mr(pd.get(), buffer.data(), buffer.size(),
                      IBV_ACCESS_LOCAL_WRITE));
  BOOST_REQUIRE(mr);
  auto slot = [&](int i) { return buffer.data() + 64 * i; };
  auto sge = [&](int i) {
    return ibv_sge{reinterpret_cast<std::uintptr_t>(slot(i)), 64, mr->lkey};
  };

  for (auto [qp, index] : {std::pair{a.get(), 1}, std::pair{b.get(), 3}}) {
    ibv_sge s = sge(index);
    ibv_recv_wr wr{};
    wr.wr_id = static_cast<std::uint64_t>(index);
    wr.sg_list = &s;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    BOOST_REQUIRE_EQUAL(ibv_post_recv(qp, &wr, &bad), 0);
  }
  std::strcpy(slot(0), "ping from a");
  std::strcpy(slot(2), "pong from b");
  for (auto [qp, index] : {std::pair{a.get(), 0}, std::pair{b.get(), 2}}) {
    ibv_sge s = sge(index);
    ibv_send_wr wr{};
    wr.wr_id = static_cast<std::uint64_t>(index);
    wr.sg_list = &s;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    BOOST_REQUIRE_EQUAL(ibv_post_send(qp, &wr, &bad), 0);
  }

  const auto completions = poll_completions(cq.get(), 4, 10s);
  BOOST_REQUIRE_EQUAL(completions.size(), 4u);
  int sends = 0, receives = 0;
  for (const ibv_wc& wc : completions) {
    BOOST_TEST(wc.status == IBV_WC_SUCCESS, ibv_wc_status_str(wc.status));
    if (wc.opcode == IBV_WC_RECV) {
      ++receives;
      BOOST_TEST(wc.byte_len == 64u);
      BOOST_TEST(wc.qp_num == (wc.wr_id == 1 ? a->qp_num : b->qp_num));
    } else {
      BOOST_TEST(wc.opcode == IBV_WC_SEND);
      ++sends;
    }
  }
  BOOST_TEST(sends == 2);
  BOOST_TEST(receives == 2);
  BOOST_TEST(std::string(slot(1)) == "pong from b");
  BOOST_TEST(std::string(slot(3)) == "ping from a");
}

// The harness runs the test where it was asked to, with the environment the
// test was given (its BUILD env, Bazel's --test_env, sanitizer options).
BOOST_AUTO_TEST_CASE(the_tests_environment_reaches_it) {
  const char* probe = std::getenv("SOFTROCE_ENV_PROBE");
  BOOST_REQUIRE(probe != nullptr);
  BOOST_TEST(std::string(probe) == "spaces, 'quotes' and $dollars");
}
