// The ibev demo: every async event type, each shown with the handler that
// heard it. The six soft-RoCE raises are triggered for real (netdev flap, GID
// change, CQ overflow, SRQ limit, SQ drain); the fourteen it never raises are
// injected on the same objects, through the same routing. Then the device is
// deleted while the demo holds it (the delete returns: ibev lets go) and
// re-added (a device client makes new objects on it and traffic resumes).
// Then a connection through the RDMA connection manager on the re-added
// device: the CM events, each with the id's handler that heard it. Last, a
// session through the CM that heals by itself when the link flaps.
//
//   demo [DEVICE [NETDEV]]     (default: $IBEV_TEST_DEVICE or rxe0, and
//                               $IBEV_TEST_NETDEV or d0; needs root)
//
// Exits 0 when every event reached exactly the handler the kernel model says.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <ibev/cm/cm_id.h>
#include <ibev/cm/cm_session.h>
#include <ibev/verbs/completion_queue.h>
#include <ibev/verbs/device.h>
#include <ibev/verbs/device_clients.h>
#include <ibev/verbs/protection_domain.h>
#include <ibev/verbs/queue_pair.h>
#include <ibev/verbs/shared_receive_queue.h>

namespace {

using namespace std::chrono_literals;

// Who heard what, in arrival order; thread-safe, with a bounded wait.
class RoutingTable {
 public:
  ibev::Handler handler(const std::string& who) {
    return [this, who](const ibev::Event& event) {
      const auto* info = ibev::find_event_type(event.code());
      const std::string raised = event.loss() != ibev::DeviceLoss::kNone && event.synthesized()
                                     ? "ibev: " + std::string(ibev::to_string(event.loss()))
                                 : event.synthesized() ? "injected"
                                                       : "kernel";
      add({event.code(), std::string(info->enumerator), std::string(ibev::to_string(info->element)),
           raised, who});
    };
  }

  // A device client's add or remove, as a row of its own.
  void note(const std::string& what, const std::string& raised, const std::string& who) {
    add({-1, what, "device", raised, who});
  }
  // A CM event, as a row of its own: what it names, by kCmEventTypes.
  void cm(const ibev::CmEvent& event, const std::string& who) {
    const ibev::CmEventTypeInfo* info = event.info();
    add({-1, event.name(), info != nullptr ? std::string(ibev::to_string(info->scope)) : "?",
         "rdma_cm", who});
  }
  // The CM rows, as "who: EVENT", in order.
  std::vector<std::string> cm_rows() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::string> found;
    for (const Row& row : rows_) {
      if (row.raised == "rdma_cm") found.push_back(row.who + ": " + row.event);
    }
    return found;
  }

  bool wait_for(int code, const std::string& who) {
    return wait_for_row([&](const Row& row) { return row.code == code && row.who == who; });
  }
  bool wait_for_note(const std::string& what, const std::string& who, int times = 1) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, 10s, [&] {
      int seen = 0;
      for (const Row& row : rows_) seen += row.event == what && row.who == who ? 1 : 0;
      return seen >= times;
    });
  }

  // One line per (event, handler), first arrival first, with a count.
  void print() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::pair<const Row*, int>> lines;
    for (const Row& row : rows_) {
      bool merged = false;
      for (auto& [first, count] : lines) {
        if (row.code < 0) break;  // each add and remove in its place
        if (first->event == row.event && first->who == row.who && first->raised == row.raised) {
          ++count;
          merged = true;
        }
      }
      if (!merged) lines.push_back({&row, 1});
    }
    std::printf("\n%-3s %-30s %-8s %-13s %s\n", "", "event", "element", "raised", "heard by");
    int n = 0;
    for (const auto& [row, count] : lines) {
      std::printf("%-3d %-30s %-8s %-13s %s%s\n", ++n, row->event.c_str(), row->element.c_str(),
                  row->raised.c_str(), row->who.c_str(),
                  count > 1 ? (" (x" + std::to_string(count) + ")").c_str() : "");
    }
  }

  // Every row's handler is the expected one for its event.
  bool only(const std::map<int, std::string>& expected) {
    std::lock_guard<std::mutex> lock(mutex_);
    bool ok = true;
    for (const Row& row : rows_) {
      if (row.code < 0) continue;  // a client's add or remove
      auto it = expected.find(row.code);
      if (it == expected.end() || it->second != row.who) {
        std::printf("UNEXPECTED: event %d heard by %s\n", row.code, row.who.c_str());
        ok = false;
      }
    }
    return ok;
  }

 private:
  struct Row {
    int code;  // -1: a device client's add or remove
    std::string event;
    std::string element;
    std::string raised;
    std::string who;
  };

  void add(Row row) {
    std::lock_guard<std::mutex> lock(mutex_);
    rows_.push_back(std::move(row));
    changed_.notify_all();
  }
  template <typename Match>
  bool wait_for_row(const Match& match) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, 10s, [&] {
      return std::any_of(rows_.begin(), rows_.end(), match);
    });
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Row> rows_;
};

std::string arg_or_env(int argc, char** argv, int index, const char* env,
                       const char* fallback) {
  if (argc > index) return argv[index];
  const char* value = std::getenv(env);
  return value != nullptr && *value != '\0' ? value : fallback;
}

void shell(const std::string& command) {
  std::printf("  $ %s\n", command.c_str());
  if (std::system(command.c_str()) != 0) {
    std::printf("  (failed)\n");
  }
}

void send(ibev::QueuePair& qp, const ibev::MemoryRegion& mr, char* slot) {
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(slot), 64, mr.lkey()};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  ibv_post_send(qp.get(), &wr, &bad);
}

void receive(ibv_srq* srq, ibv_qp* qp, const ibev::MemoryRegion& mr, char* slot) {
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(slot), 64, mr.lkey()};
  ibv_recv_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  if (srq != nullptr) {
    ibv_post_srq_recv(srq, &wr, &bad);
  } else {
    ibv_post_recv(qp, &wr, &bad);
  }
}

// What a device client makes on each device it is given: a connected QP
// pair whose completions it counts.
struct Connection {
  explicit Connection(const std::shared_ptr<ibev::Device>& device, std::atomic<int>& completions)
      : pd(ibev::ProtectionDomain::create(device)) {
    cq = ibev::CompletionQueue::create(
        device, [&completions](const ibev::CompletionBatch& batch) { completions += static_cast<int>(batch.size); },
        nullptr);
    ibev::QueuePair::Options options;
    options.send_cq = options.recv_cq = cq;
    options.signal_all = true;
    a = ibev::QueuePair::create(pd, nullptr, options);
    b = ibev::QueuePair::create(pd, nullptr, options);
    ibev::connect_rc_pair(*a, *b);
    mr = ibev::MemoryRegion::create(pd, buffer.data(), buffer.size(), IBV_ACCESS_LOCAL_WRITE);
  }
  void exchange(int messages) {
    for (int i = 0; i < messages; ++i) receive(nullptr, b->get(), *mr, buffer.data() + 64 * i);
    for (int i = 0; i < messages; ++i) send(*a, *mr, buffer.data() + 64 * i);
  }

  std::array<char, 64 * 8> buffer{};
  std::shared_ptr<ibev::ProtectionDomain> pd;
  std::shared_ptr<ibev::CompletionQueue> cq;
  std::shared_ptr<ibev::QueuePair> a, b;
  std::shared_ptr<ibev::MemoryRegion> mr;
};

// A client and a server id on one device, connected through the CM (rxe
// carries it by loopback), then disconnected by the client. True when each
// id heard exactly its events.
bool connect_through_the_cm(ibev::Dispatcher& dispatcher, const std::string& device_name,
                            const std::string& address, RoutingTable& table) {
  auto device = ibev::Device::open(dispatcher, device_name);
  auto pd = ibev::ProtectionDomain::create(device);
  auto cq = ibev::CompletionQueue::create_polled(device, nullptr);
  ibev::QueuePair::Options options;
  options.send_cq = options.recv_cq = cq;
  auto client_qp = ibev::QueuePair::create(pd, nullptr, options);
  auto server_qp = ibev::QueuePair::create(pd, nullptr, options);
  auto channel = ibev::CmEventChannel::create(dispatcher);

  std::shared_ptr<ibev::CmId> listener, server;  // server: the listener's new id
  listener = ibev::CmId::create(channel, [&](const ibev::CmEvent& event) {
    table.cm(event, event.id == listener.get() ? "CM listener" : "CM server id");
    switch (event.code) {
      case RDMA_CM_EVENT_CONNECT_REQUEST:
        server = event.new_id;
        server->init_qp(*server_qp);
        server->accept(server_qp);
        break;
      case RDMA_CM_EVENT_DISCONNECTED:
        event.id->disconnect();  // the answer the client's disconnect waits for
        break;
      default:
        break;
    }
  });
  listener->listen(ibev::CmAddress::parse(address, 0), 4);
  auto client = ibev::CmId::create(channel, [&](const ibev::CmEvent& event) {
    table.cm(event, "CM client");
    if (event.code == RDMA_CM_EVENT_ADDR_RESOLVED) {
      event.id->resolve_route(2000ms);
    } else if (event.code == RDMA_CM_EVENT_ROUTE_RESOLVED) {
      event.id->init_qp(*client_qp);
      event.id->connect(client_qp);
    }
  });
  client->resolve_addr(nullptr,
                       ibev::CmAddress::parse(address, listener->local_address().port()),
                       2000ms);
  bool ok = table.wait_for_note("RDMA_CM_EVENT_ESTABLISHED", "CM client") &&
            table.wait_for_note("RDMA_CM_EVENT_ESTABLISHED", "CM server id");
  std::printf("  connected: %s\n", ok ? "yes" : "NO");
  if (ok) client->disconnect();
  ok = table.wait_for_note("RDMA_CM_EVENT_TIMEWAIT_EXIT", "CM client") &&
       table.wait_for_note("RDMA_CM_EVENT_TIMEWAIT_EXIT", "CM server id") && ok;
  client->close();
  if (server) server->close();
  listener->close();

  const std::vector<std::string> expected{
      "CM client: RDMA_CM_EVENT_ADDR_RESOLVED",    "CM client: RDMA_CM_EVENT_ROUTE_RESOLVED",
      "CM listener: RDMA_CM_EVENT_CONNECT_REQUEST", "CM client: RDMA_CM_EVENT_ESTABLISHED",
      "CM server id: RDMA_CM_EVENT_ESTABLISHED",   "CM client: RDMA_CM_EVENT_DISCONNECTED",
      "CM server id: RDMA_CM_EVENT_DISCONNECTED",  "CM client: RDMA_CM_EVENT_TIMEWAIT_EXIT",
      "CM server id: RDMA_CM_EVENT_TIMEWAIT_EXIT"};
  std::vector<std::string> heard = table.cm_rows(), wanted = expected;
  std::sort(heard.begin(), heard.end());
  std::sort(wanted.begin(), wanted.end());
  if (heard != wanted) {
    std::printf("  UNEXPECTED CM events:");
    for (const auto& row : table.cm_rows()) std::printf(" [%s]", row.c_str());
    std::printf("\n");
    ok = false;
  }
  return ok;
}

// A session through the CM (cm/cm_session.h) that heals by itself: a client
// session and the acceptor's on one device, a message each way, the netdev
// taken down for a second and brought back. Each side hears one outage
// (down, recovering, up; a failed attempt, if one fails, in between), its
// session made again on new QPs by ibev, and a message goes through after.
bool heal_a_session(ibev::Dispatcher& dispatcher, const std::string& device_name,
                    const std::string& netdev, const std::string& address) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto device = ibev::Device::open(dispatcher, device_name);
  auto pd = ibev::ProtectionDomain::create(device);
  std::array<char, 64 * 8> buffer{};
  auto mr = ibev::MemoryRegion::create(pd, buffer.data(), buffer.size(), IBV_ACCESS_LOCAL_WRITE);
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::string> lines;
  int received = 0;
  std::shared_ptr<ibev::CmSession> client, server;
  std::vector<std::weak_ptr<ibev::QueuePair>> made_qps;
  auto note = [&](const std::string& line) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    std::printf("  %6lld ms  %s\n", static_cast<long long>(ms.count()), line.c_str());
    std::lock_guard<std::mutex> lock(mutex);
    lines.push_back(line);
    changed.notify_all();
  };
  auto wait_until = [&](auto done) {
    std::unique_lock<std::mutex> lock(mutex);
    return changed.wait_for(lock, 20s, [&] { return done(); });
  };
  auto count = [&](const std::string& line) {
    return std::count(lines.begin(), lines.end(), line);
  };
  auto cq = ibev::CompletionQueue::create(
      device,
      [&](const ibev::CompletionBatch& batch) {
        std::shared_ptr<ibev::CmSession> sides[2];
        {
          std::lock_guard<std::mutex> lock(mutex);
          sides[0] = client;
          sides[1] = server;
        }
        for (const ibv_wc& wc : batch) {
          for (auto& side : sides) {
            if (side) side->health().completion(wc);  // each hears its own QP's
          }
          if (wc.status == IBV_WC_SUCCESS && (wc.opcode & IBV_WC_RECV) != 0) {
            {
              std::lock_guard<std::mutex> lock(mutex);
              ++received;
            }
            note("server received: " + std::string(buffer.data() + 64 * wc.wr_id));
          }
        }
      },
      nullptr);
  // Each attempt's QP: made, taken to INIT by the id, its receives posted.
  const ibev::MakeQp make_qp = [&](ibev::CmId& id, const ibev::RecoveryAttempt&) {
    ibev::QueuePair::Options options;
    options.send_cq = options.recv_cq = cq;
    auto qp = ibev::QueuePair::create(pd, nullptr, options);
    id.init_qp(*qp);
    for (std::uint64_t slot = 1; slot <= 4; ++slot) {
      ibv_sge sge{reinterpret_cast<std::uintptr_t>(buffer.data() + 64 * slot), 64, mr->lkey()};
      ibv_recv_wr wr{};
      wr.wr_id = slot;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      qp->post_recv(wr);
    }
    std::lock_guard<std::mutex> lock(mutex);
    made_qps.push_back(qp);
    return qp;
  };
  auto send = [&](const std::string& text) {
    std::snprintf(buffer.data(), 64, "%s", text.c_str());
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(buffer.data()),
                static_cast<std::uint32_t>(text.size() + 1), mr->lkey()};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    client->health().post_send(wr);
  };
  auto told = [&](const std::string& side, const ibev::HealthChange& change) {
    std::string line = side + ": " + std::string(ibev::to_string(change.to));
    if (change.to == ibev::ConnectionState::kDown) line += " (" + change.cause.what + ")";
    note(line);
  };

  auto channel = ibev::CmEventChannel::create(dispatcher);
  ibev::CmAcceptor::Options accepting;
  accepting.make_qp = make_qp;
  auto acceptor = ibev::CmAcceptor::listen(
      channel, ibev::CmAddress::parse(address, 0),
      [&](const std::shared_ptr<ibev::CmSession>& session) {
        std::lock_guard<std::mutex> lock(mutex);
        server = session;
      },
      [&](std::uint64_t, const ibev::HealthChange& change) { told("server", change); },
      accepting);
  ibev::CmSession::Options connecting;
  connecting.id = 7;
  connecting.make_qp = make_qp;
  auto made = ibev::CmSession::connect(
      channel, ibev::CmAddress::parse(address, acceptor->local_address().port()),
      [&](const ibev::HealthChange& change) { told("client", change); }, connecting);
  {
    std::lock_guard<std::mutex> lock(mutex);
    client = made;
  }
  bool ok = wait_until([&] { return count("client: up") == 1 && count("server: up") == 1; });
  if (ok) send("before the flap");
  ok = ok && wait_until([&] { return received == 1; });

  shell("sysctl -qw net.ipv6.conf." + netdev + ".keep_addr_on_down=1");
  shell("ip link set " + netdev + " down");
  std::this_thread::sleep_for(1s);
  note("the netdev comes back");
  shell("ip link set " + netdev + " up");
  ok = ok && wait_until([&] { return count("client: up") == 2 && count("server: up") == 2; });
  if (ok) send("after the flap");
  ok = ok && wait_until([&] { return received == 2; });
  const bool one_outage_each = count("client: down (IBV_EVENT_PORT_ERR)") == 1 &&
                               count("server: down (IBV_EVENT_PORT_ERR)") == 1;
  std::printf("  healed: %s\n", ok && one_outage_each ? "yes" : "NO");
  // The end, in this order. The acceptor first: once close() returns, no
  // new session is handed over. Then the client: a server session closed
  // under a live client hangs it up, and the client would connect again
  // and be handed a new session, which `server` would keep beyond the
  // teardown. Then the sessions, let go after the lock (a closing session
  // waits for its handler, which takes the lock).
  acceptor->close();
  made->close();
  std::shared_ptr<ibev::CmSession> client_side, server_side;
  {
    std::lock_guard<std::mutex> lock(mutex);
    client_side.swap(client);
    server_side.swap(server);
  }
  server_side.reset();
  client_side.reset();
  made.reset();
  // Proves an absence: time for a reconnect that the order above rules out.
  std::this_thread::sleep_for(500ms);
  bool none_after = false;
  {
    std::lock_guard<std::mutex> lock(mutex);
    none_after = client == nullptr && server == nullptr;
  }
  std::printf("  no session after the end: %s\n", none_after ? "yes" : "NO");
  // The QPs go with their sessions (a drain may hold one a moment); then
  // the CQ, whose handler uses this function's locals, stops for good.
  std::vector<std::weak_ptr<ibev::QueuePair>> qps;
  {
    std::lock_guard<std::mutex> lock(mutex);
    qps.swap(made_qps);
  }
  const auto until = Clock::now() + 10s;
  bool all_gone = true;
  for (const auto& qp : qps) {
    while (!qp.expired() && Clock::now() < until) std::this_thread::sleep_for(10ms);
    all_gone = all_gone && qp.expired();
  }
  if (!all_gone) std::printf("  a QP outlived its session by 10 s\n");
  cq->close();
  return ok && one_outage_each && none_after && all_gone;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string device_name = arg_or_env(argc, argv, 1, "IBEV_TEST_DEVICE", "rxe0");
  const std::string netdev = arg_or_env(argc, argv, 2, "IBEV_TEST_NETDEV", "d0");

  ibev::Dispatcher dispatcher;
  ibev::Registry& registry = dispatcher.registry();
  RoutingTable table;
  auto device = ibev::Device::open(dispatcher, device_name);
  std::printf("ibev demo on %s (netdev %s)\n", device->name().c_str(), netdev.c_str());

  // The kernel's model: every object takes its handler when it is made.
  ibev::Handle listener = device->on_event({}, table.handler("device listener"));
  auto pd = ibev::ProtectionDomain::create(device);
  ibev::CompletionQueue::Options one_entry;
  one_entry.cqe = 1;
  auto tiny_cq = ibev::CompletionQueue::create_polled(device, table.handler("tiny CQ"), one_entry);
  ibev::CompletionQueue::Options roomy;
  roomy.cqe = 256;
  auto cq = ibev::CompletionQueue::create_polled(device, table.handler("main CQ"), roomy);
  auto srq = ibev::SharedReceiveQueue::create(pd, table.handler("SRQ"));
  ibev::QueuePair::Options a_opts, b_opts, c_opts;
  a_opts.send_cq = a_opts.recv_cq = cq;
  b_opts.send_cq = b_opts.recv_cq = cq;
  b_opts.srq = srq;
  c_opts.send_cq = tiny_cq;
  c_opts.recv_cq = cq;
  auto a = ibev::QueuePair::create(pd, table.handler("QP a"), a_opts);
  auto b = ibev::QueuePair::create(pd, table.handler("QP b"), b_opts);
  auto c = ibev::QueuePair::create(pd, table.handler("QP c"), c_opts);
  auto d = ibev::QueuePair::create(pd, table.handler("QP d"), a_opts);
  ibev::connect_rc_pair(*a, *b);
  ibev::connect_rc_pair(*c, *d);
  std::array<char, 64 * 32> buffer{};
  auto mr = ibev::MemoryRegion::create(pd, buffer.data(), buffer.size(), IBV_ACCESS_LOCAL_WRITE);
  auto slot = [&](int i) { return buffer.data() + 64 * i; };
  dispatcher.start();

  bool ok = true;
  auto expect = [&](int code, const std::string& who) {
    if (!table.wait_for(code, who)) {
      std::printf("  MISSING: %s never heard %s\n", who.c_str(),
                  std::string(ibev::find_event_type(code)->enumerator).c_str());
      ok = false;
    }
  };

  std::printf("\nRaised by the kernel:\n");
  shell("ip link set " + netdev + " down");
  expect(IBV_EVENT_PORT_ERR, "device listener");
  shell("ip link set " + netdev + " up");
  expect(IBV_EVENT_PORT_ACTIVE, "device listener");
  const std::string cm_address = "fd00::d:1";  // also where the CM connects, later
  shell("ip -6 addr add " + cm_address + "/64 dev " + netdev + " nodad");
  expect(IBV_EVENT_GID_CHANGE, "device listener");

  std::printf("  CQ overflow: 4 signaled sends on QP c, whose send CQ holds 1\n");
  for (int i = 0; i < 4; ++i) receive(nullptr, d->get(), *mr, slot(20 + i));
  for (int i = 0; i < 4; ++i) send(*c, *mr, slot(i));
  expect(IBV_EVENT_CQ_ERR, "tiny CQ");

  std::printf("  SRQ limit: 8 receives posted, limit armed at 4, 5 messages consumed\n");
  for (int i = 0; i < 8; ++i) receive(srq->get(), nullptr, *mr, slot(8 + i));
  srq->arm_limit(4);
  for (int i = 0; i < 5; ++i) send(*a, *mr, slot(i));
  expect(IBV_EVENT_SRQ_LIMIT_REACHED, "SRQ");

  std::printf("  SQ drain: QP a moved from RTS to SQD\n");
  a->drain_send_queue();
  expect(IBV_EVENT_SQ_DRAINED, "QP a");

  std::printf("\nInjected with Dispatcher::inject (soft-RoCE never raises these), on\n"
              "QP b, the SRQ, port 1 and the device, through the same routing.\n");
  // rxe has no WQs (ibv_create_wq: EOPNOTSUPP): WQ_FATAL names a stand-in.
  ibv_wq stand_in_wq{};
  ibev::Handle wq_handler = registry.attach(&stand_in_wq, table.handler("WQ (stand-in)"));
  std::map<int, std::string> expected{
      {IBV_EVENT_PORT_ERR, "device listener"},   {IBV_EVENT_PORT_ACTIVE, "device listener"},
      {IBV_EVENT_GID_CHANGE, "device listener"}, {IBV_EVENT_CQ_ERR, "tiny CQ"},
      {IBV_EVENT_SRQ_LIMIT_REACHED, "SRQ"},      {IBV_EVENT_SQ_DRAINED, "QP a"}};
  for (const ibev::EventTypeInfo& info : ibev::kEventTypes) {
    if (expected.count(info.type) != 0) continue;
    ibv_context* context = device->context();
    std::string who;
    switch (info.element) {
      case ibev::ElementKind::kQp:
        dispatcher.inject(context, info.type, b->get());
        who = "QP b";
        break;
      case ibev::ElementKind::kSrq:
        dispatcher.inject(context, info.type, srq->get());
        who = "SRQ";
        break;
      case ibev::ElementKind::kWq:
        dispatcher.inject(context, info.type, &stand_in_wq);
        who = "WQ (stand-in)";
        break;
      case ibev::ElementKind::kPort:
        dispatcher.inject(context, info.type, ibev::Port{1});
        who = "device listener";
        break;
      case ibev::ElementKind::kDevice:
        dispatcher.inject(context, info.type, ibev::WholeDevice{});
        who = "device listener";
        break;
      case ibev::ElementKind::kCq:
        dispatcher.inject(context, info.type, cq->get());
        who = "main CQ";
        break;
    }
    expected[info.type] = who;
    expect(info.type, who);
  }
  std::this_thread::sleep_for(300ms);  // late duplicates show in the table

  std::printf("\nThe device deleted while the demo holds it (QPs, CQs, an SRQ), then\n"
              "re-added: a device client (the kernel's ib_client) is told of both.\n");
  std::atomic<int> completions{0};
  std::unique_ptr<Connection> connection;
  ibev::DeviceClients clients(dispatcher);
  ibev::Handle client = clients.register_client(
      {"app client",
       [&](const std::shared_ptr<ibev::Device>& added) {
         connection = std::make_unique<Connection>(added, completions);
         table.note("add " + added->name(), "ibev (" + added->node() + ")", "app client");
       },
       [&](const std::shared_ptr<ibev::Device>& removed, ibev::DeviceLoss loss) {
         connection.reset();  // what it made on the device goes before it closes
         table.note("remove " + removed->name(), "ibev: " + std::string(ibev::to_string(loss)),
                    "app client");
       }});
  const std::string added_note = "add " + device_name;
  ok = table.wait_for_note(added_note, "app client") && ok;
  const auto deleting = std::chrono::steady_clock::now();
  shell("rdma link delete " + device_name);
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - deleting);
  std::printf("  returned after %lld ms (a process holding the device used to block it for ever)\n",
              static_cast<long long>(took.count()));
  expect(IBV_EVENT_DEVICE_FATAL, "device listener");
  ok = table.wait_for_note("remove " + device_name, "app client") && ok;
  const bool closed = device->context() == nullptr && a->get() == nullptr;
  std::printf("  the demo's Device and objects are closed: %s\n", closed ? "yes" : "NO");
  ok = closed && ok;
  shell("rdma link add " + device_name + " type rxe netdev " + netdev);
  bool resumed = false;
  if (table.wait_for_note(added_note, "app client", 2)) {
    dispatcher.post([&] { connection->exchange(4); });
    for (int i = 0; i < 100 && completions.load() < 8; ++i) std::this_thread::sleep_for(50ms);
    resumed = completions.load() >= 8;
  }
  std::printf("  traffic on the re-added device: %d completions (%s)\n", completions.load(),
              resumed ? "resumed" : "MISSING");
  ok = resumed && ok;

  std::printf("\nA connection through the RDMA connection manager on %s (%s), each id\n"
              "with its handler from creation; the listener's new id reports to its\n"
              "handler, as in the kernel.\n",
              device_name.c_str(), cm_address.c_str());
  ok = connect_through_the_cm(dispatcher, device_name, cm_address, table) && ok;

  std::printf("\nA session through the CM that heals: %s taken down for a second; each\n"
              "side's health, its one handler, hears one outage, and ibev makes the\n"
              "connection again on new QPs.\n",
              netdev.c_str());
  ok = heal_a_session(dispatcher, device_name, netdev, cm_address) && ok;
  client.release();
  dispatcher.stop();
  connection.reset();

  table.print();
  ok = table.only(expected) && ok;
  std::printf("\n%s: %zu event types and the CM's, each heard by the handler it names only.\n",
              ok ? "OK" : "FAILED", expected.size());
  // Objects go before the device; the device before the dispatcher.
  return ok ? 0 : 1;
}
