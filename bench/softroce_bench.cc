// Benchmarks on a soft-RoCE device; they print figures and never fail on
// timing. bench/run_benchmarks.sh runs them in one VM session beside perftest
// and writes docs/benchmarks.md.
//
//   softroce_bench latency --mode event|adaptive|raw-poll|raw-event
//                          [--iters N]
//                          [--budget-us B] [--cpus SERVER,CLIENT]
//   softroce_bench stream --ack-batch K [--messages N]
//   softroce_bench link-down --netdev NAME [--rounds N]
//   softroce_bench idle --budget-us B [--seconds S]
//   softroce_bench removal --holder ibev|raw [--rounds N] [--hold-ms M]
//
// latency: a 2-byte RC send ping-pong between two processes (fork), as
// perftest's ib_send_lat does, each process with its own Dispatcher; the
// receive CQ's completion handler answers. One-way latency = RTT / 2.
#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <ibev/verbs/completion_queue.h>
#include <ibev/verbs/device.h>
#include <ibev/verbs/device_clients.h>
#include <ibev/verbs/protection_domain.h>
#include <ibev/verbs/queue_pair.h>
#include <ibev/verbs/shared_receive_queue.h>

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct Args {
  std::string command;
  std::string mode = "event";
  std::string device = "rxe0";
  std::string netdev = "d0";
  int iters = 10000;
  int budget_us = 0;
  unsigned ack_batch = 32;
  int messages = 20000;
  int rounds = 20;
  int seconds = 2;
  unsigned batch = 16;  // Dispatcher::Options::batch
  int server_cpu = -1;  // --cpus S,C: where each side of `latency` runs
  int client_cpu = -1;
  std::string holder = "ibev";  // removal: who holds the device
  int hold_ms = 3000;           // removal: how long the raw holder keeps it
};

Args parse(int argc, char** argv) {
  Args args;
  if (argc < 2) {
    std::fprintf(stderr, "usage: softroce_bench latency|stream|link-down|idle [options]\n");
    std::exit(2);
  }
  args.command = argv[1];
  if (const char* d = std::getenv("IBEV_TEST_DEVICE")) args.device = d;
  if (const char* n = std::getenv("IBEV_TEST_NETDEV")) args.netdev = n;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--mode") args.mode = value;
    else if (key == "--device") args.device = value;
    else if (key == "--netdev") args.netdev = value;
    else if (key == "--iters") args.iters = std::stoi(value);
    else if (key == "--budget-us") args.budget_us = std::stoi(value);
    else if (key == "--ack-batch") args.ack_batch = static_cast<unsigned>(std::stoul(value));
    else if (key == "--messages") args.messages = std::stoi(value);
    else if (key == "--rounds") args.rounds = std::stoi(value);
    else if (key == "--seconds") args.seconds = std::stoi(value);
    else if (key == "--batch") args.batch = static_cast<unsigned>(std::stoul(value));
    else if (key == "--holder") args.holder = value;
    else if (key == "--hold-ms") args.hold_ms = std::stoi(value);
    else if (key == "--cpus" && value.find(',') != std::string::npos) {
      args.server_cpu = std::stoi(value.substr(0, value.find(',')));
      args.client_cpu = std::stoi(value.substr(value.find(',') + 1));
    }
    else {
      std::fprintf(stderr, "softroce_bench: unknown option %s\n", key.c_str());
      std::exit(2);
    }
  }
  return args;
}

double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

// Blocks until `done` or the deadline; false on timeout.
class Flag {
 public:
  void set() {
    std::lock_guard<std::mutex> lock(mutex_);
    set_ = true;
    cv_.notify_all();
  }
  bool wait(std::chrono::seconds limit) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, limit, [&] { return set_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool set_ = false;
};

void check(int rc, const char* verb) {
  if (rc != 0) {
    std::fprintf(stderr, "softroce_bench: %s failed: %s\n", verb, std::strerror(rc));
    std::exit(3);
  }
}

ibev::Dispatcher::Options options_with_batch(unsigned batch) {
  ibev::Dispatcher::Options options;
  options.batch = batch;
  return options;
}

// One side of a connection: device, PD, an MR, a QP whose receive CQ has the
// given completion handler (and options), and a plain send CQ.
struct Side {
  Side(const Args& args, ibev::CompletionHandler on_receive,
       ibev::CompletionOptions options)
      : dispatcher(options_with_batch(args.batch)),
        device(ibev::Device::open(dispatcher, args.device)),
        pd(ibev::ProtectionDomain::create(device)),
        mr(ibev::MemoryRegion::create(pd, buffer.data(), buffer.size(),
                                      IBV_ACCESS_LOCAL_WRITE)) {
    ibev::CompletionQueue::Options send_options, recv_options;
    send_options.cqe = 1024;
    recv_options.cqe = 1024;
    recv_options.completion = options;
    send_cq = ibev::CompletionQueue::create_polled(device, nullptr, send_options);
    recv_cq = ibev::CompletionQueue::create(device, std::move(on_receive), nullptr,
                                            recv_options);
    ibev::QueuePair::Options qp_options;
    qp_options.send_cq = send_cq;
    qp_options.recv_cq = recv_cq;
    qp_options.cap = {512, 512, 1, 1, 64};
    qp = ibev::QueuePair::create(pd, nullptr, qp_options);
  }

  // The QP must be past RESET (connected), or ibv_post_recv fails.
  void post_recv(int count) {
    for (int i = 0; i < count; ++i) {
      ibv_sge sge{reinterpret_cast<std::uintptr_t>(buffer.data() + 64), 64, mr->lkey()};
      ibv_recv_wr wr{};
      wr.sg_list = &sge;
      wr.num_sge = 1;
      ibv_recv_wr* bad = nullptr;
      check(ibv_post_recv(qp->get(), &wr, &bad), "ibv_post_recv");
    }
  }

  // A 2-byte inline send. As in perftest, one send in kSignalEvery asks for
  // a completion, which frees the send queue slots before it; that one is
  // reaped a round later, without waiting.
  void send() {
    static constexpr unsigned kSignalEvery = 32;
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(buffer.data()), 2, mr->lkey()};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_INLINE;
    const bool signaled = ++sends % kSignalEvery == 0;
    if (signaled) wr.send_flags |= IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    check(ibv_post_send(qp->get(), &wr, &bad), "ibv_post_send");
    if (sends % kSignalEvery != kSignalEvery / 2) return;
    std::array<ibv_wc, 16> wcs;
    const int n = ibv_poll_cq(send_cq->get(), 16, wcs.data());
    for (int i = 0; i < n; ++i) {
      if (wcs[i].status != IBV_WC_SUCCESS) {
        std::fprintf(stderr, "softroce_bench: send failed: %s\n",
                     ibv_wc_status_str(wcs[i].status));
        std::exit(4);
      }
    }
  }

  ibev::Dispatcher dispatcher;
  std::array<char, 4096> buffer{};
  std::shared_ptr<ibev::Device> device;
  std::shared_ptr<ibev::ProtectionDomain> pd;
  std::shared_ptr<ibev::MemoryRegion> mr;
  std::shared_ptr<ibev::CompletionQueue> send_cq, recv_cq;
  std::shared_ptr<ibev::QueuePair> qp;
  unsigned sends = 0;
};

void write_all(int fd, const void* data, std::size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n <= 0) std::exit(3);
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

void read_all(int fd, void* data, std::size_t size) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::read(fd, p, size);
    if (n <= 0) std::exit(3);
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

ibev::CompletionOptions options_for(const Args& args) {
  ibev::CompletionOptions options;
  options.ack_batch = args.ack_batch;
  if (args.mode == "adaptive") {
    options.mode = ibev::CompletionMode::kAdaptive;
    options.poll_budget = std::chrono::microseconds(args.budget_us);
  }
  return options;
}

int latency(const Args& args) {
  int sockets[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sockets) != 0) return 3;
  const pid_t child = ::fork();
  const bool server = child == 0;
  const int peer = sockets[server ? 1 : 0];
  // Pinned before any thread starts, so the Dispatcher's thread inherits it.
  if (const int cpu = server ? args.server_cpu : args.client_cpu; cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (::sched_setaffinity(0, sizeof set, &set) != 0) {
      std::perror("softroce_bench: sched_setaffinity");
      return 3;
    }
  }

  std::vector<double> rtt_us;
  rtt_us.reserve(static_cast<std::size_t>(args.iters));
  Flag finished;
  std::atomic<int> remaining{args.iters};
  Clock::time_point sent_at;
  Side* self = nullptr;
  // What each side does with one received message.
  auto on_message = [&] {
    self->post_recv(1);
    if (server) {
      self->send();  // pong
      if (--remaining == 0) finished.set();
    } else {
      const auto now = Clock::now();
      rtt_us.push_back(std::chrono::duration<double, std::micro>(now - sent_at).count());
      if (--remaining == 0) {
        finished.set();
      } else {
        sent_at = Clock::now();
        self->send();  // next ping
      }
    }
  };
  // The raw modes are this harness without ibev, the baselines for what the
  // harness itself costs. raw-poll: this thread spins on ibv_poll_cq, as
  // perftest's busy-poll mode does. raw-event: this thread sleeps in a
  // blocking ibv_get_cq_event, acks, re-arms and drains, as perftest -e does
  // (the CQ's channel is used directly; the Dispatcher is never started).
  const bool raw_poll = args.mode == "raw-poll";
  const bool raw_event = args.mode == "raw-event";
  auto on_receive = [&](const ibev::CompletionBatch& batch) {
    for (std::size_t i = 0; i < batch.size; ++i) on_message();
  };
  Side side(args, raw_poll ? ibev::CompletionHandler{} : ibev::CompletionHandler{on_receive},
            options_for(args));
  self = &side;

  ibev::RcEndpoint mine = side.qp->endpoint(), theirs{};
  write_all(peer, &mine, sizeof mine);
  read_all(peer, &theirs, sizeof theirs);
  side.qp->connect(theirs);
  side.post_recv(256);
  if (raw_event) {
    const int fd = side.recv_cq->get()->channel->fd;
    if (::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) return 3;
  } else {
    side.dispatcher.start();
  }
  char ready = 'r';
  write_all(peer, &ready, 1);  // both connected: the client may start
  read_all(peer, &ready, 1);

  const double cpu_before = cpu_seconds();
  const auto start = Clock::now();
  if (!server) {
    sent_at = Clock::now();
    side.send();
  }
  std::array<ibv_wc, 16> wcs;
  ibv_cq* const recv_cq = side.recv_cq->get();
  const auto drain = [&] {
    int n;
    while ((n = ibv_poll_cq(recv_cq, 16, wcs.data())) > 0) {
      for (int i = 0; i < n; ++i) on_message();
    }
  };
  while (raw_poll && remaining > 0) drain();
  while (raw_event && remaining > 0) {
    ibv_cq* cq = nullptr;
    void* context = nullptr;
    if (ibv_get_cq_event(recv_cq->channel, &cq, &context) != 0) return 3;
    ibv_ack_cq_events(cq, 1);
    check(ibv_req_notify_cq(cq, 0), "ibv_req_notify_cq");
    drain();
  }
  if (!finished.wait(600s)) {
    std::fprintf(stderr, "softroce_bench: ping-pong stalled\n");
    return 4;
  }
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  const double cpu = cpu_seconds() - cpu_before;
  side.dispatcher.stop();

  if (server) {
    write_all(peer, &cpu, sizeof cpu);
    return 0;
  }
  double server_cpu = 0;
  read_all(peer, &server_cpu, sizeof server_cpu);
  int status = 0;
  ::waitpid(child, &status, 0);

  std::vector<double> one_way;
  for (double r : rtt_us) one_way.push_back(r / 2);
  std::sort(one_way.begin(), one_way.end());
  double sum = 0;
  for (double v : one_way) sum += v;
  const auto at = [&](double q) {
    return one_way[std::min(one_way.size() - 1, static_cast<std::size_t>(q * one_way.size()))];
  };
  const auto stats = side.recv_cq->completion_stats();
  std::printf(
      "latency mode=%s budget_us=%d iters=%zu typical_us=%.2f avg_us=%.2f p99_us=%.2f "
      "cpu_s=%.3f wall_s=%.3f events=%llu polled=%llu empty_reads=%llu\n",
      args.mode.c_str(), args.budget_us, one_way.size(), at(0.5), sum / one_way.size(),
      at(0.99), cpu + server_cpu, wall, static_cast<unsigned long long>(stats.events),
      static_cast<unsigned long long>(stats.polled),
      static_cast<unsigned long long>(side.dispatcher.stats().empty_channel_reads));
  return 0;
}

// A stream of sends from one QP to another in one process: completion events
// per second on the receiving CQ, and the ack calls they cost.
int stream(const Args& args) {
  std::atomic<int> received{0};
  Flag finished;
  auto on_receive = [&](const ibev::CompletionBatch& batch) {
    if ((received += static_cast<int>(batch.size)) >= args.messages) finished.set();
  };
  Args sender_args = args;
  Side rx(args, on_receive, options_for(args));
  Side tx(sender_args, [](const ibev::CompletionBatch&) {}, ibev::CompletionOptions{});
  rx.qp->connect(tx.qp->endpoint());
  tx.qp->connect(rx.qp->endpoint());
  rx.post_recv(512);
  rx.dispatcher.start();

  const auto start = Clock::now();
  int sent = 0;
  while (sent < args.messages) {
    // Keep at most 256 in flight, and receives posted ahead of them.
    if (sent - received.load() < 256) {
      rx.post_recv(1);
      tx.send();
      ++sent;
    } else {
      std::this_thread::yield();
    }
  }
  if (!finished.wait(600s)) return 4;
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  const auto stats = rx.recv_cq->completion_stats();
  rx.dispatcher.stop();
  std::printf(
      "stream ack_batch=%u messages=%d events=%llu ack_calls=%llu events_per_s=%.0f "
      "completions_per_s=%.0f events_per_ack=%.1f\n",
      args.ack_batch, args.messages, static_cast<unsigned long long>(stats.events),
      static_cast<unsigned long long>(stats.ack_calls), stats.events / wall,
      args.messages / wall,
      stats.ack_calls ? static_cast<double>(stats.events) / stats.ack_calls : 0.0);
  return 0;
}

bool set_link(const std::string& netdev, bool up) {
  const int fd = ::socket(AF_INET6, SOCK_DGRAM, 0);
  ifreq request{};
  std::strncpy(request.ifr_name, netdev.c_str(), IFNAMSIZ - 1);
  bool ok = ::ioctl(fd, SIOCGIFFLAGS, &request) == 0;
  if (up) {
    request.ifr_flags = static_cast<short>(request.ifr_flags | IFF_UP);
  } else {
    request.ifr_flags = static_cast<short>(request.ifr_flags & ~IFF_UP);
  }
  ok = ok && ::ioctl(fd, SIOCSIFFLAGS, &request) == 0;
  ::close(fd);
  return ok;
}

// From the ioctl that takes the netdev down to the PORT_ERR handler's call.
int link_down(const Args& args) {
  ibev::Dispatcher dispatcher;
  auto device = ibev::Device::open(dispatcher, args.device);
  std::mutex mutex;
  std::condition_variable cv;
  Clock::time_point heard_at;
  int heard = 0;
  ibev::Handle listener = device->on_event(
      ibev::EventFilter{IBV_EVENT_PORT_ERR, IBV_EVENT_PORT_ACTIVE}, [&](const ibev::Event&) {
        std::lock_guard<std::mutex> lock(mutex);
        heard_at = Clock::now();
        ++heard;
        cv.notify_all();
      });
  dispatcher.start();
  std::vector<double> us;
  for (int round = 0; round < args.rounds; ++round) {
    for (bool up : {false, true}) {
      std::unique_lock<std::mutex> lock(mutex);
      const int before = heard;
      const auto start = Clock::now();
      if (!set_link(args.netdev, up)) return 3;
      if (!cv.wait_for(lock, 10s, [&] { return heard > before; })) return 4;
      if (!up) us.push_back(std::chrono::duration<double, std::micro>(heard_at - start).count());
    }
  }
  std::sort(us.begin(), us.end());
  double sum = 0;
  for (double v : us) sum += v;
  std::printf("link_down rounds=%zu median_us=%.1f avg_us=%.1f max_us=%.1f\n", us.size(),
              us[us.size() / 2], sum / us.size(), us.back());
  return 0;
}

// CPU used by a process whose adaptive-mode CQ has nothing to do.
int idle(const Args& args) {
  Args adaptive = args;
  adaptive.mode = "adaptive";
  Side side(adaptive, [](const ibev::CompletionBatch&) {}, options_for(adaptive));
  side.dispatcher.start();
  const double before = cpu_seconds();
  std::this_thread::sleep_for(std::chrono::seconds(args.seconds));
  const double used = cpu_seconds() - before;
  std::printf("idle budget_us=%d seconds=%d cpu_s=%.4f core_percent=%.2f\n", args.budget_us,
              args.seconds, used, 100.0 * used / args.seconds);
  return 0;
}

// One of every object a connection holds, made with raw verbs: a process
// that does not know its device can vanish, as every process did before.
struct RawHolder {
  explicit RawHolder(const std::string& name) {
    int count = 0;
    ibv_device** list = ibv_get_device_list(&count);
    for (int i = 0; i < count && context == nullptr; ++i) {
      if (name == ibv_get_device_name(list[i])) context = ibv_open_device(list[i]);
    }
    ibv_free_device_list(list);
    if (context == nullptr) throw std::runtime_error("ibv_open_device(" + name + ") failed");
    pd = ibv_alloc_pd(context);
    channel = ibv_create_comp_channel(context);
    cq = ibv_create_cq(context, 64, nullptr, channel, 0);
    ibv_srq_init_attr srq_attr{};
    srq_attr.attr.max_wr = 16;
    srq_attr.attr.max_sge = 1;
    srq = ibv_create_srq(pd, &srq_attr);
    ibv_qp_init_attr qp_attr{};
    qp_attr.send_cq = qp_attr.recv_cq = cq;
    qp_attr.qp_type = IBV_QPT_RC;
    qp_attr.cap = {16, 16, 1, 1, 0};
    qp = ibv_create_qp(pd, &qp_attr);
    qp_attr.srq = srq;
    srq_qp = ibv_create_qp(pd, &qp_attr);
    mr = ibv_reg_mr(pd, buffer.data(), buffer.size(), IBV_ACCESS_LOCAL_WRITE);
    if (!pd || !channel || !cq || !srq || !qp || !srq_qp || !mr ||
        ibv_req_notify_cq(cq, 0) != 0) {
      throw std::runtime_error("making the raw holder's objects failed");
    }
  }
  ~RawHolder() {
    ibv_dereg_mr(mr);
    ibv_destroy_qp(srq_qp);
    ibv_destroy_qp(qp);
    ibv_destroy_srq(srq);
    ibv_destroy_cq(cq);
    ibv_destroy_comp_channel(channel);
    ibv_dealloc_pd(pd);
    ibv_close_device(context);
  }
  ibv_context* context = nullptr;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* channel = nullptr;
  ibv_cq* cq = nullptr;
  ibv_srq* srq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_qp* srq_qp = nullptr;
  ibv_mr* mr = nullptr;
  std::array<char, 4096> buffer{};
};

// What an ibev device client holds on each device: the same objects, its CQ's
// completions and the objects' events watched.
struct IbevHolder {
  explicit IbevHolder(const std::shared_ptr<ibev::Device>& device)
      : pd(ibev::ProtectionDomain::create(device)) {
    cq = ibev::CompletionQueue::create(device, [](const ibev::CompletionBatch&) {},
                                       [](const ibev::Event&) {});
    srq = ibev::SharedReceiveQueue::create(pd, [](const ibev::Event&) {});
    ibev::QueuePair::Options options;
    options.send_cq = options.recv_cq = cq;
    qp = ibev::QueuePair::create(pd, [](const ibev::Event&) {}, options);
    options.srq = srq;
    srq_qp = ibev::QueuePair::create(pd, [](const ibev::Event&) {}, options);
    mr = ibev::MemoryRegion::create(pd, buffer.data(), buffer.size(), IBV_ACCESS_LOCAL_WRITE);
  }
  std::array<char, 4096> buffer{};
  std::shared_ptr<ibev::ProtectionDomain> pd;
  std::shared_ptr<ibev::CompletionQueue> cq;
  std::shared_ptr<ibev::SharedReceiveQueue> srq;
  std::shared_ptr<ibev::QueuePair> qp, srq_qp;
  std::shared_ptr<ibev::MemoryRegion> mr;
};

double run_timed_ms(const std::string& command) {
  const auto start = Clock::now();
  if (std::system(command.c_str()) != 0) throw std::runtime_error(command + " failed");
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// From `rdma link delete` starting to its return, while this process holds
// the device: as an ibev device client (which lets go when the kernel
// removes the uverbs node), or with raw verbs, letting go --hold-ms after
// the delete starts (without that, never). The device is re-added between
// rounds.
int removal(const Args& args) {
  const std::string remove = "rdma link delete " + args.device;
  const std::string re_add = "rdma link add " + args.device + " type rxe netdev " + args.netdev;
  std::vector<double> ms;
  for (int round = 0; round < args.rounds; ++round) {
    if (args.holder == "raw") {
      auto holder = std::make_unique<RawHolder>(args.device);
      std::thread let_go([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(args.hold_ms));
        holder.reset();
      });
      ms.push_back(run_timed_ms(remove));
      let_go.join();
    } else {
      ibev::Dispatcher dispatcher;
      ibev::DeviceClients clients(dispatcher);
      std::mutex mutex;
      std::condition_variable cv;
      std::unique_ptr<IbevHolder> holder;
      bool added = false;
      ibev::Handle client = clients.register_client(
          {"bench",
           [&](const std::shared_ptr<ibev::Device>& device) {
             auto made = std::make_unique<IbevHolder>(device);
             std::lock_guard<std::mutex> lock(mutex);
             holder = std::move(made);
             added = true;
             cv.notify_all();
           },
           [&](const std::shared_ptr<ibev::Device>&, ibev::DeviceLoss) {
             std::lock_guard<std::mutex> lock(mutex);
             holder.reset();
           }});
      dispatcher.start();
      {
        std::unique_lock<std::mutex> lock(mutex);
        if (!cv.wait_for(lock, 20s, [&] { return added; })) return 4;
      }
      ms.push_back(run_timed_ms(remove));
    }
    std::printf("removal holder=%s round=%d delete_ms=%.0f\n", args.holder.c_str(), round + 1,
                ms.back());
    run_timed_ms(re_add);
  }
  std::sort(ms.begin(), ms.end());
  std::printf("removal holder=%s rounds=%zu median_ms=%.0f max_ms=%.0f\n", args.holder.c_str(),
              ms.size(), ms[ms.size() / 2], ms.back());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  try {
    if (args.command == "latency") return latency(args);
    if (args.command == "stream") return stream(args);
    if (args.command == "link-down") return link_down(args);
    if (args.command == "idle") return idle(args);
    if (args.command == "removal") return removal(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "softroce_bench: %s\n", e.what());
    return 3;
  }
  std::fprintf(stderr, "softroce_bench: unknown command %s\n", args.command.c_str());
  return 2;
}
