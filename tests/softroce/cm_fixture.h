// rdma_cm helpers for the soft-RoCE tests, written as an application writes
// them with ibev: an Endpoint (CQ, QP, registered buffer) on the id's
// device, text messages over it, a Server whose listener accepts or rejects,
// and a Client that resolves, connects and answers a disconnect. Each names
// the events it hears in a Lines log ("client: ESTABLISHED"), and what went
// wrong in its handlers too ("client: on the wrong device, rxe1"): Boost.Test
// asserts only on the test's own thread.
#ifndef IBEV_TESTS_SOFTROCE_CM_FIXTURE_H_
#define IBEV_TESTS_SOFTROCE_CM_FIXTURE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ibev/cm/cm_id.h>

#include "tests/softroce/verbs_fixture.h"

namespace ibev::testing {

// The address of the test device's netdev, and of the second device's
// (softroce_run.sh gives them).
std::string cm_host();
std::string cm_host2();

// Gives the test netdev cm_host() (softroce_run.sh leaves a lone device's
// d0 without it) and waits until the device's GID table has it, so that
// rdma_cm finds the device by that address. Throws when it never comes.
void give_netdev_its_address();

// With two devices (softroce_run.sh --devices 2): the harness's policy
// routes, which send cm_host2() out of the first veth end and cm_host() out
// of the second, made again. IPv6 drops a route with its netdev's link, so
// a test that plugs a cable in again calls this, as routing would come back
// with a real cable.
void put_back_policy_routes();

// A global fixture (BOOST_TEST_GLOBAL_FIXTURE): give_netdev_its_address()
// once, before the first case.
struct NetdevAddress {
  NetdevAddress() { give_netdev_its_address(); }
};

// "ESTABLISHED", "REJECTED 28": what a log line says of an event.
std::string said(const CmEvent& event);
// "a, b, c".
std::string joined(const std::vector<std::string>& lines);

// One end of a connection: an event-mode CQ whose completions go to
// `on_completion` (on the dispatching thread; set it before the first
// post), an RC QP whose async events go to `qp_events`, and one buffer the
// peer may read and write.
struct Endpoint {
  explicit Endpoint(Env& env, std::size_t bytes = 4096);
  std::shared_ptr<QueuePair> make_qp(Env& env);

  char* at(std::size_t offset) { return memory.data() + offset; }
  std::uint64_t address(std::size_t offset);
  void post_recv(std::size_t offset, std::uint32_t length, std::uint64_t wr_id);
  // A signaled SEND, or RDMA READ/WRITE of the peer's `remote`/`rkey`.
  void post(ibv_wr_opcode opcode, std::size_t offset, std::uint32_t length, std::uint64_t wr_id,
            std::uint64_t remote = 0, std::uint32_t rkey = 0);

  std::vector<char> memory;
  std::function<void(const ibv_wc&)> on_completion = [](const ibv_wc&) {};
  Lines qp_events;  // the QP's async events, by enumerator
  std::shared_ptr<MemoryRegion> mr;
  std::shared_ptr<CompletionQueue> cq;
  std::shared_ptr<QueuePair> qp;
};

// Text messages over an Endpoint: slot 0 sends, slots 1..4 receive; its log
// says "received TEXT", or "error STATUS" for a failed completion (flushes
// are not errors: "flushed").
struct Messenger {
  explicit Messenger(Env& env);
  // Takes the QP to INIT through `id` and posts the receives.
  void start(CmId& id);
  void send(const std::string& text);

  static constexpr std::size_t kSlot = 64;
  Lines log;  // before the endpoint: its CQ's handler writes here until it goes
  Endpoint endpoint;
};

// A listener on `host` whose handler accepts (or rejects, with private data
// "busy") each request with a Messenger of its own, names each new id
// "child<N>" (N from the request's private data, else the arrival order),
// answers DISCONNECTED with disconnect() and DEVICE_REMOVAL with close();
// the listener's own lines are "listener: ...".
class Server {
 public:
  enum class Policy { kAccept, kReject };

  Server(Env& env, std::shared_ptr<CmEventChannel> channel, Lines& log,
         Policy policy = Policy::kAccept, const std::string& host = cm_host());
  ~Server();

  std::uint16_t port() const { return listener_->local_address().port(); }
  // The child named `name`, or null.
  Messenger* messenger(const std::string& name);
  CmId* child(const std::string& name);

 private:
  struct Child {
    std::string name;
    std::shared_ptr<CmId> id;
    std::unique_ptr<Messenger> messenger;
  };
  void heard(const CmEvent& event);
  void request(const CmEvent& event);

  Env& env_;
  Lines& log_;
  const Policy policy_;
  std::shared_ptr<CmId> listener_;
  int arrivals_ = 0;  // the dispatching thread's
  std::mutex mutex_;
  std::vector<Child> children_;
};

// An id that resolves `host`:`port` (from `source`, if given), then the
// route, then connects its Messenger's QP (with `private_data`), answers
// DISCONNECTED with disconnect() and DEVICE_REMOVAL with close(); `name:
// EVENT` lines to `log`.
struct Client {
  Client(Env& env, const std::shared_ptr<CmEventChannel>& channel, Lines& log,
         std::string client_name, std::uint16_t port, std::vector<std::uint8_t> private_data = {},
         const std::string& host = cm_host(), const std::string& source = {});

  std::string name;
  Messenger messenger;
  std::string rejection;  // REJECTED's private data: set before the line is logged
  std::shared_ptr<CmId> id;
};

}  // namespace ibev::testing

#endif  // IBEV_TESTS_SOFTROCE_CM_FIXTURE_H_
