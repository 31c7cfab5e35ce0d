// A consumer of ibev: attaches a QP handler and a port listener, injects two
// events through a Dispatcher it drives itself, and checks who heard what.
// Exits 0 on success; prints "1 passed, 0 failed" for the test runner.
#include <cstdio>

#include <ibev/core/registry.h>
#include <ibev/dispatch/dispatcher.h>

int main() {
  ibev::Registry registry;
  ibev::Dispatcher dispatcher(registry);
  ibv_context device{};  // stand-ins: only their addresses are used here
  ibv_qp qp{};
  int qp_events = 0, port_events = 0;
  ibev::Attachment on_qp =
      registry.attach(&qp, [&](const ibev::Event& e) { qp_events += e.qp() == &qp; });
  ibev::Attachment on_port = registry.listen(
      &device, [&](const ibev::Event& e) { port_events += e.port() == 1; },
      ibev::EventFilter{IBV_EVENT_PORT_ERR});
  dispatcher.inject(&device, IBV_EVENT_COMM_EST, &qp);
  dispatcher.inject(&device, IBV_EVENT_PORT_ERR, ibev::Port{1});
  dispatcher.run_once(std::chrono::milliseconds(1000));
  const bool ok = qp_events == 1 && port_events == 1;
  std::printf("consumer: qp heard %d, port listener heard %d\n%d passed, %d failed\n",
              qp_events, port_events, ok ? 1 : 0, ok ? 0 : 1);
  return ok ? 0 : 1;
}
