// Sessions through the CM in C (<ibev/ibev_c.h>), on soft-RoCE: a client
// session and an acceptor come up, each attempt's QP made by a C make_qp
// function through the lent CM id; a cause on the client's health is
// recovered on a new CM id and QP, and the acceptor takes the reconnecting
// peer back as the same session (no second on_session); and bare CM ids
// (ibev_cm_id_create): a listener and a client connect, one message crosses
// their QPs, the client disconnects and both hear it. What C++ promises
// of CmSession is tests/softroce/cm_session_test.cc's; this is what C code
// relies on.
#define BOOST_TEST_MODULE ibev_softroce_capi_cm
#include <boost/test/unit_test.hpp>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <ibev/ibev_c.h>

#include "tests/softroce/cm_fixture.h"
#include "tests/capi/c_owned.h"
#include "tests/softroce/rdma_fixture.h"
#include "tests/support/testing.h"

using namespace ibev::testing;

namespace {

BOOST_TEST_GLOBAL_FIXTURE(NetdevAddress);  // d0's address, for rdma_cm

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
      // The lent id is the session's: C may not move it or destroy it.
      auto* lent = const_cast<ibev_cm_id*>(id);
      self->lent_disconnects.push_back(ibev_cm_id_disconnect(lent));
      ibev_cm_id_destroy(lent);  // ignored
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
  std::vector<int> lent_disconnects;
  std::vector<ibev_cm_session*> server_sessions;
  std::vector<std::pair<uint64_t, ibev_connection_state>> server_changes;
  std::vector<ibev_connection_state> client_changes;
};

// Two bare CM ids in one process, a listener and a client, each side's
// steps taken in its handler as rping takes them: the server makes its QP
// and accepts on CONNECT_REQUEST (the new id its own), the client resolves
// the route on ADDR_RESOLVED and connects on ROUTE_RESOLVED.
struct IdPair {
  explicit IdPair(Sides& sides) : sides(sides) {
    server_mr.reset(ibev_mr_create(sides.pd.get(), server_buffer, sizeof server_buffer,
                                   IBV_ACCESS_LOCAL_WRITE));
    BOOST_REQUIRE_MESSAGE(server_mr, ibev_last_error());
    client_mr.reset(ibev_mr_create(sides.pd.get(), client_buffer, sizeof client_buffer,
                                   IBV_ACCESS_LOCAL_WRITE));
    BOOST_REQUIRE_MESSAGE(client_mr, ibev_last_error());
  }
  ~IdPair() {
    // The ids first (their handlers stopped), then what the handlers made.
    ibev_cm_id_destroy(client);
    ibev_cm_id_destroy(accepted);
    ibev_cm_id_destroy(listener);
    for (ibev_qp* qp : qps) ibev_qp_destroy(qp);
    for (ibev_cq* cq : cqs) ibev_cq_destroy(cq);
  }

  static void on_completion(ibv_cq*, const ibv_wc* wc, size_t count, void* context) {
    auto* self = static_cast<IdPair*>(context);
    std::lock_guard<std::mutex> lock(self->mutex);
    for (size_t i = 0; i < count; ++i) self->completions.push_back(wc[i]);
  }
  // A QP on the id's device, in INIT through the id; NULL on failure (said).
  ibev_qp* make_qp(const ibev_cm_id* id) {
    std::lock_guard<std::mutex> lock(mutex);
    devices_named.push_back(ibev_cm_id_device_name(id));
    ibev_cq* cq = ibev_cq_create(sides.device.get(), nullptr, on_completion, nullptr, this);
    if (cq == nullptr) return failed("ibev_cq_create"), nullptr;
    cqs.push_back(cq);
    ibev_qp_attr attr{};
    attr.send_cq = cq;
    attr.recv_cq = cq;
    ibev_qp* qp = ibev_qp_create(sides.pd.get(), &attr, nullptr, nullptr);
    if (qp == nullptr) return failed("ibev_qp_create"), nullptr;
    qps.push_back(qp);
    if (ibev_cm_id_init_qp(id, qp) != 0) return failed("init_qp"), nullptr;
    return qp;
  }
  // With `mutex` held.
  void failed(const char* what) {
    failures.push_back(std::string(what) + ": " + ibev_last_error());
  }
  void heard(const std::string& who, const ibev_cm_event* event) {
    std::lock_guard<std::mutex> lock(mutex);
    events.push_back(who + " " + event->name);
  }
  bool has(const std::string& line) {
    std::lock_guard<std::mutex> lock(mutex);
    for (const std::string& e : events) {
      if (e == line) return true;
    }
    return false;
  }

  static void on_server(const ibev_cm_event* event, void* context) {
    auto* self = static_cast<IdPair*>(context);
    self->heard(event->id == self->listener ? "listener" : "accepted", event);
    if (event->code == RDMA_CM_EVENT_CONNECT_REQUEST) {
      {
        std::lock_guard<std::mutex> lock(self->mutex);
        self->accepted = event->new_id;  // ours now: destroyed by ~IdPair
        // The CM pads a request's private data: its first bytes are the client's.
        if (event->private_data_length >= 5) {
          self->request_data.assign(static_cast<const char*>(event->private_data), 5);
        }
      }
      ibev_qp* qp = self->make_qp(event->new_id);
      if (qp == nullptr) return;
      ibv_sge sge{reinterpret_cast<uintptr_t>(self->server_buffer),
                  static_cast<uint32_t>(sizeof self->server_buffer),
                  ibev_mr_get(self->server_mr.get())->lkey};
      ibv_recv_wr wr{};
      wr.wr_id = 1;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      ibv_recv_wr* bad = nullptr;
      std::lock_guard<std::mutex> lock(self->mutex);
      if (ibv_post_recv(ibev_qp_get(qp), &wr, &bad) != 0) return self->failed("ibv_post_recv");
      if (ibev_cm_id_accept(event->new_id, qp, nullptr) != 0) self->failed("accept");
    } else if (event->code == RDMA_CM_EVENT_DISCONNECTED) {
      // Answer the client's disconnect, so that it hears DISCONNECTED too,
      // and let the id go from its own handler, as a kernel ULP does.
      std::lock_guard<std::mutex> lock(self->mutex);
      if (ibev_cm_id_disconnect(event->id) != 0) self->failed("server disconnect");
      ibev_cm_id_destroy(event->id);
      self->accepted = nullptr;
    }
  }
  static void on_client(const ibev_cm_event* event, void* context) {
    auto* self = static_cast<IdPair*>(context);
    self->heard("client", event);
    int error = 0;
    if (event->code == RDMA_CM_EVENT_ADDR_RESOLVED) {
      error = ibev_cm_id_resolve_route(event->id, 2000);
    } else if (event->code == RDMA_CM_EVENT_ROUTE_RESOLVED) {
      ibev_qp* qp = self->make_qp(event->id);
      if (qp == nullptr) return;
      {
        std::lock_guard<std::mutex> lock(self->mutex);
        self->client_qp = qp;
      }
      ibev_cm_connect_attr attr;
      ibev_cm_connect_attr_init(&attr);
      attr.private_data = "hello";
      attr.private_data_length = 5;
      error = ibev_cm_id_connect(event->id, qp, &attr);
    }
    if (error != 0) {
      std::lock_guard<std::mutex> lock(self->mutex);
      self->failed(event->name);
    }
  }

  Sides& sides;
  char server_buffer[64] = {};
  char client_buffer[64] = {};
  Owned<ibev_mr, ibev_mr_destroy> server_mr;
  Owned<ibev_mr, ibev_mr_destroy> client_mr;
  ibev_cm_id* listener = nullptr;
  ibev_cm_id* client = nullptr;
  std::mutex mutex;
  ibev_cm_id* accepted = nullptr;
  ibev_qp* client_qp = nullptr;
  std::vector<ibev_qp*> qps;
  std::vector<ibev_cq*> cqs;
  std::vector<std::string> devices_named;
  std::vector<std::string> events;
  std::vector<std::string> failures;
  std::vector<ibv_wc> completions;
  std::string request_data;
};

}  // namespace

BOOST_AUTO_TEST_SUITE(capi_cm)

BOOST_AUTO_TEST_CASE(bare_cm_ids_connect_carry_a_message_and_both_hear_the_disconnect) {
  Sides sides;
  IdPair pair(sides);
  pair.listener = ibev_cm_id_create(sides.channel.get(), &IdPair::on_server, &pair);
  BOOST_REQUIRE_MESSAGE(pair.listener, ibev_last_error());
  BOOST_REQUIRE_EQUAL(ibev_cm_id_listen(pair.listener, cm_host().c_str(), 0, 8), 0);
  char text[64];
  size_t length = 0;
  BOOST_REQUIRE_EQUAL(ibev_cm_id_local_address(pair.listener, text, sizeof text, &length), 0);
  const std::string bound(text);
  BOOST_TEST(length == bound.size());
  BOOST_REQUIRE_MESSAGE(bound.rfind("[" + cm_host() + "]:", 0) == 0, bound);  // fd00::1
  const auto port = static_cast<uint16_t>(std::stoi(bound.substr(bound.rfind(':') + 1)));
  BOOST_REQUIRE(port != 0);

  pair.client = ibev_cm_id_create(sides.channel.get(), &IdPair::on_client, &pair);
  BOOST_REQUIRE_MESSAGE(pair.client, ibev_last_error());
  // A channel's C reference may go before its ids: the id keeps it.
  sides.channel.reset();
  BOOST_REQUIRE_EQUAL(
      ibev_cm_id_resolve_addr(pair.client, nullptr, cm_host().c_str(), port, 2000), 0);
  BOOST_REQUIRE(eventually([&] { return pair.has("client RDMA_CM_EVENT_ESTABLISHED"); }));
  BOOST_REQUIRE(eventually([&] { return pair.has("accepted RDMA_CM_EVENT_ESTABLISHED"); }));
  {
    std::lock_guard<std::mutex> lock(pair.mutex);
    BOOST_REQUIRE_MESSAGE(pair.failures.empty(), joined(pair.failures));
    BOOST_TEST(pair.request_data == "hello");
    BOOST_REQUIRE_EQUAL(pair.devices_named.size(), 2u);
    for (const std::string& name : pair.devices_named) BOOST_TEST(name == test_device());
  }
  BOOST_TEST(ibev_cm_id_port_num(pair.client) == 1);
  BOOST_TEST(std::string(ibev_cm_id_device_name(pair.client)) == test_device());
  BOOST_REQUIRE_EQUAL(ibev_cm_id_peer_address(pair.client, text, sizeof text, nullptr), 0);
  BOOST_TEST(std::string(text) == bound);
  BOOST_REQUIRE_EQUAL(ibev_cm_id_local_address(pair.client, text, sizeof text, nullptr), 0);
  const std::string client_bound(text);
  BOOST_REQUIRE_EQUAL(ibev_cm_id_peer_address(pair.accepted, text, sizeof text, nullptr), 0);
  BOOST_TEST(std::string(text) == client_bound);

  // One message, client to server, over the QPs the ids connected.
  std::strcpy(pair.client_buffer, "ping");
  ibv_sge sge{reinterpret_cast<uintptr_t>(pair.client_buffer), 5,
              ibev_mr_get(pair.client_mr.get())->lkey};
  ibv_send_wr wr{};
  wr.wr_id = 2;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  BOOST_REQUIRE_EQUAL(ibv_post_send(ibev_qp_get(pair.client_qp), &wr, &bad), 0);
  BOOST_REQUIRE(eventually([&] {
    std::lock_guard<std::mutex> lock(pair.mutex);
    return pair.completions.size() == 2u;
  }));
  {
    std::lock_guard<std::mutex> lock(pair.mutex);
    for (const ibv_wc& wc : pair.completions) BOOST_TEST(wc.status == IBV_WC_SUCCESS);
    BOOST_TEST(std::string(pair.server_buffer) == "ping");
  }

  // The client's disconnect: the server hears it and answers, the client
  // hears the answer.
  BOOST_REQUIRE_EQUAL(ibev_cm_id_disconnect(pair.client), 0);
  BOOST_REQUIRE(eventually([&] { return pair.has("accepted RDMA_CM_EVENT_DISCONNECTED"); }));
  BOOST_REQUIRE(eventually([&] { return pair.has("client RDMA_CM_EVENT_DISCONNECTED"); }));
  std::lock_guard<std::mutex> lock(pair.mutex);
  BOOST_TEST(pair.failures.empty(), joined(pair.failures));
  BOOST_TEST(pair.accepted == nullptr);  // destroyed by its own handler
}

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
    for (int error : sides.lent_disconnects) BOOST_TEST(error == EINVAL);
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
