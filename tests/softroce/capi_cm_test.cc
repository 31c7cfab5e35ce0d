// Sessions through the CM in C (<ibev/ibev_c.h>), on soft-RoCE: a client
// session and an acceptor come up, each attempt's QP made by a C make_qp
// function through the lent CM id; a cause on the client's health is
// recovered on a new CM id and QP, and the acceptor takes the reconnecting
// peer back as the same session (no second on_session). What C++ promises
// of CmSession is tests/softroce/cm_session_test.cc's; this is what C code
// relies on.
#define BOOST_TEST_MODULE ibev_softroce_capi_cm
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <ibev/ibev_c.h>

#include "tests/softroce/cm_fixture.h"
#include "tests/softroce/rdma_fixture.h"
#include "tests/support/testing.h"

using namespace ibev::testing;

namespace {

BOOST_TEST_GLOBAL_FIXTURE(NetdevAddress);  // d0's address, for rdma_cm

template <auto free_it>
struct Freed {
  template <typename T>
  void operator()(T* object) const {
    free_it(object);
  }
};
template <typename T, auto free_it>
using Owned = std::unique_ptr<T, Freed<free_it>>;

void no_completions(ibv_cq*, const ibv_wc*, size_t, void*) {}

// Both sides, in this process, on the test device.
struct Sides {
  Sides() {
    dispatcher.reset(ibev_dispatcher_create(nullptr));
    BOOST_REQUIRE_MESSAGE(dispatcher, ibev_last_error());
    BOOST_REQUIRE_EQUAL(ibev_dispatcher_start(dispatcher.get()), 0);
    device.reset(ibev_device_open(dispatcher.get(), test_device().c_str()));
    BOOST_REQUIRE_MESSAGE(device, ibev_last_error());
    pd.reset(ibev_pd_create(device.get()));
    BOOST_REQUIRE_MESSAGE(pd, ibev_last_error());
    channel.reset(ibev_cm_channel_create(dispatcher.get()));
    BOOST_REQUIRE_MESSAGE(channel, ibev_last_error());
  }
  ~Sides() {
    // The acceptor, then the client, then the server's sessions.
    acceptor.reset();
    client.reset();
    std::vector<ibev_cm_session*> kept;
    {
      std::lock_guard<std::mutex> lock(mutex);
      kept.swap(server_sessions);
    }
    for (ibev_cm_session* session : kept) ibev_cm_session_destroy(session);
  }

  // Each attempt's QP: on its own CQ, taken to INIT through the id. The QP
  // holds its CQ, PD and device, so their C references go at once.
  static ibev_qp* make_qp(const ibev_cm_id* id, const ibev_recovery_attempt*, void* context) {
    auto* self = static_cast<Sides*>(context);
    {
      std::lock_guard<std::mutex> lock(self->mutex);
      self->devices_named.push_back(ibev_cm_id_device_name(id));
    }
    Owned<ibev_cq, ibev_cq_destroy> cq(
        ibev_cq_create(self->device.get(), nullptr, no_completions, nullptr, nullptr));
    if (!cq) return nullptr;
    ibev_qp_attr attr{};
    attr.send_cq = cq.get();
    attr.recv_cq = cq.get();
    ibev_qp* qp = ibev_qp_create(self->pd.get(), &attr, nullptr, nullptr);
    if (qp == nullptr) return nullptr;
    if (ibev_cm_id_init_qp(id, qp) != 0) {
      ibev_qp_destroy(qp);
      return nullptr;
    }
    return qp;
  }
  static void on_session(ibev_cm_session* session, void* context) {
    auto* self = static_cast<Sides*>(context);
    std::lock_guard<std::mutex> lock(self->mutex);
    self->server_sessions.push_back(session);  // kept: ours to destroy
  }
  static void on_server_change(uint64_t id, const ibev_health_change* change, void* context) {
    auto* self = static_cast<Sides*>(context);
    std::lock_guard<std::mutex> lock(self->mutex);
    self->server_changes.emplace_back(id, change->to);
  }
  static void on_client_change(const ibev_health_change* change, void* context) {
    auto* self = static_cast<Sides*>(context);
    std::lock_guard<std::mutex> lock(self->mutex);
    self->client_changes.push_back(change->to);
  }

  void listen() {
    ibev_cm_acceptor_attr attr;
    ibev_cm_acceptor_attr_init(&attr);
    attr.make_qp = &Sides::make_qp;
    attr.make_qp_context = this;
    attr.health.policy.first_delay_ms = 10;
    attr.health.policy.max_delay_ms = 400;
    attr.health.policy.window_ms = 60000;
    acceptor.reset(ibev_cm_acceptor_listen(channel.get(), cm_host().c_str(), 0, &attr,
                                           &Sides::on_session, &Sides::on_server_change, this));
    BOOST_REQUIRE_MESSAGE(acceptor, ibev_last_error());
    BOOST_REQUIRE(ibev_cm_acceptor_port(acceptor.get()) != 0);
  }
  void connect(uint64_t id) {
    ibev_cm_session_attr attr;
    ibev_cm_session_attr_init(&attr);
    attr.id = id;
    attr.make_qp = &Sides::make_qp;
    attr.make_qp_context = this;
    attr.health.policy.first_delay_ms = 10;
    attr.health.policy.max_delay_ms = 400;
    attr.health.policy.window_ms = 60000;
    client.reset(ibev_cm_session_connect(channel.get(), cm_host().c_str(),
                                         ibev_cm_acceptor_port(acceptor.get()), &attr,
                                         &Sides::on_client_change, this));
    BOOST_REQUIRE_MESSAGE(client, ibev_last_error());
  }
  ibev_connection_state client_state() {
    return ibev_health_state(ibev_cm_session_health(client.get()));
  }
  size_t client_ups() {
    std::lock_guard<std::mutex> lock(mutex);
    size_t n = 0;
    for (ibev_connection_state to : client_changes) n += to == IBEV_CONNECTION_UP ? 1 : 0;
    return n;
  }
  size_t server_ups(uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex);
    size_t n = 0;
    for (const auto& [of, to] : server_changes) n += of == id && to == IBEV_CONNECTION_UP ? 1 : 0;
    return n;
  }

  Owned<ibev_dispatcher, ibev_dispatcher_destroy> dispatcher;
  Owned<ibev_device, ibev_device_destroy> device;
  Owned<ibev_pd, ibev_pd_destroy> pd;
  Owned<ibev_cm_channel, ibev_cm_channel_destroy> channel;
  Owned<ibev_cm_acceptor, ibev_cm_acceptor_destroy> acceptor;
  Owned<ibev_cm_session, ibev_cm_session_destroy> client;
  std::mutex mutex;
  std::vector<std::string> devices_named;
  std::vector<ibev_cm_session*> server_sessions;
  std::vector<std::pair<uint64_t, ibev_connection_state>> server_changes;
  std::vector<ibev_connection_state> client_changes;
};

}  // namespace

BOOST_AUTO_TEST_SUITE(capi_cm)

BOOST_AUTO_TEST_CASE(a_session_comes_up_and_its_reconnect_is_the_same_server_session) {
  Sides sides;
  sides.listen();
  sides.connect(42);
  BOOST_REQUIRE(eventually([&] { return sides.client_state() == IBEV_CONNECTION_UP; }));
  BOOST_REQUIRE(eventually([&] { return sides.server_ups(42) == 1u; }));
  BOOST_TEST(ibev_cm_session_id(sides.client.get()) == 42u);
  BOOST_TEST(ibev_cm_acceptor_sessions(sides.acceptor.get()) == 1u);
  {
    std::lock_guard<std::mutex> lock(sides.mutex);
    BOOST_REQUIRE_EQUAL(sides.server_sessions.size(), 1u);
    BOOST_TEST(ibev_cm_session_id(sides.server_sessions[0]) == 42u);
    BOOST_TEST(ibev_health_qp(ibev_cm_session_health(sides.server_sessions[0])) != nullptr);
    for (const std::string& name : sides.devices_named) BOOST_TEST(name == test_device());
  }

  // The client's own cause: its recovery reconnects on a new id and QP, and
  // the server takes the request naming session 42 as that session's.
  const ibev_health_cause mine{IBEV_HEALTH_APPLICATION, 0, 0, "the client's own reason"};
  BOOST_REQUIRE_EQUAL(ibev_health_add_cause(ibev_cm_session_health(sides.client.get()), &mine),
                      0);
  BOOST_REQUIRE(eventually([&] { return sides.client_ups() == 2u; }));
  BOOST_REQUIRE(eventually([&] { return sides.server_ups(42) == 2u; }));
  BOOST_TEST(ibev_cm_acceptor_sessions(sides.acceptor.get()) == 1u);
  std::lock_guard<std::mutex> lock(sides.mutex);
  BOOST_TEST(sides.server_sessions.size() == 1u);  // the same session, not a second
  BOOST_TEST(sides.devices_named.size() >= 4u);  // a new QP each side for the reconnect
}

BOOST_AUTO_TEST_SUITE_END()
