// A program that uses ibev as any RDMA project would, built from this one
// source three ways: with CMake (examples/consumer-cmake: find_package), with
// make (examples/consumer-make: pkg-config) and with Bazel
// (examples/consumer-bazel: @ibev). docs/consuming.md shows all three.
//
//   consumer          routes two injected events; needs no RDMA device
//   consumer --rdma   then an RC loopback on a real device (IBEV_TEST_DEVICE,
//                     or the first one): a message whose completion reaches
//                     the CompletionQueue's handler on the dispatcher thread
//
// Prints what it checked and "N passed, N failed"; exits 0 when all passed.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <string>

#include <ibev/ibev.h>

// The make consumer builds this once more as C++20: ibev's flags (ibev.pc)
// must leave the language version to the consumer. 0.6's forced -std=c++17.
#ifdef IBEV_EXPECT_CPLUSPLUS
static_assert(__cplusplus == IBEV_EXPECT_CPLUSPLUS,
              "ibev's compile flags changed the consumer's -std");
#endif

namespace {

int passed = 0, failed = 0;

void check(bool ok, const char* what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAILED", what);
  ++(ok ? passed : failed);
}

// A QP handler and a port listener each hear exactly their injected event.
void route_injected_events() {
  ibev::Dispatcher dispatcher;
  ibev::Registry& registry = dispatcher.registry();
  ibv_context device{};  // stand-ins: only their addresses are used here
  ibv_qp qp{};
  int qp_events = 0, port_events = 0;
  ibev::Handle on_qp =
      registry.attach(&qp, [&](const ibev::Event& e) { qp_events += e.qp() == &qp; });
  ibev::Handle on_port = registry.listen(
      &device, ibev::EventFilter{IBV_EVENT_PORT_ERR},
      [&](const ibev::Event& e) { port_events += e.port() == 1; });
  dispatcher.inject(&device, IBV_EVENT_COMM_EST, &qp);
  dispatcher.inject(&device, IBV_EVENT_PORT_ERR, ibev::Port{1});
  dispatcher.run_once(std::chrono::milliseconds(1000));
  check(qp_events == 1, "the QP handler heard COMM_EST once");
  check(port_events == 1, "the port listener heard PORT_ERR once");
}

// Two RC QPs on one device, connected to each other; one message from a to b,
// whose receive completion is delivered to b's CQ handler.
void rc_loopback() {
  const char* name = std::getenv("IBEV_TEST_DEVICE");
  ibev::Dispatcher dispatcher;
  auto device = ibev::Device::open(dispatcher, name != nullptr ? name : "");
  auto pd = ibev::ProtectionDomain::create(device);
  std::promise<std::string> received;
  char buffer[128] = {};
  auto cq = ibev::CompletionQueue::create(
      device,
      [&](const ibev::CompletionBatch& batch) {
        for (const ibv_wc& wc : batch) {
          if (wc.opcode == IBV_WC_RECV) {
            received.set_value(wc.status == IBV_WC_SUCCESS ? buffer + 64
                                                           : ibv_wc_status_str(wc.status));
          }
        }
      },
      nullptr);
  ibev::QueuePair::Options options;
  options.send_cq = options.recv_cq = cq;
  auto a = ibev::QueuePair::create(pd, nullptr, options);
  auto b = ibev::QueuePair::create(pd, nullptr, options);
  ibev::connect_rc_pair(*a, *b);
  auto mr = ibev::MemoryRegion::create(pd, buffer, sizeof buffer, IBV_ACCESS_LOCAL_WRITE);
  dispatcher.start();

  ibv_sge to{reinterpret_cast<std::uintptr_t>(buffer + 64), 64, mr->lkey()};
  ibv_recv_wr recv{};
  recv.sg_list = &to;
  recv.num_sge = 1;
  ibv_recv_wr* bad_recv = nullptr;
  check(ibv_post_recv(b->get(), &recv, &bad_recv) == 0, "ibv_post_recv");
  std::snprintf(buffer, 64, "hello from %s over %s", IBEV_VERSION_STRING,
                device->name().c_str());
  ibv_sge from{reinterpret_cast<std::uintptr_t>(buffer), 64, mr->lkey()};
  ibv_send_wr send{};
  send.sg_list = &from;
  send.num_sge = 1;
  send.opcode = IBV_WR_SEND;
  send.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad_send = nullptr;
  check(ibv_post_send(a->get(), &send, &bad_send) == 0, "ibv_post_send");

  auto arrived = received.get_future();
  const bool in_time = arrived.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  check(in_time, "the receive completion reached the CQ handler");
  if (in_time) {
    const std::string text = arrived.get();
    std::printf("received: %s\n", text.c_str());
    check(text.rfind("hello from ", 0) == 0, "the message arrived intact");
  }
  dispatcher.stop();
}

}  // namespace

int main(int argc, char** argv) {
  std::printf("ibev %s\n", IBEV_VERSION_STRING);
  try {
    route_injected_events();
    if (argc > 1 && std::strcmp(argv[1], "--rdma") == 0) rc_loopback();
  } catch (const std::exception& e) {
    std::printf("FAILED: %s\n", e.what());
    ++failed;
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 && passed > 0 ? 0 : 1;
}
