// One health signal per RC connection (verbs/connection_health.h), on
// soft-RoCE: the QP's injected fatal events, a real error completion with the
// flushes after it, and the port going down are one transition each, with
// their first cause; coming up is the application's; the keepalive's probes
// are answered unseen, and a vanished peer is noticed while idle; bad input
// is refused; a closed health, or one whose QP is closed, hears nothing.
#define BOOST_TEST_MODULE ibev_softroce_connection_health
#include <ibev/verbs/connection_health.h>

#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "tests/softroce/rdma_fixture.h"
#include "tests/softroce/verbs_fixture.h"
#include "tests/support/testing.h"

using namespace ibev;
using namespace ibev::testing;
using namespace std::chrono_literals;
namespace bdata = boost::unit_test::data;

namespace {

// Every change a ConnectionHealth tells, in order.
class Changes {
 public:
  HealthHandler handler() {
    return [this](const HealthChange& change) {
      std::lock_guard<std::mutex> lock(mutex_);
      changes_.push_back(change);
    };
  }
  std::vector<HealthChange> all() {
    std::lock_guard<std::mutex> lock(mutex_);
    return changes_;
  }

 private:
  std::mutex mutex_;
  std::vector<HealthChange> changes_;
};

// Everything the Dispatcher was given before this has run: a health posts
// its change before its causes() shows the cause, so after waiting for the
// causes, this waits for the changes too.
void settle(Dispatcher& dispatcher) {
  std::atomic<bool> ran{false};
  dispatcher.post([&ran] { ran = true; });
  BOOST_REQUIRE(eventually([&ran] { return ran.load(); }));
}

// Milliseconds from `then` to now: how long noticing took.
long long ms_since(std::chrono::steady_clock::time_point then) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now() - then)
      .count();
}

// Two RC QPs on the test device connected to each other, on one CQ whose
// completions go to `on_completion`.
struct Pair {
  Pair(Env& env, CompletionHandler on_completion, Handler on_a_event = {},
       const ConnectOptions& connect = {})
      : cq(CompletionQueue::create(env.device, std::move(on_completion), {})) {
    QueuePairOptions options;
    options.send_cq = cq;
    options.recv_cq = cq;
    a = QueuePair::create(env.pd, std::move(on_a_event), options);
    b = QueuePair::create(env.pd, {}, options);
    connect_rc_pair(*a, *b, connect);
  }
  std::shared_ptr<CompletionQueue> cq;
  std::shared_ptr<QueuePair> a;
  std::shared_ptr<QueuePair> b;
};

// An RDMA write into a region the peer did not open for remote writes: the
// responder NAKs it, and it completes with REMOTE_ACCESS_ERR.
struct RefusedWrite {
  RefusedWrite(Env& env, std::uint64_t wr_id)
      : mr(MemoryRegion::create(env.pd, memory.data(), memory.size(), IBV_ACCESS_LOCAL_WRITE)),
        sge{reinterpret_cast<std::uintptr_t>(memory.data()), 64, mr->lkey()} {
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = reinterpret_cast<std::uintptr_t>(memory.data() + 1024);
    wr.wr.rdma.rkey = mr->rkey();  // valid, but not for remote writes
  }
  std::vector<char> memory = std::vector<char>(4096);
  std::shared_ptr<MemoryRegion> mr;
  ibv_sge sge;
  ibv_send_wr wr{};
};

}  // namespace

BOOST_AUTO_TEST_SUITE(connection_health)

// QP_FATAL by number (as a DevX source would send it), then QP_REQ_ERR by
// address: one change, the first cause; both kept; the QP's own handler
// hears both as before.
BOOST_AUTO_TEST_CASE(two_qp_events_are_one_transition_with_the_first_cause) {
  Env env{test_device()};
  std::atomic<int> qp_heard{0};
  Pair pair(env, [](const CompletionBatch&) {}, [&qp_heard](const Event&) { ++qp_heard; });
  Changes changes;
  auto health = ConnectionHealth::create(pair.a, changes.handler());
  BOOST_TEST(health->state() == ConnectionState::kUp);

  env.dispatcher.inject(env.device->context(), IBV_EVENT_QP_FATAL,
                        ObjectNumber{ElementKind::kQp, pair.a->qp_num()});
  env.dispatcher.inject(env.device->context(), IBV_EVENT_QP_REQ_ERR, pair.a->get());
  BOOST_REQUIRE(eventually([&] { return health->causes().size() == 2u; }));
  settle(env.dispatcher);

  const auto all = changes.all();
  BOOST_REQUIRE_EQUAL(all.size(), 1u);
  BOOST_TEST(all[0].from == ConnectionState::kUp);
  BOOST_TEST(all[0].to == ConnectionState::kDown);
  BOOST_TEST((all[0].cause.source == HealthSource::kAsyncEvent));
  BOOST_TEST(all[0].cause.code == IBV_EVENT_QP_FATAL);
  BOOST_TEST(health->causes()[1].code == IBV_EVENT_QP_REQ_ERR);
  BOOST_TEST(qp_heard.load() == 2);
  BOOST_TEST(env.errors().empty(), env.failures.summary());
}

namespace {
struct Injected {
  ibv_event_type code;
  bool is_cause;
  friend std::ostream& operator<<(std::ostream& out, const Injected& i) {
    return out << ibv_event_type_str(i.code);
  }
};
// What the health hears by itself, and what it hears but is no cause.
const Injected kInjected[] = {
    {IBV_EVENT_QP_FATAL, true},      {IBV_EVENT_QP_REQ_ERR, true},
    {IBV_EVENT_QP_ACCESS_ERR, true}, {IBV_EVENT_PATH_MIG_ERR, true},
    {IBV_EVENT_PORT_ERR, true},      {IBV_EVENT_DEVICE_FATAL, true},
    {IBV_EVENT_COMM_EST, false},     {IBV_EVENT_SQ_DRAINED, false},
    {IBV_EVENT_PATH_MIG, false},     {IBV_EVENT_PORT_ACTIVE, false},
    {IBV_EVENT_LID_CHANGE, false},
};
}  // namespace

// Each event injected as it would come (a QP's naming the QP, a port's its
// port, DEVICE_FATAL the device; an injected DEVICE_FATAL is no loss): a
// cause takes the connection down, anything else leaves it up. A QP event
// injected after it reaches the QP's own handler, so everything before it
// was heard.
BOOST_DATA_TEST_CASE(each_event_the_health_hears_is_a_cause_or_not, bdata::make(kInjected),
                     injected) {
  Env env{test_device()};
  std::atomic<int> qp_heard{0};
  Pair pair(env, [](const CompletionBatch&) {}, [&qp_heard](const Event&) { ++qp_heard; });
  Changes changes;
  auto health = ConnectionHealth::create(pair.a, changes.handler());
  ibv_context* device = env.device->context();
  switch (element_of(injected.code)) {
    case ElementKind::kQp:
      env.dispatcher.inject(device, injected.code, pair.a->get());
      break;
    case ElementKind::kPort:
      env.dispatcher.inject(device, injected.code, Port{1});
      break;
    default:
      env.dispatcher.inject(device, injected.code, WholeDevice{});
      break;
  }
  env.dispatcher.inject(device, IBV_EVENT_COMM_EST, pair.a->get());
  const int expected = element_of(injected.code) == ElementKind::kQp ? 2 : 1;
  BOOST_REQUIRE(eventually([&] { return qp_heard.load() == expected; }));
  settle(env.dispatcher);
  BOOST_TEST(changes.all().size() == (injected.is_cause ? 1u : 0u));
  BOOST_TEST(health->state() ==
             (injected.is_cause ? ConnectionState::kDown : ConnectionState::kUp));
  if (injected.is_cause) BOOST_TEST(changes.all()[0].cause.code == injected.code);
}

// An RDMA write into a region the peer did not open for remote writes: the
// responder NAKs, the write completes with REMOTE_ACCESS_ERR, the QP goes to
// ERR and the two sends posted after it are flushed. The application hands
// every completion over; the health goes down once, for the write.
BOOST_AUTO_TEST_CASE(an_error_completion_is_a_cause_and_its_flushes_are_not) {
  Env env{test_device()};
  std::mutex mutex;
  std::shared_ptr<ConnectionHealth> health;  // set before anything is posted
  std::vector<ibv_wc_status> statuses;
  Pair pair(env, [&](const CompletionBatch& batch) {
    std::lock_guard<std::mutex> lock(mutex);
    for (const ibv_wc& wc : batch) {
      statuses.push_back(wc.status);
      health->completion(wc);
    }
  });
  Changes changes;
  {
    std::lock_guard<std::mutex> lock(mutex);
    health = ConnectionHealth::create(pair.a, changes.handler());
  }

  RefusedWrite refused(env, 1);
  pair.a->post_send(refused.wr);
  post_send(*pair.a, *refused.mr, refused.memory.data() + 128, 2);
  post_send(*pair.a, *refused.mr, refused.memory.data() + 192, 3);

  BOOST_REQUIRE(eventually([&] {
    std::lock_guard<std::mutex> lock(mutex);
    return statuses.size() == 3u;
  }));
  settle(env.dispatcher);
  {
    std::lock_guard<std::mutex> lock(mutex);
    BOOST_TEST(statuses[0] == IBV_WC_REM_ACCESS_ERR);
    BOOST_TEST(statuses[1] == IBV_WC_WR_FLUSH_ERR);
    BOOST_TEST(statuses[2] == IBV_WC_WR_FLUSH_ERR);
  }
  const auto all = changes.all();
  BOOST_REQUIRE_EQUAL(all.size(), 1u);
  BOOST_TEST(all[0].to == ConnectionState::kDown);
  BOOST_TEST((all[0].cause.source == HealthSource::kCompletion));
  BOOST_TEST(all[0].cause.code == IBV_WC_REM_ACCESS_ERR);
  BOOST_TEST(all[0].cause.wr_id == 1u);
  BOOST_TEST(health->causes().size() == 1u);
}

// The port goes down (PORT_ERR): down. It comes back (PORT_ACTIVE): still
// down, as the QP is in ERR; the application's recovering() and up() bring
// it up, with what it recovered from.
BOOST_AUTO_TEST_CASE(the_port_going_down_is_a_cause_and_coming_back_is_not_up) {
  Env env{test_device()};
  Pair pair(env, [](const CompletionBatch&) {});
  Changes changes;
  auto health = ConnectionHealth::create(pair.a, changes.handler());
  std::atomic<bool> active{false};
  Handle listener = env.device->on_event(EventFilter{IBV_EVENT_PORT_ACTIVE},
                                         [&active](const Event&) { active = true; });

  run_command("ip link set " + test_netdev() + " down");
  BOOST_REQUIRE(eventually([&] { return health->state() == ConnectionState::kDown; }));
  run_command("ip link set " + test_netdev() + " up");
  BOOST_REQUIRE(eventually([&] { return active.load(); }));
  settle(env.dispatcher);
  BOOST_TEST(health->state() == ConnectionState::kDown);

  health->recovering();
  health->up();
  settle(env.dispatcher);
  const auto all = changes.all();
  BOOST_REQUIRE_EQUAL(all.size(), 3u);
  BOOST_TEST(all[0].to == ConnectionState::kDown);
  BOOST_TEST(all[0].cause.code == IBV_EVENT_PORT_ERR);
  BOOST_TEST(all[1].to == ConnectionState::kRecovering);
  BOOST_TEST(all[2].from == ConnectionState::kRecovering);
  BOOST_TEST(all[2].to == ConnectionState::kUp);
  BOOST_TEST(all[2].cause.code == IBV_EVENT_PORT_ERR);  // what it recovered from
}

ConnectionHealth::Options with_keepalive(std::chrono::milliseconds interval, unsigned misses) {
  ConnectionHealth::Options options;
  options.keepalive.interval = interval;
  options.keepalive.misses = misses;
  return options;
}

// An idle connection with a keepalive stays up: its probes are answered,
// interval after interval, and taken by ibev (the CQ's handler sees none).
BOOST_AUTO_TEST_CASE(an_idle_connection_s_probes_are_answered_and_never_seen) {
  Env env{test_device()};
  std::atomic<int> seen{0};
  Pair pair(env, [&seen](const CompletionBatch& batch) {
    seen += static_cast<int>(batch.size);
  });
  Changes changes;
  auto health = ConnectionHealth::create(pair.a, changes.handler(), with_keepalive(100ms, 3));
  BOOST_REQUIRE(eventually([&] { return health->keepalive_stats().answered >= 5u; }));
  BOOST_TEST(health->state() == ConnectionState::kUp);
  BOOST_TEST(pair.cq->completion_stats().markers >= 5u);
  BOOST_TEST(seen.load() == 0);
  BOOST_TEST(changes.all().empty());
  BOOST_TEST(env.errors().empty(), env.failures.summary());
}

// A probe out when the health closes is still taken: its peer gone, a probe
// is certainly out (sent, never answered); the health closes; then the QP
// goes to ERR, which flushes the probe. The flush is taken by ibev, and the
// CQ's handler, which would crash on a wr_id it never posted, sees nothing.
BOOST_AUTO_TEST_CASE(a_probe_out_at_close_never_reaches_the_cq_s_handler) {
  Env env{test_device()};
  std::atomic<int> seen{0};
  ConnectOptions slow;
  slow.timeout = 18;  // about 1 s a try: the probe's own retries outlast the test
  Pair pair(env, [&seen](const CompletionBatch& batch) {
    seen += static_cast<int>(batch.size);
  }, {}, slow);
  Changes changes;
  auto health = ConnectionHealth::create(pair.a, changes.handler(), with_keepalive(100ms, 50));
  BOOST_REQUIRE(eventually([&] { return health->keepalive_stats().answered >= 1u; }));
  pair.b->close();
  BOOST_REQUIRE(eventually([&] {
    const KeepaliveStats stats = health->keepalive_stats();
    return stats.sent > stats.answered;
  }));
  const auto taken = pair.cq->completion_stats().markers;
  health->close();
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  pair.a->modify(attr, IBV_QP_STATE);
  BOOST_REQUIRE(eventually([&] { return pair.cq->completion_stats().markers == taken + 1; }));
  settle(env.dispatcher);
  BOOST_TEST(seen.load() == 0);
  BOOST_TEST(changes.all().empty());
}

// The peer's QP goes (its process died, say) while nothing flows: rxe drops
// what reaches a QP that is not there, so the probe goes unanswered, and
// `misses` intervals after the peer was last heard the connection is down
// for the keepalive; not much sooner, and long before the transport's own
// retries (1 s a try, 7 retries) would give up. The peer goes just after a
// probe was answered, the phase that takes longest to notice: timed from
// the unanswered probe's post (an interval later), it took misses + 1
// intervals.
BOOST_AUTO_TEST_CASE(a_vanished_peer_is_noticed_by_the_keepalive_within_misses_intervals) {
  constexpr auto kInterval = 500ms;
  constexpr unsigned kMisses = 3;
  Env env{test_device()};
  auto cq = CompletionQueue::create(env.device, [](const CompletionBatch&) {}, {});
  QueuePairOptions qp_options;
  qp_options.send_cq = cq;
  qp_options.recv_cq = cq;
  auto a = QueuePair::create(env.pd, {}, qp_options);
  auto b = QueuePair::create(env.pd, {}, qp_options);
  ConnectOptions slow;
  slow.timeout = 18;  // 4.096 us << 18: about 1 s a try
  connect_rc_pair(*a, *b, slow);
  Changes changes;
  auto health = ConnectionHealth::create(a, changes.handler(), with_keepalive(kInterval, kMisses));
  BOOST_REQUIRE(eventually([&] { return health->keepalive_stats().answered >= 1u; }));

  const auto answered = health->keepalive_stats().answered;
  BOOST_REQUIRE(eventually([&] { return health->keepalive_stats().answered > answered; }, 5s,
                           1ms));
  const auto gone = std::chrono::steady_clock::now();
  b->close();
  BOOST_REQUIRE(eventually([&] { return health->state() == ConnectionState::kDown; }, 10s, 1ms));
  const auto noticed = ms_since(gone);
  settle(env.dispatcher);
  const auto all = changes.all();
  BOOST_REQUIRE_EQUAL(all.size(), 1u);
  BOOST_TEST((all[0].cause.source == HealthSource::kKeepalive), all[0].cause.what);
  BOOST_TEST(all[0].cause.code == 0);
  BOOST_TEST_MESSAGE("a peer gone just after an answer noticed in " << noticed << " ms");
  BOOST_TEST(noticed >= (kMisses - 1) * kInterval.count());
  // Timer slack (the keepalive allows itself half an interval) and the
  // test's own polling: below the misses + 1 intervals (2000 ms) it took
  // timed from the unanswered probe's post.
  BOOST_TEST(noticed <= kMisses * kInterval.count() + 300);
}

BOOST_AUTO_TEST_CASE(bad_input_is_refused_and_a_closed_health_hears_nothing) {
  Env env{test_device()};
  std::atomic<int> qp_heard{0};
  Pair pair(env, [](const CompletionBatch&) {}, [&qp_heard](const Event&) { ++qp_heard; });
  Changes changes;
  const auto create = [&](std::shared_ptr<QueuePair> qp, HealthHandler handler, int port) {
    ConnectionHealth::Options options;
    options.port = static_cast<std::uint8_t>(port);
    return ConnectionHealth::create(std::move(qp), std::move(handler), options);
  };
  expect_throw<std::invalid_argument>([&] { create(nullptr, changes.handler(), 1); },
                                      "ConnectionHealth::create: the QP is null");
  expect_throw<std::invalid_argument>([&] { create(pair.a, {}, 1); }, "the handler is empty");
  expect_throw<std::invalid_argument>([&] { create(pair.a, changes.handler(), 0); },
                                      "port 0 is not a port of");
  expect_throw<std::invalid_argument>([&] { create(pair.a, changes.handler(), 2); },
                                      "port 2 is not a port of");
  expect_throw<std::invalid_argument>(
      [&] { ConnectionHealth::create(pair.a, changes.handler(), with_keepalive(-1ms, 3)); },
      "a keepalive needs");
  expect_throw<std::invalid_argument>(
      [&] { ConnectionHealth::create(pair.a, changes.handler(), with_keepalive(100ms, 0)); },
      "a keepalive needs");
  {
    auto polled = CompletionQueue::create_polled(env.device, {});
    QueuePairOptions options;
    options.send_cq = polled;
    options.recv_cq = polled;
    auto on_polled = QueuePair::create(env.pd, {}, options);
    expect_throw<std::invalid_argument>(
        [&] { ConnectionHealth::create(on_polled, changes.handler(), with_keepalive(100ms, 3)); },
        "no Dispatcher serves (kPolled)");
    options.type = IBV_QPT_UD;
    auto ud = QueuePair::create(env.pd, {}, options);
    expect_throw<std::invalid_argument>([&] { create(ud, changes.handler(), 1); },
                                        "a connection is an RC QP");
  }

  auto health = create(pair.a, changes.handler(), 1);
  health->close();
  health->close();  // again: nothing
  env.dispatcher.inject(env.device->context(), IBV_EVENT_QP_FATAL, pair.a->get());
  BOOST_REQUIRE(eventually([&] { return qp_heard.load() == 1; }));
  settle(env.dispatcher);
  BOOST_TEST(changes.all().empty());
  BOOST_TEST(health->causes().empty());

  // Its QP closed, the health hears nothing by the QP's number (a newer
  // QP's now, as far as anyone knows).
  auto on_b = create(pair.b, changes.handler(), 1);
  const std::uint32_t b_num = pair.b->qp_num();
  pair.b->close();
  env.dispatcher.inject(env.device->context(), IBV_EVENT_QP_FATAL,
                        ObjectNumber{ElementKind::kQp, b_num});
  env.dispatcher.inject(env.device->context(), IBV_EVENT_QP_FATAL, pair.a->get());
  BOOST_REQUIRE(eventually([&] { return qp_heard.load() == 2; }));
  settle(env.dispatcher);
  BOOST_TEST(changes.all().empty());
  BOOST_TEST(on_b->causes().empty());
  expect_throw<std::invalid_argument>([&] { create(pair.b, changes.handler(), 1); },
                                      "the QP is closed");
}

// --- Deadlines and recovery ---

namespace {

// A pair whose CQ hands every completion to the health, as an application
// with deadlines or recovery must, and keeps them.
struct Forwarding {
  explicit Forwarding(Env& env, const ConnectOptions& connect = {})
      : pair(env, [this](const CompletionBatch& batch) {
          std::lock_guard<std::mutex> lock(mutex);
          for (const ibv_wc& wc : batch) {
            seen.push_back(wc);
            if (health) health->completion(wc);
          }
        }, {}, connect) {}

  void watch(std::shared_ptr<ConnectionHealth> made) {
    std::lock_guard<std::mutex> lock(mutex);
    health = std::move(made);
  }
  // Whether wr_id's completion came, with `status`.
  bool came(std::uint64_t wr_id, ibv_wc_status status = IBV_WC_SUCCESS) {
    std::lock_guard<std::mutex> lock(mutex);
    for (const ibv_wc& wc : seen) {
      if (wc.wr_id == wr_id && wc.status == status) return true;
    }
    return false;
  }
  // A zero-length RDMA write, signaled, through the health.
  void write(std::uint64_t wr_id) {
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    health_now()->post_send(wr);
  }
  std::shared_ptr<ConnectionHealth> health_now() {
    std::lock_guard<std::mutex> lock(mutex);
    return health;
  }

  std::mutex mutex;
  std::vector<ibv_wc> seen;
  std::shared_ptr<ConnectionHealth> health;
  Pair pair;
};

// The peer's half of a reconnection in place: b reset and connected to the
// attempt's new endpoint, then the attempt to b's.
void reconnect_in_place(QueuePair& b, const RecoveryAttempt& attempt) {
  b.reset();
  b.connect(attempt.local());
  attempt.connect(b.endpoint());
}

// Recovery that tries 10 ms after a down, without jitter, and notes each
// attempt before handing it to `reconnect`.
struct Attempts {
  std::mutex mutex;
  std::vector<unsigned> numbers;
  std::vector<HealthCause> causes;
  std::vector<std::vector<std::uint64_t>> undelivered;
  std::size_t count() {
    std::lock_guard<std::mutex> lock(mutex);
    return numbers.size();
  }
};

ConnectionHealth::Options recovering(Attempts& attempts,
                                     std::function<void(const RecoveryAttempt&)> reconnect);

// Recovery whose reconnect resets the peer `b` and joins the two again.
ConnectionHealth::Options recovering_in_place(Attempts& attempts, std::shared_ptr<QueuePair> b) {
  return recovering(attempts, [b](const RecoveryAttempt& attempt) { reconnect_in_place(*b, attempt); });
}

ConnectionHealth::Options recovering(Attempts& attempts,
                                     std::function<void(const RecoveryAttempt&)> reconnect) {
  ConnectionHealth::Options options;
  options.recovery.policy.first_delay = 10ms;
  options.recovery.policy.max_delay = 100ms;
  options.recovery.policy.jitter = 0.0;
  options.recovery.policy.window = 60s;  // a storm under TCG and TSan stays inside it
  options.recovery.reconnect = [&attempts, reconnect](const RecoveryAttempt& attempt) {
    {
      std::lock_guard<std::mutex> lock(attempts.mutex);
      attempts.numbers.push_back(attempt.number());
      attempts.causes.push_back(attempt.cause());
      attempts.undelivered.push_back(attempt.undelivered());
    }
    reconnect(attempt);
  };
  return options;
}

std::vector<ConnectionState> states(const std::vector<HealthChange>& changes) {
  std::vector<ConnectionState> to;
  for (const HealthChange& change : changes) to.push_back(change.to);
  return to;
}

std::size_t failures_of_kind(Env& env, const std::string& kind) {
  std::size_t n = 0;
  for (const std::string& line : env.errors()) n += line.rfind(kind, 0) == 0 ? 1 : 0;
  return n;
}

using S = ConnectionState;

// A connection on the test device that recovers in place against its
// loopback peer, its completions handed to its health.
struct InPlace {
  InPlace() {
    link.watch(ConnectionHealth::create(link.pair.a, changes.handler(),
                                        recovering_in_place(attempts, link.pair.b)));
  }
  Env env{test_device()};
  Changes changes;
  Attempts attempts;
  Forwarding link{env};
};

}  // namespace

// A request posted through the health that completes is retired; one that
// cannot complete (its peer's QP gone, the transport retrying for about
// 8 s) takes the connection down for its deadline, naming it, long before
// the transport would give up.
BOOST_AUTO_TEST_CASE(a_request_past_its_deadline_takes_the_connection_down) {
  Env env{test_device()};
  ConnectOptions slow;
  slow.timeout = 18;  // about 1 s a try
  Changes changes;
  Forwarding link(env, slow);
  ConnectionHealth::Options options;
  options.deadline = 300ms;
  link.watch(ConnectionHealth::create(link.pair.a, changes.handler(), options));
  link.write(1);
  BOOST_REQUIRE(eventually([&] { return link.came(1); }));
  // A retired request is no cause.
  BOOST_TEST(stays_false_for([&] { return link.health->state() != S::kUp; }, 700ms,
                             "a request not retired takes it down at its 300 ms deadline: "
                             "700 ms is past two"));
  BOOST_TEST(link.health->state() == S::kUp);

  link.pair.b->close();
  const auto posted = std::chrono::steady_clock::now();
  link.write(2);
  BOOST_REQUIRE(eventually([&] { return link.health->state() == S::kDown; }));
  const auto noticed = ms_since(posted);
  settle(env.dispatcher);
  const auto all = changes.all();
  BOOST_REQUIRE_EQUAL(all.size(), 1u);
  BOOST_TEST((all[0].cause.source == HealthSource::kDeadline), all[0].cause.what);
  BOOST_TEST(all[0].cause.wr_id == 2u);
  BOOST_TEST(noticed >= 300);
  BOOST_TEST(noticed < 4000);  // the transport: 8 tries of about 1 s
}

// An injected QP_FATAL (as a provider that raises it would): one down, then
// ibev drains and resets the QP, the application's reconnect joins it to
// its peer again, and the connection is up and carries traffic: the
// handler hears down, recovering, up, each once.
BOOST_FIXTURE_TEST_CASE(a_qp_fatal_is_recovered_in_place_and_traffic_resumes, InPlace) {
  const std::uint32_t psn_before = link.pair.a->psn();
  link.write(1);
  BOOST_REQUIRE(eventually([&] { return link.came(1); }));

  env.dispatcher.inject(env.device->context(), IBV_EVENT_QP_FATAL, link.pair.a->get());
  BOOST_REQUIRE(eventually([&] { return changes.all().size() == 3u; }));
  BOOST_TEST(link.health->state() == S::kUp);
  link.write(2);
  BOOST_REQUIRE(eventually([&] { return link.came(2); }));

  const auto all = changes.all();
  const std::vector<S> expected{S::kDown, S::kRecovering, S::kUp};
  BOOST_TEST(states(all) == expected, boost::test_tools::per_element());
  BOOST_TEST(all[0].cause.code == IBV_EVENT_QP_FATAL);
  BOOST_TEST(all[2].cause.code == IBV_EVENT_QP_FATAL);  // what it recovered from
  BOOST_REQUIRE_EQUAL(attempts.count(), 1u);
  BOOST_TEST(attempts.numbers[0] == 1u);
  BOOST_TEST(attempts.causes[0].code == IBV_EVENT_QP_FATAL);
  BOOST_TEST(attempts.undelivered[0].empty());
  BOOST_TEST(link.pair.a->psn() != psn_before);  // 1 in 2^24 to fail by chance
  BOOST_TEST(env.errors().empty(), env.failures.summary());
}

// A real error completion (an RDMA write the peer refuses) and the two
// requests behind it, flushed: one down, for the write; the attempt lists
// all three as undelivered, in posting order; after it, traffic resumes.
BOOST_FIXTURE_TEST_CASE(an_error_completion_is_recovered_and_undelivered_requests_listed, InPlace) {
  RefusedWrite refused(env, 1);
  // One chain, one post: the three are out before anything can fail.
  ibv_send_wr behind[2]{};
  for (int i = 0; i < 2; ++i) {
    behind[i].wr_id = 2 + i;
    behind[i].opcode = IBV_WR_RDMA_WRITE;
    behind[i].send_flags = IBV_SEND_SIGNALED;
  }
  refused.wr.next = &behind[0];
  behind[0].next = &behind[1];
  link.health->post_send(refused.wr);

  BOOST_REQUIRE(eventually([&] { return link.health->state() == S::kUp && attempts.count() == 1; }));
  link.write(4);
  BOOST_REQUIRE(eventually([&] { return link.came(4); }));
  BOOST_TEST(link.came(1, IBV_WC_REM_ACCESS_ERR));
  const auto all = changes.all();
  const std::vector<S> expected{S::kDown, S::kRecovering, S::kUp};
  BOOST_TEST(states(all) == expected, boost::test_tools::per_element());
  BOOST_TEST((all[0].cause.source == HealthSource::kCompletion));
  BOOST_TEST(all[0].cause.wr_id == 1u);
  const std::vector<std::uint64_t> undelivered{1, 2, 3};
  BOOST_TEST(attempts.undelivered[0] == undelivered, boost::test_tools::per_element());
  BOOST_TEST(env.errors().empty(), env.failures.summary());
}

// A fault that recurs on every reconnect (QP_FATAL again as soon as it is
// up, ten times): max_recoveries recoveries, then failed, with one failure
// record saying it was damped; no more attempts after.
BOOST_FIXTURE_TEST_CASE(a_storm_is_damped_into_one_failure, InPlace) {
  for (int i = 0; i < 10 && link.health->state() != S::kFailed; ++i) {
    const std::size_t before = changes.all().size();
    env.dispatcher.inject(env.device->context(), IBV_EVENT_QP_FATAL, link.pair.a->get());
    BOOST_REQUIRE(eventually([&] {
      const auto all = changes.all();
      return all.size() > before && (all.back().to == S::kUp || all.back().to == S::kFailed);
    }));
  }
  settle(env.dispatcher);
  const auto all = changes.all();
  const std::vector<S> expected{S::kDown, S::kRecovering, S::kUp, S::kDown, S::kRecovering,
                                S::kUp,   S::kDown,       S::kRecovering, S::kUp, S::kDown,
                                S::kFailed};
  BOOST_TEST(states(all) == expected, boost::test_tools::per_element());
  BOOST_TEST((all.back().cause.source == HealthSource::kRecovery));
  BOOST_TEST(all.back().cause.what.find("(damped)") != std::string::npos, all.back().cause.what);
  BOOST_TEST(attempts.count() == 3u);
  BOOST_TEST(failures_of_kind(env, "connection failed") == 1u, env.failures.summary());
}

// A reconnect that throws is a failure record and an abandoned attempt; the
// next attempt, numbered 2, comes after the backoff and succeeds.
BOOST_AUTO_TEST_CASE(a_throwing_reconnect_is_a_failed_attempt_and_the_next_one_recovers) {
  Env env{test_device()};
  Changes changes;
  Attempts attempts;
  Forwarding link(env);
  auto b = link.pair.b;
  link.watch(ConnectionHealth::create(
      link.pair.a, changes.handler(),
      recovering(attempts, [b](const RecoveryAttempt& attempt) {
        if (attempt.number() == 1) throw std::runtime_error("no peer yet");
        reconnect_in_place(*b, attempt);
      })));
  env.dispatcher.inject(env.device->context(), IBV_EVENT_QP_REQ_ERR, link.pair.a->get());
  BOOST_REQUIRE(eventually(
      [&] { return attempts.count() == 2u && link.health->state() == S::kUp; }));
  link.write(1);
  BOOST_REQUIRE(eventually([&] { return link.came(1); }));
  const auto all = changes.all();
  const std::vector<S> expected{S::kDown, S::kRecovering, S::kDown, S::kRecovering, S::kUp};
  BOOST_TEST(states(all) == expected, boost::test_tools::per_element());
  BOOST_TEST((all[2].cause.source == HealthSource::kRecovery));
  BOOST_TEST(all[2].cause.what.find("attempt 1: abandoned") != std::string::npos,
             all[2].cause.what);
  const std::vector<unsigned> numbers{1, 2};
  BOOST_TEST(attempts.numbers == numbers, boost::test_tools::per_element());
  const auto lines = env.errors();
  BOOST_REQUIRE_EQUAL(lines.size(), 1u);
  BOOST_TEST(lines[0].find("no peer yet") != std::string::npos, lines[0]);
}

// The peer's process dies while the connection is idle: the keepalive
// takes it down, and recovery brings it up against the peer's new QP (a
// restarted peer), with nothing posted by the application in between.
BOOST_AUTO_TEST_CASE(a_peer_gone_while_idle_is_noticed_by_the_keepalive_and_recovered) {
  Env env{test_device()};
  Changes changes;
  Attempts attempts;
  std::mutex mutex;
  std::shared_ptr<QueuePair> restarted;
  Forwarding link(env);
  auto options = recovering(attempts, [&](const RecoveryAttempt& attempt) {
    QueuePairOptions peer;
    peer.send_cq = link.pair.cq;
    peer.recv_cq = link.pair.cq;
    auto fresh = QueuePair::create(env.pd, {}, peer);
    fresh->connect(attempt.local());
    attempt.connect(fresh->endpoint());
    std::lock_guard<std::mutex> lock(mutex);
    restarted = fresh;
  });
  options.keepalive.interval = 100ms;
  options.keepalive.misses = 3;
  link.watch(ConnectionHealth::create(link.pair.a, changes.handler(), options));
  BOOST_REQUIRE(eventually([&] { return link.health->keepalive_stats().answered >= 2u; }));

  link.pair.b->close();
  BOOST_REQUIRE(eventually([&] { return attempts.count() == 1u && link.health->state() == S::kUp; }));
  link.write(1);
  BOOST_REQUIRE(eventually([&] { return link.came(1); }));
  const auto all = changes.all();
  const std::vector<S> expected{S::kDown, S::kRecovering, S::kUp};
  BOOST_TEST(states(all) == expected, boost::test_tools::per_element());
  BOOST_TEST((all[0].cause.source == HealthSource::kKeepalive), all[0].cause.what);
  BOOST_TEST(env.errors().empty(), env.failures.summary());
}

// The port goes down: down, and no attempt while it stays down (a reset QP
// on a dead link only fails); PORT_ACTIVE starts the wait, the attempt
// recovers, and traffic resumes. The time from PORT_ACTIVE to the first new
// completion is printed.
BOOST_FIXTURE_TEST_CASE(a_port_flap_is_recovered_once_the_port_is_back, InPlace) {
  std::mutex mutex;
  std::optional<std::chrono::steady_clock::time_point> active;
  Handle listener = env.device->on_event(EventFilter{IBV_EVENT_PORT_ACTIVE}, [&](const Event&) {
    std::lock_guard<std::mutex> lock(mutex);
    active = std::chrono::steady_clock::now();
  });

  run_command("ip link set " + test_netdev() + " down");
  BOOST_REQUIRE(eventually([&] { return link.health->state() == S::kDown; }));
  // No attempt while the port is down.
  BOOST_TEST(stays_false_for([&] { return attempts.count() != 0u; }, 500ms,
                             "an attempt not held for PORT_ACTIVE comes after the 10 ms first "
                             "delay: 500 ms is fifty"));
  BOOST_TEST(attempts.count() == 0u);
  run_command("ip link set " + test_netdev() + " up");
  BOOST_REQUIRE(eventually([&] { return link.health->state() == S::kUp; }));
  link.write(1);
  BOOST_REQUIRE(eventually([&] { return link.came(1); }));
  const auto resumed = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mutex);
    BOOST_REQUIRE(active.has_value());
    BOOST_TEST_MESSAGE("PORT_ACTIVE to the first new completion: "
                       << std::chrono::duration_cast<std::chrono::milliseconds>(resumed - *active)
                              .count()
                       << " ms");
  }
  const auto all = changes.all();
  BOOST_REQUIRE(all.size() >= 3u);
  BOOST_TEST(all[0].cause.code == IBV_EVENT_PORT_ERR);
  BOOST_TEST(all.back().to == S::kUp);
  BOOST_TEST(env.errors().empty(), env.failures.summary());
}

namespace {
struct QpDuringOutage {
  const char* name;
  bool closed;
  friend std::ostream& operator<<(std::ostream& out, const QpDuringOutage& q) {
    return out << q.name;
  }
};
const QpDuringOutage kQpDuringOutage[] = {{"its QP open", false},
                                          {"its QP closed, as its device's removal closes it", true}};
}  // namespace

// A port that does not come back within give_up_after: failed, with one
// record that says so and names the QP by the number it had, and no
// attempt was made. With the QP closed during the outage that number was
// read from the closed QP, which threw out of the give-up (ENODEV, "handler
// threw") instead of the record (#50's campaign: a removal, then a flap).
BOOST_DATA_TEST_CASE(an_outage_past_give_up_after_fails_for_good_with_one_record,
                     bdata::make(kQpDuringOutage), qp_during_outage) {
  Env env{test_device()};
  Changes changes;
  Attempts attempts;
  Forwarding link(env);
  auto options = recovering(attempts, [](const RecoveryAttempt&) {});
  options.recovery.policy.give_up_after = 800ms;
  link.watch(ConnectionHealth::create(link.pair.a, changes.handler(), options));
  const std::string named = "QP " + std::to_string(link.pair.a->qp_num()) + ": ";
  std::atomic<bool> active{false};
  Handle listener = env.device->on_event(EventFilter{IBV_EVENT_PORT_ACTIVE},
                                         [&active](const Event&) { active = true; });
  run_command("ip link set " + test_netdev() + " down");
  if (qp_during_outage.closed) {
    BOOST_REQUIRE(eventually([&] { return link.health->state() == S::kDown; }));
    link.pair.a->close();
  }
  BOOST_REQUIRE(eventually([&] { return link.health->state() == S::kFailed; }));
  run_command("ip link set " + test_netdev() + " up");
  BOOST_REQUIRE(eventually([&] { return active.load(); }));
  settle(env.dispatcher);
  const auto all = changes.all();
  const std::vector<S> expected{S::kDown, S::kFailed};
  BOOST_TEST(states(all) == expected, boost::test_tools::per_element());
  BOOST_TEST(all.back().cause.what == "not recovered in 800 ms (0 attempts failed)");
  BOOST_TEST(attempts.count() == 0u);
  BOOST_TEST(failures_of_kind(env, "connection failed") == 1u, env.failures.summary());
  BOOST_TEST(failures_of_kind(env, "handler threw") == 0u, env.failures.summary());
  BOOST_TEST(env.failures.summary().find(named) != std::string::npos, env.failures.summary());
}

// A DEVICE_FATAL fails at once: a QP is not reset in place on a device that
// is gone.
BOOST_AUTO_TEST_CASE(a_dead_device_fails_for_good_at_once) {
  Env env{test_device()};
  Changes changes;
  Attempts attempts;
  Forwarding link(env);
  link.watch(ConnectionHealth::create(link.pair.a, changes.handler(),
                                      recovering(attempts, [](const RecoveryAttempt&) {})));
  env.dispatcher.inject(env.device->context(), IBV_EVENT_DEVICE_FATAL, WholeDevice{});
  BOOST_REQUIRE(eventually([&] { return link.health->state() == S::kFailed; }));
  settle(env.dispatcher);
  BOOST_TEST(changes.all().back().cause.what.find("IBV_EVENT_DEVICE_FATAL") != std::string::npos);
  BOOST_TEST(attempts.count() == 0u);
  BOOST_TEST(failures_of_kind(env, "connection failed") == 1u, env.failures.summary());
}

BOOST_AUTO_TEST_CASE(bad_deadlines_and_recovery_are_refused) {
  Env env{test_device()};
  Pair pair(env, [](const CompletionBatch&) {});
  Changes changes;
  Attempts attempts;
  ConnectionHealth::Options options;
  options.deadline = -1ms;
  expect_throw<std::invalid_argument>(
      [&] { ConnectionHealth::create(pair.a, changes.handler(), options); },
      "ConnectionHealth::create: a deadline of 0 (none) or more");
  options = recovering(attempts, [](const RecoveryAttempt&) {});
  options.recovery.policy.max_recoveries = 0;
  expect_throw<std::invalid_argument>(
      [&] { ConnectionHealth::create(pair.a, changes.handler(), options); },
      "ConnectionHealth::create: RecoveryPolicy: max_recoveries is 0");
  auto polled = CompletionQueue::create_polled(env.device, {});
  QueuePairOptions on_polled;
  on_polled.send_cq = pair.cq;
  on_polled.recv_cq = polled;
  auto qp = QueuePair::create(env.pd, {}, on_polled);
  expect_throw<std::invalid_argument>(
      [&] {
        ConnectionHealth::create(qp, changes.handler(),
                                 recovering(attempts, [](const RecoveryAttempt&) {}));
      },
      "a CQ of it is kPolled");
}

// An attempt is settled once; one still held when its health closes
// connects nothing.
BOOST_AUTO_TEST_CASE(an_attempt_is_settled_once_and_not_after_close) {
  Env env{test_device()};
  Changes changes;
  Attempts attempts;
  std::mutex mutex;
  std::optional<RecoveryAttempt> held;
  Forwarding link(env);
  link.watch(ConnectionHealth::create(link.pair.a, changes.handler(),
                                      recovering(attempts, [&](const RecoveryAttempt& attempt) {
                                        std::lock_guard<std::mutex> lock(mutex);
                                        held = attempt;
                                      })));
  env.dispatcher.inject(env.device->context(), IBV_EVENT_QP_FATAL, link.pair.a->get());
  BOOST_REQUIRE(eventually([&] {
    std::lock_guard<std::mutex> lock(mutex);
    return held.has_value();
  }));
  RecoveryAttempt attempt = *held;
  link.health->close();
  expect_throw<std::system_error>([&] { attempt.connect(link.pair.b->endpoint()); },
                                  "RecoveryAttempt::connect: the recovery ended");
  RecoveryAttempt again = *held;
  expect_throw<std::system_error>([&] { again.fail("gave up"); },
                                  "RecoveryAttempt::fail: this attempt was settled already");
  BOOST_TEST(link.health->state() == S::kRecovering);  // closed: nothing moves it
}

// Mode::kReconnect without the CM: an attempt hands the drained QP over (not
// reset: no local endpoint), and the application brings a new one connected
// to the peer. From then on the health runs on it: the old QP's events are
// not the connection's news, the new one's are, and post_send posts on it.
// A connect() or a null QP is refused, each a failed attempt, then the next;
// what the old QP did not deliver is listed by each attempt of the outage.
BOOST_AUTO_TEST_CASE(a_replaced_qp_is_the_connection_s_from_then_on) {
  Env env{test_device()};
  Changes changes;
  Attempts attempts;
  Forwarding link(env);
  QueuePairOptions qp_options;
  qp_options.send_cq = link.pair.cq;
  qp_options.recv_cq = link.pair.cq;
  const std::shared_ptr<QueuePair> next = QueuePair::create(env.pd, {}, qp_options);
  std::mutex mutex;
  std::vector<std::string> refused;
  bool handed_old = false;
  auto options = recovering(attempts, [&](const RecoveryAttempt& attempt) {
    std::lock_guard<std::mutex> lock(mutex);
    try {
      if (attempt.number() == 1) return attempt.connect(link.pair.b->endpoint());
      if (attempt.number() == 2) return attempt.replace(nullptr);
    } catch (const std::invalid_argument& e) {
      refused.push_back(e.what());
      return;
    }
    handed_old = attempt.queue_pair() == link.pair.a && attempt.local().qp_num() == 0;
    link.pair.b->reset();
    connect_rc_pair(*next, *link.pair.b);
    attempt.replace(next);
  });
  options.recovery.mode = ConnectionHealth::Options::Recovery::Mode::kReconnect;
  expect_throw<std::invalid_argument>(
      [&] { ConnectionHealth::create(env.dispatcher, changes.handler(), options); },
      "a connection without a QP is made by its recovery");
  link.watch(ConnectionHealth::create(link.pair.a, changes.handler(), options));

  // Two requests that will not be delivered: posted on a QP in ERR, they
  // flush. Every attempt of the outage lists them, not only the first.
  ibv_qp_attr to_error{};
  to_error.qp_state = IBV_QPS_ERR;
  link.pair.a->modify(to_error, IBV_QP_STATE, "ibv_modify_qp(ERR)");
  link.write(5);
  link.write(6);
  BOOST_REQUIRE(eventually([&] { return link.came(6, IBV_WC_WR_FLUSH_ERR); }));
  env.dispatcher.inject(env.device->context(), IBV_EVENT_QP_FATAL, link.pair.a->get());
  const std::vector<S> healed{S::kDown, S::kRecovering, S::kDown, S::kRecovering,
                              S::kDown, S::kRecovering, S::kUp};
  BOOST_REQUIRE(eventually([&] { return changes.all().size() >= healed.size(); }));
  settle(env.dispatcher);
  BOOST_TEST(states(changes.all()) == healed, boost::test_tools::per_element());
  BOOST_TEST(link.health->queue_pair() == next);
  {
    std::lock_guard<std::mutex> lock(attempts.mutex);
    const std::vector<std::uint64_t> both{5, 6};
    BOOST_REQUIRE(attempts.undelivered.size() == 3u);
    for (const auto& listed : attempts.undelivered) {
      BOOST_TEST(listed == both, boost::test_tools::per_element());
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    BOOST_TEST(handed_old);
    BOOST_REQUIRE(refused.size() == 2u);
    BOOST_TEST(refused[0].find("Mode::kReconnect replaces the QP") != std::string::npos,
               refused[0]);
    BOOST_TEST(refused[1].find("the QP is null") != std::string::npos, refused[1]);
  }

  link.write(7);  // through the health: on the new QP
  BOOST_REQUIRE(eventually([&] { return link.came(7); }));
  env.dispatcher.inject(env.device->context(), IBV_EVENT_QP_FATAL, link.pair.a->get());
  settle(env.dispatcher);
  BOOST_TEST(changes.all().size() == healed.size());  // the old QP's: not news
  env.dispatcher.inject(env.device->context(), IBV_EVENT_QP_FATAL, next->get());
  BOOST_REQUIRE(eventually([&] { return changes.all().size() > healed.size(); }));
  BOOST_TEST(changes.all()[healed.size()].to == S::kDown);
  link.health->close();
}

// With recovery, nothing is posted while the connection is not up: it
// would reach no attempt's undelivered(). A connection its recovery makes
// has no QP until its first attempt brings one.
BOOST_AUTO_TEST_CASE(post_send_is_refused_while_a_recovering_connection_is_not_up) {
  Env env{test_device()};
  Changes changes;
  Attempts attempts;
  std::mutex mutex;
  std::optional<RecoveryAttempt> held;
  auto options = recovering(attempts, [&](const RecoveryAttempt& attempt) {
    std::lock_guard<std::mutex> lock(mutex);
    held = attempt;  // never settled while the test looks
  });
  options.recovery.mode = ConnectionHealth::Options::Recovery::Mode::kReconnect;
  options.initial = S::kDown;
  auto health = ConnectionHealth::create(env.dispatcher, changes.handler(), options);
  BOOST_REQUIRE(eventually([&] { return health->state() == S::kRecovering; }));
  BOOST_TEST(health->queue_pair() == nullptr);
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  expect_throw<std::system_error>([&] { health->post_send(wr, &bad); },
                                  "ConnectionHealth::post_send: the connection is not up");
  BOOST_TEST(bad == &wr);
  health->close();
}

BOOST_AUTO_TEST_SUITE_END()
