// QueuePair::connect() against peers that pick their own PSN: endpoint()
// advertises the PSN connect() then sends with, so any peer that follows the
// RC exchange is heard: raw verbs here (rdma-core's ibv_rc_pingpong, in either
// role of its TCP exchange, in examples/pingpong's test). Messages go both
// ways. Where connect() may start, and what it refuses.
#define BOOST_TEST_MODULE ibev_softroce_connect

#include <array>
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <system_error>

#include "tests/softroce/rdma_fixture.h"
#include "tests/softroce/verbs_fixture.h"

namespace bdata = boost::unit_test::data;
using namespace ibev;
using namespace ibev::testing;
using namespace std::chrono_literals;

namespace {

// Two 64-byte slots per side (send, receive) in one registered buffer.
struct Buffers {
  explicit Buffers(const std::shared_ptr<ProtectionDomain>& pd)
      : mr(MemoryRegion::create(pd, bytes.data(), bytes.size(), IBV_ACCESS_LOCAL_WRITE)) {}
  char* slot(int i) { return bytes.data() + 64 * i; }
  std::array<char, 256> bytes{};
  std::shared_ptr<MemoryRegion> mr;
};

// One message from `from` (sending from slot `send`) to `to` (receiving into
// slot `receive`), each side's completion polled on its CQ; returns what
// arrived.
std::string send_one(ibv_qp* from, ibv_cq* from_cq, ibv_qp* to, ibv_cq* to_cq,
                     Buffers& buffers, int send, int receive, const std::string& text) {
  std::memset(buffers.slot(receive), 0, 64);
  std::snprintf(buffers.slot(send), 64, "%s", text.c_str());
  post_recv(to, *buffers.mr, buffers.slot(receive), 2);
  post_send(from, *buffers.mr, buffers.slot(send), 1);
  const auto sent = poll_completions(from_cq, 1, 10s);
  const auto received = poll_completions(to_cq, 1, 10s);
  BOOST_REQUIRE_MESSAGE(sent.size() == 1 && received.size() == 1,
                        "no completion for '" << text << "': the peer never heard it");
  BOOST_TEST(sent[0].status == IBV_WC_SUCCESS, ibv_wc_status_str(sent[0].status));
  BOOST_TEST(received[0].status == IBV_WC_SUCCESS, ibv_wc_status_str(received[0].status));
  return std::string(buffers.slot(receive));
}

ibv_qp_attr query(ibv_qp* qp) {
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  BOOST_REQUIRE(ibv_query_qp(qp, &attr, IBV_QP_SQ_PSN | IBV_QP_RQ_PSN, &init) == 0);
  return attr;
}

std::shared_ptr<QueuePair> rc_qp(Env& env, const std::shared_ptr<CompletionQueue>& cq,
                                 std::optional<std::uint32_t> psn) {
  QueuePair::Options options;
  options.send_cq = options.recv_cq = cq;
  options.psn = psn;
  return QueuePair::create(env.pd, nullptr, options);
}

ibv_qp_state state_of(const QueuePair& qp) {
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  BOOST_REQUIRE(ibv_query_qp(qp.get(), &attr, IBV_QP_STATE, &init) == 0);
  return attr.qp_state;
}

// -1: the default (random).
const int kPsns[] = {-1, 0, 1, 0xabcdef, 0xffffff};

}  // namespace

// On the old code every endpoint advertised PSN 0: a peer could not tell
// whether it was heard, and a QP reconnected with the same PSN could take a
// stale packet for a new one.
BOOST_AUTO_TEST_CASE(endpoints_advertise_random_psns) {
  Env env(test_device());
  auto cq = plain_cq(env.device);
  std::set<std::uint32_t> psns;
  for (int i = 0; i < 4; ++i) {
    QueuePair::Options options;
    options.send_cq = options.recv_cq = cq;
    auto qp = QueuePair::create(env.pd, nullptr, options);
    const std::uint32_t psn = qp->endpoint().psn();
    BOOST_TEST(psn <= 0xffffffu);
    psns.insert(psn);
  }
  // Four draws of 24 bits: all equal with probability 2^-72.
  BOOST_TEST(psns.size() > 1u);
}

BOOST_DATA_TEST_CASE(both_ends_send_from_the_psn_they_advertise, bdata::make(kPsns), psn) {
  Env env(test_device());
  auto cq_a = plain_cq(env.device);
  auto cq_b = plain_cq(env.device);
  const auto chosen = psn < 0 ? std::nullopt : std::optional<std::uint32_t>(psn);
  auto a = rc_qp(env, cq_a, chosen);
  auto b = rc_qp(env, cq_b, std::nullopt);
  BOOST_TEST(a->endpoint().psn() == a->psn());
  if (chosen) BOOST_TEST(a->psn() == *chosen);
  connect_rc_pair(*a, *b);
  BOOST_TEST(query(a->get()).sq_psn == a->psn());
  BOOST_TEST(query(a->get()).rq_psn == b->psn());
  BOOST_TEST(query(b->get()).sq_psn == b->psn());
  BOOST_TEST(query(b->get()).rq_psn == a->psn());

  Buffers buffers(env.pd);
  for (int round = 0; round < 3; ++round) {
    const std::string there = "a to b #" + std::to_string(round);
    const std::string back = "b to a #" + std::to_string(round);
    BOOST_TEST(send_one(a->get(), cq_a->get(), b->get(), cq_b->get(), buffers, 0, 1, there) ==
               there);
    BOOST_TEST(send_one(b->get(), cq_b->get(), a->get(), cq_a->get(), buffers, 2, 3, back) ==
               back);
  }
}

// A peer no ibev code touches, with a non-zero PSN of its own, as
// ibv_rc_pingpong picks one (lrand48() & 0xffffff).
BOOST_DATA_TEST_CASE(a_raw_verbs_peer_with_its_own_psn_is_heard_both_ways,
                     bdata::make({0x5a5a5a, 0xffffff, 1}), peer_psn) {
  Env env(test_device());
  auto cq = plain_cq(env.device);
  auto ours = rc_qp(env, cq, std::nullopt);

  CqPtr peer_cq(ibv_create_cq(env.device->context(), 16, nullptr, nullptr, 0));
  BOOST_REQUIRE(peer_cq);
  ibv_qp_init_attr init{};
  init.send_cq = init.recv_cq = peer_cq.get();
  init.qp_type = IBV_QPT_RC;
  init.cap = {4, 4, 1, 1, 0};
  QpPtr peer(ibv_create_qp(env.pd->get(), &init));
  BOOST_REQUIRE(peer);

  // The exchange: each side learns the other's QP number, GID and PSN.
  const RcEndpoint advertised = ours->endpoint();
  connect_rc(peer.get(), advertised.qp_num(), advertised.gid(), advertised.psn(),
             static_cast<std::uint32_t>(peer_psn));
  ours->connect(RcEndpoint{peer->qp_num, query_gid0(env.device->context()),
                           static_cast<std::uint32_t>(peer_psn)});

  Buffers buffers(env.pd);
  BOOST_TEST(send_one(ours->get(), cq->get(), peer.get(), peer_cq.get(), buffers, 0, 1,
                      "ibev to raw") == "ibev to raw");
  BOOST_TEST(send_one(peer.get(), peer_cq.get(), ours->get(), cq->get(), buffers, 2, 3,
                      "raw to ibev") == "raw to ibev");
}

BOOST_AUTO_TEST_CASE(connect_options_reach_the_qp) {
  Env env(test_device());
  auto cq = plain_cq(env.device);
  auto a = rc_qp(env, cq, std::nullopt);
  auto b = rc_qp(env, cq, std::nullopt);
  ConnectOptions options;
  options.path_mtu = IBV_MTU_256;
  options.timeout = 18;
  options.retry_cnt = 3;
  options.min_rnr_timer = 5;
  connect_rc_pair(*a, *b, options);
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  BOOST_REQUIRE(ibv_query_qp(a->get(), &attr,
                             IBV_QP_PATH_MTU | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                 IBV_QP_MIN_RNR_TIMER | IBV_QP_STATE,
                             &init) == 0);
  BOOST_TEST(attr.qp_state == IBV_QPS_RTS);
  BOOST_TEST(attr.path_mtu == IBV_MTU_256);
  BOOST_TEST(int(attr.timeout) == 18);
  BOOST_TEST(int(attr.retry_cnt) == 3);
  BOOST_TEST(int(attr.min_rnr_timer) == 5);
}

// Where connect() may start: RESET, or INIT with receives already posted,
// as ibv_rc_pingpong leaves its QP before the exchange (to_init(), or the
// application's own modify()). A receive posted in INIT takes the first
// message.
BOOST_DATA_TEST_CASE(connect_starts_from_reset_or_from_init_with_receives_posted,
                     bdata::make({"reset", "to_init", "modify"}), from) {
  Env env(test_device());
  auto cq_a = plain_cq(env.device);
  auto cq_b = plain_cq(env.device);
  auto a = rc_qp(env, cq_a, std::nullopt);
  auto b = rc_qp(env, cq_b, std::nullopt);
  Buffers buffers(env.pd);
  const std::string from_state = from;
  if (from_state == "to_init") {
    b->to_init();
  } else if (from_state == "modify") {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.port_num = 1;
    attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE;
    b->modify(attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  }
  if (from_state != "reset") {
    BOOST_TEST(state_of(*b) == IBV_QPS_INIT);
    post_recv(*b, *buffers.mr, buffers.slot(1), 2);
  }
  connect_rc_pair(*a, *b);
  BOOST_TEST(state_of(*a) == IBV_QPS_RTS);
  BOOST_TEST(state_of(*b) == IBV_QPS_RTS);
  if (from_state == "reset") post_recv(*b, *buffers.mr, buffers.slot(1), 2);

  std::snprintf(buffers.slot(0), 64, "from %s", from);
  post_send(*a, *buffers.mr, buffers.slot(0), 1);
  const auto sent = poll_completions(cq_a->get(), 1, 10s);
  const auto received = poll_completions(cq_b->get(), 1, 10s);
  BOOST_REQUIRE(sent.size() == 1u);
  BOOST_REQUIRE(received.size() == 1u);
  BOOST_TEST(sent[0].status == IBV_WC_SUCCESS, ibv_wc_status_str(sent[0].status));
  BOOST_TEST(received[0].status == IBV_WC_SUCCESS, ibv_wc_status_str(received[0].status));
  BOOST_TEST(received[0].wr_id == 2u);
  BOOST_TEST(std::string(buffers.slot(1)) == "from " + from_state);
}

// Any later state: the INIT step fails, says so, and leaves the QP as it was.
BOOST_AUTO_TEST_CASE(connect_on_a_connected_qp_fails_at_its_init_step) {
  Env env(test_device());
  auto cq = plain_cq(env.device);
  auto a = rc_qp(env, cq, std::nullopt);
  auto b = rc_qp(env, cq, std::nullopt);
  connect_rc_pair(*a, *b);
  BOOST_CHECK_EXCEPTION(a->connect(b->endpoint()), std::system_error,
                        [](const std::system_error& e) {
                          BOOST_TEST_MESSAGE(e.what());
                          return e.code().value() == EINVAL &&
                                 std::string(e.what()).find("ibv_modify_qp(INIT)") == 0;
                        });
  BOOST_TEST(state_of(*a) == IBV_QPS_RTS);
}

BOOST_AUTO_TEST_CASE(bad_psns_are_refused_with_a_clear_error) {
  Env env(test_device());
  auto cq = plain_cq(env.device);
  BOOST_CHECK_EXCEPTION(rc_qp(env, cq, 0x1000000u), std::invalid_argument,
                        [](const std::invalid_argument& e) {
                          return std::string(e.what()).find("24 bits") != std::string::npos;
                        });
  // An endpoint cannot carry one (tests/verbs/rc_endpoint_test.cc), nor be
  // edited to a PSN its QP does not send from.
  BOOST_CHECK_THROW(RcEndpoint(1, query_gid0(env.device->context()), 0x1000000u),
                    std::invalid_argument);
}
