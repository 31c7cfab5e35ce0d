// Recovery and liveness on soft-RoCE between two devices, as the harness
// makes them with --devices 2 (rxe0 on v0 at fd00::1, rxe1 on v1 at
// fd00::2, the veth pair their cable; docs/softroce.md): the client's
// sessions on rxe0, the server's acceptor on rxe1, each side with a
// Dispatcher of its own, as two hosts would be. Prints one line a round;
// bench/run_recovery.sh runs it in the VM and computes the figures.
//
//   recovery_bench flap ROUNDS
//     The cable pulled for 2 s under traffic (a send every 5 ms): time
//     from the client's PORT_ACTIVE to its session up and to its first
//     send completed after it.
//   recovery_bench silent ROUNDS
//     A 1 s x 3 keepalive on an idle session; the server falls silent
//     (its neighbour entry for the client pointed at a MAC nobody has, as
//     a host that died) at a random phase of the probes: time to down,
//     from before and after the command that silenced it.
//   recovery_bench keepalive_cpu ROUNDS SECONDS CONNECTIONS
//     CONNECTIONS idle RC pairs on rxe0, each with a health: this process's
//     CPU over SECONDS with a 1 s x 3 keepalive on every one, and with none
//     (the baseline, the same pairs and healths), in random order a round.
//   recovery_bench reconnects ROUNDS SECONDS SESSIONS
//     SESSIONS sessions each told QP_FATAL (injected) as soon as it is up,
//     for SECONDS: reconnects completed a second, through the acceptor.
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <ibev/ibev.h>

#include "bench/cpu_time.h"
#include "bench/env_or.h"

using namespace ibev;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

using bench::env_or;
const std::string kClientDevice = env_or("IBEV_TEST_DEVICE", "rxe0");
const std::string kServerDevice = env_or("IBEV_TEST_DEVICE2", "rxe1");
const std::string kServerNetdev = env_or("IBEV_TEST_NETDEV2", "v1");
const std::string kClientAddress = env_or("IBEV_TEST_ADDRESS", "fd00::1");
const std::string kServerAddress = env_or("IBEV_TEST_ADDRESS2", "fd00::2");

void run(const std::string& command) {
  if (std::system(command.c_str()) != 0) throw std::runtime_error("failed: " + command);
}

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

bool wait_until(const std::function<bool()>& condition, Clock::duration limit) {
  const auto until = Clock::now() + limit;
  while (!condition()) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// One side's verbs objects: a device of its Dispatcher, a protection
// domain, 64-byte slots in one memory region, and a CQ whose completions
// go to `completed` (on the dispatching thread).
struct Side {
  Side(const std::string& device_name, std::function<void(const ibv_wc&)> completed)
      : dispatcher(Dispatcher::Options{}),
        device(Device::open(dispatcher, device_name)),
        pd(ProtectionDomain::create(device)),
        memory(kSlots * kSlot),
        mr(MemoryRegion::create(pd, memory.data(), memory.size(), IBV_ACCESS_LOCAL_WRITE)) {
    CompletionQueue::Options options;
    options.cqe = 1024;
    cq = CompletionQueue::create(
        device,
        [completed = std::move(completed)](const CompletionBatch& batch) {
          for (const ibv_wc& wc : batch) completed(wc);
        },
        nullptr, options);
    dispatcher.start();
  }
  ~Side() { dispatcher.stop(); }

  // An RC QP on the CQ, taken to INIT through `id`, kRecvs receives posted.
  std::shared_ptr<QueuePair> make_qp(CmId& id) {
    QueuePairOptions options;
    options.send_cq = cq;
    options.recv_cq = cq;
    options.cap = ibv_qp_cap{256, kRecvs, 1, 1, 0};
    auto qp = QueuePair::create(pd, {}, options);
    id.init_qp(*qp);
    for (std::uint64_t slot = 0; slot < kRecvs; ++slot) post_recv(*qp, slot);
    std::lock_guard<std::mutex> lock(mutex);
    made.push_back(qp);
    return qp;
  }
  void post_recv(QueuePair& qp, std::uint64_t slot) {
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(memory.data() + slot * kSlot), kSlot, mr->lkey()};
    ibv_recv_wr wr{};
    wr.wr_id = slot;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    qp.post_recv(wr);
  }
  // A receive's QP (by number, among the live ones made), to repost on.
  std::shared_ptr<QueuePair> receiver(std::uint32_t qp_num) {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto& weak : made) {
      auto qp = weak.lock();
      if (qp && qp->qp_num() == qp_num) return qp;
    }
    return nullptr;
  }

  static constexpr std::size_t kSlot = 64;
  static constexpr std::size_t kSlots = 512;
  static constexpr std::uint32_t kRecvs = 128;  // slots 0..127; sends use the rest

  Dispatcher dispatcher;
  std::shared_ptr<Device> device;
  std::shared_ptr<ProtectionDomain> pd;
  std::vector<char> memory;
  std::shared_ptr<MemoryRegion> mr;
  std::shared_ptr<CompletionQueue> cq;
  std::mutex mutex;
  std::vector<std::weak_ptr<QueuePair>> made;
};

RecoveryPolicy quick(unsigned max_recoveries) {
  RecoveryPolicy policy;
  policy.first_delay = 50ms;
  policy.max_delay = 400ms;
  policy.give_up_after = 60s;
  policy.max_recoveries = max_recoveries;
  policy.window = 1ms;
  return policy;
}

// The two hosts: a server (an acceptor on rxe1 that keeps its sessions and
// reposts receives) and `sessions` client sessions on rxe0 to it.
class Hosts {
 public:
  Hosts(unsigned sessions, std::chrono::milliseconds keepalive, unsigned max_recoveries,
        std::function<void(unsigned, const HealthChange&)> on_change = {})
      : server_(kServerDevice, [this](const ibv_wc& wc) { server_completed(wc); }),
        client_(kClientDevice, [this](const ibv_wc& wc) { client_completed(wc); }),
        on_change_(std::move(on_change)) {
    server_channel_ = CmEventChannel::create(server_.dispatcher);
    client_channel_ = CmEventChannel::create(client_.dispatcher);
    CmAcceptor::Options accepting;
    accepting.make_qp = [this](CmId& id, const RecoveryAttempt&) { return server_.make_qp(id); };
    accepting.health.recovery.policy = quick(max_recoveries);
    acceptor_ = CmAcceptor::listen(
        server_channel_, CmAddress::parse(kServerAddress, 0),
        [this](const std::shared_ptr<CmSession>& session) {
          std::lock_guard<std::mutex> lock(mutex_);
          server_sessions_.push_back(session);
        },
        [](std::uint64_t, const HealthChange&) {}, accepting);
    const auto port = acceptor_->local_address().port();
    for (unsigned i = 0; i < sessions; ++i) {
      CmSession::Options options;
      options.id = i + 1;
      options.source = CmAddress::parse(kClientAddress, 0);
      options.make_qp = [this](CmId& id, const RecoveryAttempt&) { return client_.make_qp(id); };
      options.health.recovery.policy = quick(max_recoveries);
      options.health.keepalive.interval = keepalive;
      auto session = CmSession::connect(
          client_channel_, CmAddress::parse(kServerAddress, port),
          [this, i](const HealthChange& change) {
            {
              std::lock_guard<std::mutex> lock(mutex_);
              changes_.push_back({Clock::now(), change.to});
            }
            if (on_change_) on_change_(i, change);
          },
          options);
      std::lock_guard<std::mutex> lock(mutex_);
      sessions_.push_back(std::move(session));
    }
  }
  // The dispatchers stop before the members their handlers use go.
  ~Hosts() {
    for (auto& session : snapshot()) session->close();
    acceptor_->close();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& session : server_sessions_) session->close();
    }
    client_.dispatcher.stop();
    server_.dispatcher.stop();
  }

  CmSession& session(unsigned i) {
    std::lock_guard<std::mutex> lock(mutex_);
    return *sessions_.at(i);
  }
  Side& client() { return client_; }
  std::size_t server_sessions() { return acceptor_->sessions(); }
  // Changes to `to` after `since`.
  std::vector<Clock::time_point> changes_to(ConnectionState to, Clock::time_point since) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<Clock::time_point> at;
    for (const auto& change : changes_) {
      if (change.to == to && change.at > since) at.push_back(change.at);
    }
    return at;
  }
  bool all_up() {
    for (auto& session : snapshot()) {
      if (session->health().state() != ConnectionState::kUp) return false;
    }
    return true;
  }
  // Sends one 64-byte message on session 0, tracked by its health.
  void send(std::uint64_t seq) {
    char* slot = client_.memory.data() + (Side::kRecvs + seq % 256) * Side::kSlot;
    std::snprintf(slot, Side::kSlot, "seq %llu", static_cast<unsigned long long>(seq));
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(slot), Side::kSlot, client_.mr->lkey()};
    ibv_send_wr wr{};
    wr.wr_id = seq;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    session(0).health().post_send(wr);
  }
  // When sends completed successfully, after `since`.
  std::vector<Clock::time_point> sent_after(Clock::time_point since) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<Clock::time_point> at;
    for (const auto& t : sent_) {
      if (t > since) at.push_back(t);
    }
    return at;
  }

 private:
  struct Change {
    Clock::time_point at;
    ConnectionState to;
  };
  std::vector<std::shared_ptr<CmSession>> snapshot() {
    std::lock_guard<std::mutex> lock(mutex_);
    return sessions_;
  }
  void client_completed(const ibv_wc& wc) {
    for (auto& session : snapshot()) {
      auto qp = session->queue_pair();
      if (qp && qp->qp_num() == wc.qp_num) session->health().completion(wc);
    }
    if (wc.status == IBV_WC_SUCCESS && (wc.opcode & IBV_WC_RECV) == 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      sent_.push_back(Clock::now());
    }
  }
  void server_completed(const ibv_wc& wc) {
    if (wc.status != IBV_WC_SUCCESS || (wc.opcode & IBV_WC_RECV) == 0) return;
    if (auto qp = server_.receiver(wc.qp_num)) {
      try {
        server_.post_recv(*qp, wc.wr_id);
      } catch (const std::exception&) {
        // gone to ERR meanwhile: its next QP has receives of its own
      }
    }
  }

  Side server_;
  Side client_;
  std::function<void(unsigned, const HealthChange&)> on_change_;
  std::shared_ptr<CmEventChannel> server_channel_;
  std::shared_ptr<CmEventChannel> client_channel_;
  std::shared_ptr<CmAcceptor> acceptor_;
  std::mutex mutex_;
  std::vector<std::shared_ptr<CmSession>> sessions_;
  std::vector<std::shared_ptr<CmSession>> server_sessions_;
  std::vector<Change> changes_;
  std::vector<Clock::time_point> sent_;
};

void require(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

void flap(int rounds) {
  Hosts hosts(1, 0ms, 1000);
  std::atomic<std::int64_t> active_ns{0};
  Handle ports = hosts.client().device->on_event(
      EventFilter{IBV_EVENT_PORT_ACTIVE},
      [&](const Event&) { active_ns = Clock::now().time_since_epoch().count(); });
  std::atomic<bool> sending{true};
  std::thread sender([&] {
    for (std::uint64_t seq = 1; sending; ++seq) {
      if (hosts.session(0).health().state() == ConnectionState::kUp) {
        try {
          hosts.send(seq);
        } catch (const std::exception&) {
          // went down between the look and the post
        }
      }
      std::this_thread::sleep_for(5ms);
    }
  });
  run("sysctl -qw net.ipv6.conf." + kServerNetdev + ".keep_addr_on_down=1");
  for (int round = 1; round <= rounds; ++round) {
    const auto before = Clock::now();
    require(wait_until([&] { return hosts.sent_after(before).size() >= 20; }, 60s),
            "no traffic before the flap");
    const auto pulled = Clock::now();
    run("ip link set " + kServerNetdev + " down");
    std::this_thread::sleep_for(2s);
    run("ip link set " + kServerNetdev + " up && ip -6 route replace " + kClientAddress +
        "/128 dev " + kServerNetdev + " table 11");
    require(wait_until(
                [&] {
                  const Clock::time_point active{Clock::duration(active_ns.load())};
                  return active > pulled && !hosts.sent_after(active).empty() &&
                         !hosts.changes_to(ConnectionState::kUp, active).empty();
                },
                60s),
            "no traffic after the flap");
    const Clock::time_point active{Clock::duration(active_ns.load())};
    const auto downs = hosts.changes_to(ConnectionState::kDown, pulled).size();
    std::printf("flap round=%d active_to_up_ms=%.1f active_to_traffic_ms=%.1f downs=%zu\n", round,
                ms(hosts.changes_to(ConnectionState::kUp, active).front() - active),
                ms(hosts.sent_after(active).front() - active), downs);
    std::fflush(stdout);
  }
  sending = false;
  sender.join();
}

void silent(int rounds) {
  constexpr auto kInterval = 1000ms;
  Hosts hosts(1, kInterval, 1000);
  std::mt19937 random(std::random_device{}());
  std::uniform_int_distribution<int> phase_ms(0, static_cast<int>(kInterval.count()) - 1);
  for (int round = 1; round <= rounds; ++round) {
    require(wait_until([&] { return hosts.all_up(); }, 60s), "not up");
    auto& health = hosts.session(0).health();
    const auto answered = health.keepalive_stats().answered;
    require(wait_until([&] { return health.keepalive_stats().answered > answered; }, 10s),
            "no probe answered");
    std::this_thread::sleep_for(std::chrono::milliseconds(phase_ms(random)));
    const auto silencing = Clock::now();
    run("ip -6 neigh replace " + kClientAddress + " lladdr 02:00:00:00:00:01 dev " +
        kServerNetdev + " nud permanent");
    const auto silenced = Clock::now();
    require(wait_until([&] { return !hosts.changes_to(ConnectionState::kDown, silencing).empty(); },
                       30s),
            "the silent peer never noticed");
    const auto down = hosts.changes_to(ConnectionState::kDown, silencing);
    run("ip -6 neigh del " + kClientAddress + " dev " + kServerNetdev);
    std::printf("silent round=%d after_command_ms=%.1f before_command_ms=%.1f cause=%s\n", round,
                ms(down.front() - silenced), ms(down.front() - silencing),
                health.causes().empty() ? "?" : health.causes().front().what.c_str());
    std::fflush(stdout);
  }
}

// `count` RC pairs on `side`'s device, the first of each on `cq`.
std::vector<std::shared_ptr<QueuePair>> connected_pairs(
    const std::shared_ptr<ProtectionDomain>& pd, const std::shared_ptr<CompletionQueue>& cq,
    int count, std::vector<std::shared_ptr<QueuePair>>& peers) {
  std::vector<std::shared_ptr<QueuePair>> qps;
  for (int i = 0; i < count; ++i) {
    QueuePairOptions options;
    options.send_cq = cq;
    options.recv_cq = cq;
    options.cap = ibv_qp_cap{16, 16, 1, 1, 0};
    qps.push_back(QueuePair::create(pd, {}, options));
    peers.push_back(QueuePair::create(pd, {}, options));
    connect_rc_pair(*qps.back(), *peers.back());
  }
  return qps;
}

// The keepalive's baseline: the same probes written by hand, as a careful
// application without ibev would: one timerfd for every connection (as
// ibev's Dispatcher shares one among the keepalives of an interval), a
// zero-length RDMA write on each every interval, signaled, and one
// completion channel; a thread of its own blocks in epoll on both, acks
// each CQ event at once (ibev batches acks), re-arms and polls the CQ dry.
// Its CQ is made by ibev on a Dispatcher that never starts, so nothing of
// ibev runs.
class HandWrittenKeepalive {
 public:
  HandWrittenKeepalive(const std::string& device_name, int connections)
      : dispatcher_(Dispatcher::Options{}),
        device_(Device::open(dispatcher_, device_name)),
        pd_(ProtectionDomain::create(device_)) {
    CompletionQueue::Options options;
    options.cqe = 2 * connections + 16;
    cq_ = CompletionQueue::create(device_, [](const CompletionBatch&) {}, nullptr, options);
    qps_ = connected_pairs(pd_, cq_, connections, peers_);
  }

  void start(std::chrono::milliseconds interval) {
    timer_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    stop_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    epoll_ = epoll_create1(EPOLL_CLOEXEC);
    require(timer_ >= 0 && stop_ >= 0 && epoll_ >= 0, "timerfd, eventfd or epoll");
    const timespec period{interval.count() / 1000, (interval.count() % 1000) * 1000000};
    const itimerspec spec{period, period};
    require(timerfd_settime(timer_, 0, &spec, nullptr) == 0, "timerfd_settime");
    for (const int fd : {timer_, stop_, cq_->get()->channel->fd}) {
      epoll_event event{};
      event.events = EPOLLIN;
      event.data.fd = fd;
      require(epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &event) == 0, "epoll_ctl");
    }
    require(ibv_req_notify_cq(cq_->get(), 0) == 0, "ibv_req_notify_cq");
    thread_ = std::thread([this] { loop(); });
  }
  // The probes answered so far.
  std::uint64_t answered() const { return answered_; }
  void stop() {
    const std::uint64_t one = 1;
    require(write(stop_, &one, sizeof one) == sizeof one, "write(eventfd)");
    thread_.join();
    for (const int fd : {epoll_, timer_, stop_}) close(fd);
  }

 private:
  void loop() {
    epoll_event events[3];
    for (;;) {
      const int ready = epoll_wait(epoll_, events, 3, -1);
      for (int i = 0; i < ready; ++i) {
        if (events[i].data.fd == stop_) return;
        if (events[i].data.fd == timer_) {
          std::uint64_t ticks = 0;
          if (read(timer_, &ticks, sizeof ticks) == sizeof ticks) probe();
        } else {
          drain();
        }
      }
    }
  }
  void probe() {
    for (auto& qp : qps_) {
      ibv_send_wr wr{};
      ibv_send_wr* bad = nullptr;
      wr.opcode = IBV_WR_RDMA_WRITE;
      wr.send_flags = IBV_SEND_SIGNALED;
      ibv_post_send(qp->get(), &wr, &bad);
    }
  }
  void drain() {
    ibv_cq* cq = nullptr;
    void* context = nullptr;
    if (ibv_get_cq_event(cq_->get()->channel, &cq, &context) != 0) return;
    ibv_ack_cq_events(cq, 1);
    ibv_req_notify_cq(cq, 0);
    ibv_wc wc[32];
    for (int n; (n = ibv_poll_cq(cq, 32, wc)) > 0;) {
      for (int i = 0; i < n; ++i) answered_ += wc[i].status == IBV_WC_SUCCESS ? 1 : 0;
    }
  }

  Dispatcher dispatcher_;  // never started
  std::shared_ptr<Device> device_;
  std::shared_ptr<ProtectionDomain> pd_;
  std::shared_ptr<CompletionQueue> cq_;
  std::vector<std::shared_ptr<QueuePair>> qps_, peers_;
  int timer_ = -1, stop_ = -1, epoll_ = -1;
  std::thread thread_;
  std::atomic<std::uint64_t> answered_{0};
};

// Each round, in random order: no keepalive, ibev's on `connections`
// healths, and the hand-written one on as many connections of its own.
void keepalive_cpu(int rounds, int seconds, int connections) {
  constexpr auto kInterval = 1000ms;
  Side side(kClientDevice, [](const ibv_wc&) {});
  std::vector<std::shared_ptr<QueuePair>> peers;
  const auto qps = connected_pairs(side.pd, side.cq, connections, peers);
  HandWrittenKeepalive by_hand(kClientDevice, connections);
  std::mt19937 random(std::random_device{}());
  std::vector<std::string> configs{"off", "ibev", "by_hand"};
  for (int round = 1; round <= rounds; ++round) {
    std::shuffle(configs.begin(), configs.end(), random);
    for (const std::string& config : configs) {
      ConnectionHealth::Options options;
      if (config == "ibev") options.keepalive.interval = kInterval;
      std::vector<std::shared_ptr<ConnectionHealth>> healths;
      for (auto& qp : qps) {
        healths.push_back(ConnectionHealth::create(qp, [](const HealthChange&) {}, options));
      }
      if (config == "by_hand") by_hand.start(kInterval);
      std::this_thread::sleep_for(1500ms);  // every probe timer started and fired once
      std::uint64_t answered = 0;
      for (auto& health : healths) answered -= health->keepalive_stats().answered;
      answered -= by_hand.answered();
      const bench::CpuTimes cpu = bench::cpu_times();
      const auto began = Clock::now();
      std::this_thread::sleep_for(std::chrono::seconds(seconds));
      const bench::CpuTimes now = bench::cpu_times();
      const double wall = ms(Clock::now() - began) / 1000;
      std::size_t up = 0;
      for (auto& health : healths) {
        answered += health->keepalive_stats().answered;
        up += health->state() == ConnectionState::kUp ? 1 : 0;
      }
      answered += by_hand.answered();
      if (config == "by_hand") by_hand.stop();
      std::printf("keepalive_cpu round=%d keepalive=%s connections=%d seconds=%.3f user_ms=%.3f "
                  "system_ms=%.3f probes_answered=%llu up=%zu\n",
                  round, config.c_str(), connections, wall, (now.user - cpu.user) * 1000,
                  (now.system - cpu.system) * 1000, static_cast<unsigned long long>(answered), up);
      std::fflush(stdout);
      for (auto& health : healths) health->close();
    }
  }
}

void reconnects(int rounds, int seconds, unsigned sessions) {
  std::atomic<bool> on{false};
  std::atomic<Hosts*> hosts_at{nullptr};
  // Told on the client's dispatching thread: a session up is told QP_FATAL
  // (injected, as a device would raise it) at once, while the round runs.
  auto on_change = [&](unsigned i, const HealthChange& change) {
    Hosts* hosts = hosts_at.load();
    if (!on || change.to != ConnectionState::kUp || hosts == nullptr) return;
    auto qp = hosts->session(i).queue_pair();
    if (qp) {
      hosts->client().dispatcher.inject(qp->device()->context(), IBV_EVENT_QP_FATAL,
                                           ObjectNumber{ElementKind::kQp, qp->qp_num()});
    }
  };
  Hosts hosts(sessions, 0ms, 1u << 30, on_change);
  hosts_at = &hosts;
  for (int round = 1; round <= rounds; ++round) {
    require(wait_until([&] { return hosts.all_up(); }, 60s), "not all up");
    const auto began = Clock::now();
    on = true;
    for (unsigned i = 0; i < sessions; ++i) {
      auto qp = hosts.session(i).queue_pair();
      hosts.client().dispatcher.inject(qp->device()->context(), IBV_EVENT_QP_FATAL,
                                       ObjectNumber{ElementKind::kQp, qp->qp_num()});
    }
    std::this_thread::sleep_for(std::chrono::seconds(seconds));
    on = false;
    const auto ended = Clock::now();
    const auto ups = hosts.changes_to(ConnectionState::kUp, began);
    std::size_t within = 0;
    for (const auto& at : ups) within += at <= ended ? 1 : 0;
    require(wait_until([&] { return hosts.all_up(); }, 60s), "not all up after the round");
    std::printf("reconnects round=%d sessions=%u seconds=%.3f ups=%zu server_sessions=%zu\n",
                round, sessions, ms(ended - began) / 1000, within, hosts.server_sessions());
    std::fflush(stdout);
  }
  hosts_at = nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage =
      "usage: recovery_bench flap ROUNDS | silent ROUNDS | keepalive_cpu ROUNDS SECONDS "
      "CONNECTIONS | reconnects ROUNDS SECONDS SESSIONS\n";
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    const auto arg = [&](int i) {
      if (argc <= i) throw std::invalid_argument("missing argument");
      return std::stoi(argv[i]);
    };
    if (mode == "flap") {
      flap(arg(2));
    } else if (mode == "silent") {
      silent(arg(2));
    } else if (mode == "keepalive_cpu") {
      keepalive_cpu(arg(2), arg(3), arg(4));
    } else if (mode == "reconnects") {
      reconnects(arg(2), arg(3), static_cast<unsigned>(arg(4)));
    } else {
      std::fputs(usage.c_str(), stderr);
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "recovery_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
