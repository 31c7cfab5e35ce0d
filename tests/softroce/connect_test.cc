// QueuePair::connect() against peers that pick their own PSN: endpoint()
// advertises the PSN connect() then sends with, so any peer that follows the
// RC exchange is heard: raw verbs here, and rdma-core's ibv_rc_pingpong, in
// either role of its TCP exchange. Messages go both ways.
#define BOOST_TEST_MODULE ibev_softroce_connect
#include <arpa/inet.h>
#include <endian.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <future>
#include <thread>
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>
#include <cstdint>
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
    const std::uint32_t psn = qp->endpoint().psn;
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
  BOOST_TEST(a->endpoint().psn == a->psn());
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
  connect_rc(peer.get(), advertised.qp_num, advertised.gid, advertised.psn,
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

BOOST_AUTO_TEST_CASE(bad_psns_are_refused_with_a_clear_error) {
  Env env(test_device());
  auto cq = plain_cq(env.device);
  BOOST_CHECK_EXCEPTION(rc_qp(env, cq, 0x1000000u), std::invalid_argument,
                        [](const std::invalid_argument& e) {
                          return std::string(e.what()).find("24 bits") != std::string::npos;
                        });
  auto a = rc_qp(env, cq, std::nullopt);
  RcEndpoint remote = a->endpoint();
  remote.psn = 0x1000000u;
  BOOST_CHECK_THROW(a->connect(remote), std::invalid_argument);
}

// ---------------------------------------------------------- ibv_rc_pingpong

namespace {

// The exchange of ibv_rc_pingpong (rdma-core libibverbs/examples): each side
// sends "LID:QPN:PSN:GID" (hex; the GID as four big-endian 32-bit words) as a
// fixed-size string with its NUL; the client then writes "done".
constexpr std::size_t kWireSize = sizeof "0000:000000:000000:00000000000000000000000000000000";
constexpr int kPingpongPort = 18515;
constexpr int kIters = 20;
constexpr int kSize = 64;

std::array<char, kWireSize> to_wire(const RcEndpoint& e) {
  std::uint32_t words[4];
  std::memcpy(words, e.gid.raw, sizeof words);
  std::array<char, kWireSize> wire{};
  std::snprintf(wire.data(), wire.size(), "%04x:%06x:%06x:%08x%08x%08x%08x", e.lid, e.qp_num,
                e.psn, htobe32(words[0]), htobe32(words[1]), htobe32(words[2]),
                htobe32(words[3]));
  return wire;
}

RcEndpoint from_wire(const std::array<char, kWireSize>& wire) {
  unsigned lid = 0, qpn = 0, psn = 0;
  char gid[33] = {};
  BOOST_REQUIRE(std::sscanf(wire.data(), "%x:%x:%x:%32s", &lid, &qpn, &psn, gid) == 4);
  RcEndpoint e{qpn, {}, psn, static_cast<std::uint16_t>(lid)};
  std::uint32_t words[4];
  for (int i = 0; i < 4; ++i) {
    const std::string word(gid + 8 * i, 8);
    words[i] = be32toh(static_cast<std::uint32_t>(std::stoul(word, nullptr, 16)));
  }
  std::memcpy(e.gid.raw, words, sizeof words);
  return e;
}

bool write_all(int fd, const void* data, std::size_t size) {
  return ::write(fd, data, size) == static_cast<ssize_t>(size);
}

bool read_all(int fd, void* data, std::size_t size) {
  auto* at = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::read(fd, at, size);
    if (n <= 0) return false;
    at += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

struct Fd {
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  int fd;
};

// ibev's side of the ping-pong, run from the CQ's completion handler on the
// dispatcher thread: send after the last send completed and a message came
// (ibv_rc_pingpong's rule), until kIters each way.
struct Pingpong {
  std::shared_ptr<QueuePair> qp;
  std::shared_ptr<MemoryRegion> mr;
  std::array<char, 2 * kSize> buffer{};
  std::atomic<int> sent{0}, received{0}, errors{0};
  std::atomic<bool> send_done{true}, message_in{false};
  std::promise<void> finished;

  void post_receive() {
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(buffer.data() + kSize), kSize, mr->lkey()};
    ibv_recv_wr wr{};
    wr.wr_id = 2;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    try {
      qp->post_recv(wr);  // ibev's post: TSan sees the edge to the handler
    } catch (const std::system_error&) {
      ++errors;
    }
  }
  void post_send() {
    // Before the post: its completion may be handled before ibv_post_send returns.
    send_done = false;
    message_in = false;
    ++sent;
    std::snprintf(buffer.data(), kSize, "ibev ping %d", sent.load());
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(buffer.data()), kSize, mr->lkey()};
    ibv_send_wr wr{};
    wr.wr_id = 1;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    try {
      qp->post_send(wr);
    } catch (const std::system_error&) {
      ++errors;
    }
  }
  void on_completions(const CompletionBatch& batch) {
    for (const ibv_wc& wc : batch) {
      if (wc.status != IBV_WC_SUCCESS) {
        ++errors;
        continue;
      }
      if (wc.wr_id == 1) send_done = true;
      if (wc.wr_id == 2) {
        message_in = true;
        ++received;
        post_receive();
      }
    }
    if (sent < kIters && send_done && message_in) post_send();
    if (sent == kIters && received == kIters && send_done) finished.set_value();
  }
};

enum class Role { kClient, kServer };
std::ostream& operator<<(std::ostream& out, Role r) {
  return out << (r == Role::kClient ? "ibev_as_client" : "ibev_as_server");
}

}  // namespace

BOOST_DATA_TEST_CASE(interoperates_with_ibv_rc_pingpong,
                     bdata::make({Role::kClient, Role::kServer}), role) {
  Env env(test_device());
  Pingpong pp;
  auto cq = CompletionQueue::create(
      env.device, [&](const CompletionBatch& batch) { pp.on_completions(batch); }, nullptr);
  pp.qp = rc_qp(env, cq, std::nullopt);
  pp.mr = MemoryRegion::create(env.pd, pp.buffer.data(), pp.buffer.size(),
                               IBV_ACCESS_LOCAL_WRITE);
  const RcEndpoint ours = pp.qp->endpoint();
  BOOST_TEST_MESSAGE("ibev advertises PSN " << ours.psn);

  const std::string tmp = env_or("TEST_TMPDIR", "/tmp");
  const std::string common = "stdbuf -oL ibv_rc_pingpong -d " + test_device() + " -g 0 -p " +
                             std::to_string(kPingpongPort) + " -n " +
                             std::to_string(kIters) + " -s " + std::to_string(kSize);
  RcEndpoint theirs{};
  if (role == Role::kClient) {
    Spawned peer(common, tmp + "/rc_pingpong_server.out");
    Fd sock(::socket(AF_INET, SOCK_STREAM, 0));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(kPingpongPort);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool connected = false;
    for (int attempt = 0; attempt < 200 && !connected; ++attempt) {
      connected = ::connect(sock.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
      if (!connected) std::this_thread::sleep_for(50ms);
    }
    BOOST_REQUIRE_MESSAGE(connected, "ibv_rc_pingpong never listened: " << peer.text());
    std::array<char, kWireSize> wire = to_wire(ours);
    BOOST_REQUIRE(write_all(sock.fd, wire.data(), wire.size()));
    BOOST_REQUIRE(read_all(sock.fd, wire.data(), wire.size()));
    theirs = from_wire(wire);
    pp.qp->connect(theirs);
    for (int i = 0; i < 16; ++i) pp.post_receive();  // a QP takes them from INIT on
    BOOST_REQUIRE(write_all(sock.fd, "done", sizeof "done"));
    pp.post_send();  // the client sends first
    BOOST_TEST((pp.finished.get_future().wait_for(30s) == std::future_status::ready),
               "ibev sent " << pp.sent << ", received " << pp.received << "; peer: "
                            << peer.text());
    BOOST_TEST(peer.wait_for_text(std::to_string(kIters) + " iters in", 20s), peer.text());
  } else {
    Fd listener(::socket(AF_INET, SOCK_STREAM, 0));
    const int yes = 1;
    ::setsockopt(listener.fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(kPingpongPort);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    BOOST_REQUIRE(::bind(listener.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    BOOST_REQUIRE(::listen(listener.fd, 1) == 0);
    Spawned peer(common + " 127.0.0.1", tmp + "/rc_pingpong_client.out");
    Fd sock(::accept(listener.fd, nullptr, nullptr));
    BOOST_REQUIRE(sock.fd >= 0);
    std::array<char, kWireSize> wire{};
    BOOST_REQUIRE(read_all(sock.fd, wire.data(), wire.size()));
    theirs = from_wire(wire);
    pp.qp->connect(theirs);  // in RTR before the client may send
    for (int i = 0; i < 16; ++i) pp.post_receive();
    wire = to_wire(ours);
    BOOST_REQUIRE(write_all(sock.fd, wire.data(), wire.size()));
    char done[sizeof "done"] = {};
    BOOST_REQUIRE(read_all(sock.fd, done, sizeof done));
    BOOST_TEST(std::string(done) == "done");
    BOOST_TEST((pp.finished.get_future().wait_for(30s) == std::future_status::ready),
               "ibev sent " << pp.sent << ", received " << pp.received << "; peer: "
                            << peer.text());
    BOOST_TEST(peer.wait_for_text(std::to_string(kIters) + " iters in", 20s), peer.text());
  }
  // ibv_rc_pingpong chose its own PSN (lrand48() & 0xffffff), as did ibev.
  BOOST_TEST_MESSAGE("ibv_rc_pingpong advertised PSN " << theirs.psn);
  BOOST_TEST(pp.errors == 0);
  BOOST_TEST(pp.sent == kIters);
  BOOST_TEST(pp.received == kIters);
  env.dispatcher.stop();
}
