// A connection's health through the C API (<ibev/ibev_c.h>), on soft-RoCE:
// a link flap takes it down once, with PORT_ERR as data C reads, and its
// recovery in place (the reconnect function resets the loopback peer and
// connects the attempt) brings it up again once the port is back, traffic
// flowing; an application's cause does the same without a flap. The
// handler and the reconnect function run on an ibev_worker, as a C program
// that blocks in them (a peer's endpoint from a socket) would have them.
// What C++ promises of ConnectionHealth is tests/softroce/
// connection_health_test.cc's; this is what C code relies on.
#define BOOST_TEST_MODULE ibev_softroce_capi_health
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ibev/ibev_c.h>

#include "tests/capi/c_owned.h"
#include "tests/softroce/rdma_fixture.h"
#include "tests/support/testing.h"

using namespace ibev::testing;

namespace {

// A change as the handler saw it, its text copied (valid for the call only).
struct Seen {
  ibev_connection_state from;
  ibev_connection_state to;
  ibev_health_source source;
  int code;
  std::string what;
  bool on_worker;
};

// Two RC QPs on the test device, connected to each other over one CQ whose
// completions go to the health; `a` is watched, `b` its loopback peer,
// which each attempt resets and joins to the attempt's new endpoint.
struct Link {
  Link() {
    ibev_dispatcher_attr attr{};
    attr.device_monitor = IBEV_DEVICE_MONITOR_OFF;
    dispatcher.reset(ibev_dispatcher_create(&attr));
    BOOST_REQUIRE_MESSAGE(dispatcher, ibev_last_error());
    BOOST_REQUIRE_EQUAL(ibev_dispatcher_start(dispatcher.get()), 0);
    device.reset(ibev_device_open(dispatcher.get(), test_device().c_str()));
    BOOST_REQUIRE_MESSAGE(device, ibev_last_error());
    pd.reset(ibev_pd_create(device.get()));
    BOOST_REQUIRE_MESSAGE(pd, ibev_last_error());
    cq.reset(ibev_cq_create(device.get(), nullptr, &Link::completions, nullptr, this));
    BOOST_REQUIRE_MESSAGE(cq, ibev_last_error());
    ibev_qp_attr qp_attr{};
    qp_attr.send_cq = cq.get();
    qp_attr.recv_cq = cq.get();
    a.reset(ibev_qp_create(pd.get(), &qp_attr, nullptr, nullptr));
    b.reset(ibev_qp_create(pd.get(), &qp_attr, nullptr, nullptr));
    BOOST_REQUIRE_MESSAGE(a && b, ibev_last_error());
    ibev_rc_endpoint a_end, b_end;
    BOOST_REQUIRE_EQUAL(ibev_qp_endpoint(a.get(), 1, 0, &a_end), 0);
    BOOST_REQUIRE_EQUAL(ibev_qp_endpoint(b.get(), 1, 0, &b_end), 0);
    BOOST_REQUIRE_EQUAL(ibev_qp_connect(a.get(), &b_end, nullptr), 0);
    BOOST_REQUIRE_EQUAL(ibev_qp_connect(b.get(), &a_end, nullptr), 0);
    worker.reset(ibev_worker_create(nullptr, nullptr));
    BOOST_REQUIRE_MESSAGE(worker, ibev_last_error());

    ibev_health_attr health_attr;
    ibev_health_attr_init(&health_attr);
    health_attr.executor = worker.get();
    health_attr.policy.first_delay_ms = 10;
    health_attr.policy.max_delay_ms = 100;
    health_attr.policy.jitter = 0;
    health_attr.policy.window_ms = 60000;  // a storm under TCG and TSan stays inside it
    health_attr.reconnect = &Link::reconnect;
    health_attr.reconnect_context = this;
    health.reset(ibev_health_create(a.get(), &health_attr, &Link::changed, this));
    BOOST_REQUIRE_MESSAGE(health, ibev_last_error());
    watched = health.get();
  }
  ~Link() {
    watched = nullptr;
    health.reset();  // first: it holds `a`, and its calls use this
  }

  static void completions(ibv_cq*, const ibv_wc* wc, size_t count, void* context) {
    auto* self = static_cast<Link*>(context);
    std::lock_guard<std::mutex> lock(self->mutex);
    for (size_t i = 0; i < count; ++i) {
      self->wcs.push_back(wc[i]);
      if (ibev_health* health = self->watched.load()) ibev_health_completion(health, &wc[i]);
    }
  }
  static void changed(const ibev_health_change* change, void* context) {
    auto* self = static_cast<Link*>(context);
    std::lock_guard<std::mutex> lock(self->mutex);
    self->seen.push_back({change->from, change->to, change->cause.source, change->cause.code,
                          change->cause.what, ibev_worker_is_current(self->worker.get()) == 1});
  }
  // Joins `b` to the attempt's new endpoint, then connects the attempt.
  static void reconnect(const ibev_recovery_attempt* attempt, void* context) {
    auto* self = static_cast<Link*>(context);
    ibev_health_cause cause{};
    ibev_rc_endpoint local{}, peer{};
    const uint64_t* undelivered = nullptr;
    size_t undelivered_count = 0;
    int failed = ibev_recovery_attempt_cause(attempt, &cause);
    failed = failed ? failed : ibev_recovery_attempt_undelivered(attempt, &undelivered,
                                                                 &undelivered_count);
    failed = failed ? failed : ibev_recovery_attempt_local(attempt, &local);
    failed = failed ? failed : ibev_qp_reset(self->b.get());
    failed = failed ? failed : ibev_qp_connect(self->b.get(), &local, nullptr);
    failed = failed ? failed : ibev_qp_endpoint(self->b.get(), 1, 0, &peer);
    const bool in_reset = ibev_recovery_attempt_qp(attempt) == ibev_qp_get(self->a.get());
    failed = failed ? failed : ibev_recovery_attempt_connect(attempt, &peer);
    std::lock_guard<std::mutex> lock(self->mutex);
    if (!self->kept) self->kept.reset(ibev_recovery_attempt_ref(attempt));
    self->attempts.push_back({ibev_recovery_attempt_number(attempt), cause.source, cause.code,
                              cause.what != nullptr ? cause.what : "", in_reset,
                              undelivered_count, failed,
                              failed != 0 ? ibev_last_error() : ""});
  }

  // A zero-length RDMA write, signaled, through the health.
  int write(uint64_t wr_id) {
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    return ibev_health_post_send(health.get(), &wr, nullptr);
  }
  bool came(uint64_t wr_id) {
    std::lock_guard<std::mutex> lock(mutex);
    for (const ibv_wc& wc : wcs) {
      if (wc.wr_id == wr_id && wc.status == IBV_WC_SUCCESS) return true;
    }
    return false;
  }
  ibev_connection_state state() { return ibev_health_state(health.get()); }
  std::vector<Seen> changes() {
    std::lock_guard<std::mutex> lock(mutex);
    return seen;
  }

  struct Attempt {
    unsigned number;
    ibev_health_source source;
    int code;
    std::string what;
    bool qp_is_the_connection_s;
    size_t undelivered;
    int error;
    std::string message;
  };
  std::vector<Attempt> attempts_made() {
    std::lock_guard<std::mutex> lock(mutex);
    return attempts;
  }

  Owned<ibev_dispatcher, ibev_dispatcher_destroy> dispatcher;
  Owned<ibev_device, ibev_device_destroy> device;
  Owned<ibev_pd, ibev_pd_destroy> pd;
  Owned<ibev_cq, ibev_cq_destroy> cq;
  Owned<ibev_qp, ibev_qp_destroy> a;
  Owned<ibev_qp, ibev_qp_destroy> b;
  Owned<ibev_worker, ibev_worker_destroy> worker;
  Owned<ibev_health, ibev_health_destroy> health;
  Owned<ibev_recovery_attempt, ibev_recovery_attempt_destroy> kept;  // the first attempt
  std::atomic<ibev_health*> watched{nullptr};
  std::mutex mutex;
  std::vector<ibv_wc> wcs;
  std::vector<Seen> seen;
  std::vector<Attempt> attempts;
};

// Down, recovering, up: what each change says, with the first cause.
void check_one_outage(Link& link, ibev_health_source source, int code, const std::string& what) {
  // The handler runs on the worker: it may hear the up after the state
  // reads up (under ASan it had not, once).
  BOOST_REQUIRE(eventually([&] {
    const std::vector<Seen> heard = link.changes();
    return heard.size() >= 3u && heard.back().to == IBEV_CONNECTION_UP;
  }));
  const std::vector<Seen> all = link.changes();
  BOOST_TEST(all[0].from == IBEV_CONNECTION_UP);
  BOOST_TEST(all[0].to == IBEV_CONNECTION_DOWN);
  BOOST_TEST(all[0].source == source);
  BOOST_TEST(all[0].code == code);
  BOOST_TEST(all[0].what == what);
  BOOST_TEST(all[1].to == IBEV_CONNECTION_RECOVERING);
  BOOST_TEST(all.back().to == IBEV_CONNECTION_UP);
  BOOST_TEST(all.back().code == code);  // to up: the outage's first cause
  for (const Seen& s : all) BOOST_TEST(s.on_worker);
  const auto attempts = link.attempts_made();
  BOOST_REQUIRE(!attempts.empty());
  BOOST_TEST(attempts[0].number == 1u);
  BOOST_TEST(attempts[0].source == source);
  BOOST_TEST(attempts[0].code == code);
  BOOST_TEST(attempts[0].what == what);
  BOOST_TEST(attempts[0].qp_is_the_connection_s);
  BOOST_TEST(attempts.back().error == 0, attempts.back().message);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(capi_health)

BOOST_AUTO_TEST_CASE(a_link_flap_is_one_outage_and_recovery_brings_it_up) {
  Link link;
  BOOST_REQUIRE_EQUAL(link.write(1), 0);
  BOOST_REQUIRE(eventually([&] { return link.came(1); }));

  run_command("ip link set " + test_netdev() + " down");
  BOOST_REQUIRE(eventually([&] { return link.state() == IBEV_CONNECTION_DOWN; }));
  // While down, with recovery, nothing is posted: the caller hears why.
  BOOST_TEST(link.write(2) == ENOTCONN);
  size_t count = 0;
  ibev_health_cause causes[4];
  BOOST_REQUIRE_EQUAL(ibev_health_causes(link.health.get(), causes, 4, &count), 0);
  BOOST_REQUIRE(count >= 1u);
  BOOST_TEST(causes[0].source == IBEV_HEALTH_ASYNC_EVENT);
  BOOST_TEST(causes[0].code == IBV_EVENT_PORT_ERR);
  run_command("ip link set " + test_netdev() + " up");

  BOOST_REQUIRE(eventually([&] { return link.state() == IBEV_CONNECTION_UP; }));
  BOOST_REQUIRE_EQUAL(link.write(3), 0);
  BOOST_REQUIRE(eventually([&] { return link.came(3); }));
  check_one_outage(link, IBEV_HEALTH_ASYNC_EVENT, IBV_EVENT_PORT_ERR, "IBV_EVENT_PORT_ERR");
  BOOST_REQUIRE_EQUAL(ibev_health_causes(link.health.get(), nullptr, 0, &count), 0);
  BOOST_TEST(count == 0u);  // cleared by the up
}

BOOST_AUTO_TEST_CASE(an_application_s_cause_is_recovered_as_a_flap_is) {
  Link link;
  const ibev_health_cause mine{IBEV_HEALTH_APPLICATION, 42, 0, "the peer missed a heartbeat"};
  BOOST_REQUIRE_EQUAL(ibev_health_add_cause(link.health.get(), &mine), 0);
  BOOST_REQUIRE(eventually([&] {
    const auto all = link.changes();
    return !all.empty() && all.back().to == IBEV_CONNECTION_UP;
  }));
  BOOST_REQUIRE_EQUAL(link.write(1), 0);
  BOOST_REQUIRE(eventually([&] { return link.came(1); }));
  check_one_outage(link, IBEV_HEALTH_APPLICATION, 42, "the peer missed a heartbeat");
  BOOST_TEST(link.attempts_made()[0].undelivered == 0u);
}

// An attempt kept past its call (ibev_recovery_attempt_ref) and settled
// again: EALREADY, naming the call, and the connection stays up.
BOOST_AUTO_TEST_CASE(an_attempt_settled_twice_is_ealready) {
  Link link;
  const ibev_health_cause mine{IBEV_HEALTH_APPLICATION, 0, 0, "again"};
  BOOST_REQUIRE_EQUAL(ibev_health_add_cause(link.health.get(), &mine), 0);
  // Until the reconnect function kept the attempt: it keeps it after
  // connecting it, so the state reads up first (the cold run of 009b60c saw
  // it unkept once).
  BOOST_REQUIRE(eventually([&] {
    return !link.attempts_made().empty() && link.state() == IBEV_CONNECTION_UP;
  }));
  std::lock_guard<std::mutex> lock(link.mutex);
  BOOST_REQUIRE(link.kept);
  BOOST_TEST(ibev_recovery_attempt_current(link.kept.get()) == 0);
  BOOST_TEST(ibev_recovery_attempt_fail(link.kept.get(), "too late") == EALREADY);
  BOOST_TEST(std::string(ibev_last_error()).rfind("ibev_recovery_attempt_fail: ", 0) == 0,
             ibev_last_error());
  BOOST_TEST(ibev_health_state(link.health.get()) == IBEV_CONNECTION_UP);
}

BOOST_AUTO_TEST_SUITE_END()
