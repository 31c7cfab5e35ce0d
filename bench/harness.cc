#include "bench/harness.h"

#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <numeric>
#include <thread>

namespace bench {

namespace {

// Receives land past the send buffer; both hold the largest message.
constexpr std::size_t kBufferHalf = 8192;
constexpr int kMaxInline = 64;

}  // namespace

Args parse(int argc, char** argv) {
  Args args;
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: softroce_bench latency|rate|stream|scale|memory|fairness|link-down|"
                 "idle|removal [options]\n");
    std::exit(2);
  }
  args.command = argv[1];
  if (const char* d = std::getenv("IBEV_TEST_DEVICE")) args.device = d;
  if (const char* n = std::getenv("IBEV_TEST_NETDEV")) args.netdev = n;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--mode")
      args.mode = value;
    else if (key == "--device")
      args.device = value;
    else if (key == "--netdev")
      args.netdev = value;
    else if (key == "--executor")
      args.executor = value;
    else if (key == "--samples")
      args.samples = value;
    else if (key == "--iters")
      args.iters = std::stoi(value);
    else if (key == "--budget-us")
      args.budget_us = std::stoi(value);
    else if (key == "--ack-batch")
      args.ack_batch = static_cast<unsigned>(std::stoul(value));
    else if (key == "--messages")
      args.messages = std::stoi(value);
    else if (key == "--size")
      args.size = std::stoi(value);
    else if (key == "--depth")
      args.depth = std::stoi(value);
    else if (key == "--signal-every")
      args.signal_every = std::stoi(value);
    else if (key == "--send-cq") {
      if (value != "polled" && value != "event") {
        std::fprintf(stderr, "softroce_bench: --send-cq is polled or event\n");
        std::exit(2);
      }
      args.send_cq = value;
    }
    else if (key == "--inline")
      args.inline_bytes = std::stoi(value);
    else if (key == "--pairs")
      args.pairs = std::stoi(value);
    else if (key == "--channels")
      args.channels = std::stoi(value);
    else if (key == "--load")
      args.load = std::stoi(value);
    else if (key == "--load-rate")
      args.load_rate = std::stoi(value);
    else if (key == "--turn-budget")
      args.turn_budget = static_cast<unsigned>(std::stoul(value));
    else if (key == "--rounds")
      args.rounds = std::stoi(value);
    else if (key == "--seconds")
      args.seconds = std::stoi(value);
    else if (key == "--batch")
      args.batch = static_cast<unsigned>(std::stoul(value));
    else if (key == "--holder")
      args.holder = value;
    else if (key == "--hold-ms")
      args.hold_ms = std::stoi(value);
    else if (key == "--cpus" && value.find(',') != std::string::npos) {
      args.server_cpu = std::stoi(value.substr(0, value.find(',')));
      args.client_cpu = std::stoi(value.substr(value.find(',') + 1));
    } else {
      std::fprintf(stderr, "softroce_bench: unknown option %s\n", key.c_str());
      std::exit(2);
    }
  }
  if (args.size < 1 || static_cast<std::size_t>(args.size) > kBufferHalf || args.signal_every < 1 ||
      args.depth < 1 || args.depth > 512 || args.pairs < 1 || args.channels < 0 ||
      args.inline_bytes < 0 || args.inline_bytes > kMaxInline) {
    std::fprintf(stderr,
                 "softroce_bench: --size 1..%zu, --depth 1..512, --signal-every, "
                 "--pairs >= 1, --channels >= 0, --inline 0..%d\n",
                 kBufferHalf, kMaxInline);
    std::exit(2);
  }
  return args;
}

void check(int rc, const char* verb) {
  if (rc != 0) {
    std::fprintf(stderr, "softroce_bench: %s failed: %s\n", verb, std::strerror(rc));
    std::exit(3);
  }
}

void run_on_own_thread(const std::function<void()>& loop) {
  std::exception_ptr thrown;
  std::thread([&] {
    try {
      loop();
    } catch (...) {
      thrown = std::current_exception();
    }
  }).join();
  if (thrown) std::rethrow_exception(thrown);
}

void require_success(const ibv_wc& wc) {
  if (wc.status != IBV_WC_SUCCESS) {
    std::fprintf(stderr, "softroce_bench: work completion failed: %s\n",
                 ibv_wc_status_str(wc.status));
    std::exit(4);
  }
}

void require_success(const ibev::CompletionBatch& batch) {
  for (const ibv_wc& wc : batch) require_success(wc);
}

ibv_context* open_raw_device(const std::string& name) {
  int count = 0;
  ibv_device** list = ibv_get_device_list(&count);
  ibv_context* context = nullptr;
  for (int i = 0; i < count && context == nullptr; ++i) {
    if (name == ibv_get_device_name(list[i])) context = ibv_open_device(list[i]);
  }
  if (list != nullptr) ibv_free_device_list(list);
  return context;
}

bool set_link(const std::string& netdev, bool up) {
  const int fd = ::socket(AF_INET6, SOCK_DGRAM, 0);
  ifreq request{};
  std::strncpy(request.ifr_name, netdev.c_str(), IFNAMSIZ - 1);
  bool ok = ::ioctl(fd, SIOCGIFFLAGS, &request) == 0;
  request.ifr_flags =
      static_cast<short>(up ? request.ifr_flags | IFF_UP : request.ifr_flags & ~IFF_UP);
  ok = ok && ::ioctl(fd, SIOCSIFFLAGS, &request) == 0;
  ::close(fd);
  return ok;
}

void Flag::set() {
  std::lock_guard<std::mutex> lock(mutex_);
  set_ = true;
  cv_.notify_all();
}

bool Flag::wait(std::chrono::seconds limit) {
  std::unique_lock<std::mutex> lock(mutex_);
  return cv_.wait_for(lock, limit, [&] { return set_; });
}

ibev::CompletionOptions options_for(const Args& args, ibev::Executor executor) {
  ibev::CompletionOptions options;
  options.ack_batch = args.ack_batch;
  options.executor = std::move(executor);
  if (args.mode == "adaptive") {
    options.mode = ibev::CompletionMode::kAdaptive;
    options.poll_budget = std::chrono::microseconds(args.budget_us);
  }
  return options;
}

namespace {

// The raw modes never start their Dispatcher: it runs no watchdog either, so
// that nothing of ibev's runs beside the baseline (run_syscalls.sh counts
// every thread's system calls).
ibev::Dispatcher::Options dispatcher_options(const Args& args) {
  ibev::Dispatcher::Options options;
  options.batch = args.batch;
  if (args.mode.rfind("raw-", 0) == 0) options.stall_after = std::chrono::milliseconds(0);
  return options;
}

}  // namespace

Side::Side(const Args& args_in, ibev::CompletionHandler on_receive, ibev::CompletionOptions options,
           ibev::CompletionHandler on_send)
    : args(args_in),
      dispatcher(dispatcher_options(args_in)),
      buffer(2 * kBufferHalf),
      device(ibev::Device::open(dispatcher, args.device)),
      pd(ibev::ProtectionDomain::create(device)),
      mr(ibev::MemoryRegion::create(pd, buffer.data(), buffer.size(), IBV_ACCESS_LOCAL_WRITE)) {
  ibev::CompletionQueue::Options send_options, recv_options;
  send_options.cqe = 1024;
  recv_options.cqe = 1024;
  recv_options.completion = options;
  send_options.completion = options;
  send_cq = on_send
                ? ibev::CompletionQueue::create(device, std::move(on_send), nullptr, send_options)
                : ibev::CompletionQueue::create_polled(device, nullptr, send_options);
  recv_cq = on_receive ? ibev::CompletionQueue::create(device, std::move(on_receive), nullptr,
                                                       recv_options)
                       : ibev::CompletionQueue::create_polled(device, nullptr, recv_options);
  ibev::QueuePair::Options qp_options;
  qp_options.send_cq = send_cq;
  qp_options.recv_cq = recv_cq;
  qp_options.cap = {512, 512, 1, 1, kMaxInline};
  qp = ibev::QueuePair::create(pd, nullptr, qp_options);
}

void Side::post_recv(int count) {
  for (int i = 0; i < count; ++i) {
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(buffer.data() + kBufferHalf),
                static_cast<std::uint32_t>(args.size), mr->lkey()};
    ibv_recv_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    check(ibv_post_recv(qp->get(), &wr, &bad), "ibv_post_recv");
  }
}

bool Side::send() {
  const auto every = static_cast<std::uint64_t>(args.signal_every);
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(buffer.data()),
              static_cast<std::uint32_t>(args.size), mr->lkey()};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  if (args.size <= args.inline_bytes) wr.send_flags = IBV_SEND_INLINE;
  const bool signaled = ++sends % every == 0;
  if (signaled) wr.send_flags |= IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  check(ibv_post_send(qp->get(), &wr, &bad), "ibv_post_send");
  if (send_cq->mode() != ibev::CompletionMode::kPolled || sends % every != every / 2) {
    return signaled;
  }
  std::array<ibv_wc, 16> wcs;
  const int n = ibv_poll_cq(send_cq->get(), 16, wcs.data());
  for (int i = 0; i < n; ++i) {
    if (wcs[i].status != IBV_WC_SUCCESS) {
      std::fprintf(stderr, "softroce_bench: send failed: %s\n", ibv_wc_status_str(wcs[i].status));
      std::exit(4);
    }
  }
  return signaled;
}

Peer::Peer(const Args& args) {
  int sockets[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sockets) != 0) check(errno, "socketpair");
  child_ = ::fork();
  if (child_ < 0) check(errno, "fork");
  fd_ = sockets[server() ? 1 : 0];
  ::close(sockets[server() ? 0 : 1]);
  if (const int cpu = server() ? args.server_cpu : args.client_cpu; cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (::sched_setaffinity(0, sizeof set, &set) != 0) check(errno, "sched_setaffinity");
  }
}

void Peer::connect(Side& side) {
  auto wire = side.qp->endpoint().to_wire();
  write_all(wire.data(), wire.size());
  read_all(wire.data(), wire.size());
  side.qp->connect(ibev::RcEndpoint::from_wire({wire.data(), wire.size()}));
}

void Peer::barrier() {
  char ready = 'r';
  write_all(&ready, 1);
  read_all(&ready, 1);
}

void Peer::send_value(double value) { write_all(&value, sizeof value); }

double Peer::receive_value() {
  double value = 0;
  read_all(&value, sizeof value);
  return value;
}

void Peer::wait_for_server() {
  int status = 0;
  ::waitpid(child_, &status, 0);
}

void Peer::write_all(const void* data, std::size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, size);
    if (n <= 0) std::exit(3);
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

void Peer::read_all(void* data, std::size_t size) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::read(fd_, p, size);
    if (n <= 0) std::exit(3);
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

Distribution::Distribution(std::vector<double> values) : values_(std::move(values)) {
  std::sort(values_.begin(), values_.end());
}

double Distribution::at(double quantile) const {
  if (values_.empty()) return 0;
  const auto index = static_cast<std::size_t>(quantile * static_cast<double>(values_.size()));
  return values_[std::min(values_.size() - 1, index)];
}

bool Distribution::supports(double quantile) const {
  if (quantile >= 1) return false;
  // Less a tolerance: in binary, 1 - 0.9 is a little under 0.1, and 100
  // samples must support p90.
  return static_cast<double>(values_.size()) >= 10 / (1 - quantile) - 1e-6;
}

std::string Distribution::text_at(double quantile) const {
  if (!supports(quantile)) return "na";
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", at(quantile));
  return text;
}

double Distribution::mean() const {
  if (values_.empty()) return 0;
  return std::accumulate(values_.begin(), values_.end(), 0.0) / static_cast<double>(values_.size());
}

void Distribution::write(const std::string& path) const {
  std::FILE* out = std::fopen(path.c_str(), "w");
  if (out == nullptr) check(errno, "fopen");
  for (double v : values_) std::fprintf(out, "%.2f\n", v);
  std::fclose(out);
}

// --- raw-floor's loop (harness.h) ---

// A channel's slot, what its epoll_event's data.ptr points at: its CQs,
// [first, last) in FloorLoop's array, sorted by address.
struct FloorLoop::Channel {
  ibv_comp_channel* channel = nullptr;
  FloorCq* first = nullptr;
  FloorCq* last = nullptr;
};

namespace {

bool cq_before(const ibv_cq* a, const ibv_cq* b) { return std::less<const ibv_cq*>{}(a, b); }

// Polls `cq` 16 at a time into its handler until it is empty.
void drain_into(const FloorCq& cq) {
  std::array<ibv_wc, 16> wcs;
  int got;
  while ((got = ibv_poll_cq(cq.cq, static_cast<int>(wcs.size()), wcs.data())) > 0) {
    cq.handler(ibev::CompletionBatch{cq.cq, wcs.data(), static_cast<std::size_t>(got)});
  }
  if (got < 0) check(-got, "ibv_poll_cq");
}

// Reads one event from a non-blocking channel: its CQ, or null on EAGAIN.
ibv_cq* read_event(ibv_comp_channel* channel) {
  ibv_cq* cq = nullptr;
  void* context = nullptr;
  if (ibv_get_cq_event(channel, &cq, &context) == 0) return cq;
  if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) check(errno, "ibv_get_cq_event");
  return nullptr;
}

}  // namespace

FloorLoop::FloorLoop(std::vector<FloorCq>& cqs, unsigned ack_batch, unsigned batch)
    : cqs_(cqs), ack_batch_(ack_batch), batch_(batch) {
  std::sort(cqs_.begin(), cqs_.end(), [](const FloorCq& a, const FloorCq& b) {
    const auto* const ca = a.cq->channel;
    const auto* const cb = b.cq->channel;
    if (ca != cb) return std::less<const ibv_comp_channel*>{}(ca, cb);
    return cq_before(a.cq, b.cq);
  });
  for (auto it = cqs_.begin(); it != cqs_.end();) {
    ibv_comp_channel* const channel = it->cq->channel;
    const auto last =
        std::find_if(it, cqs_.end(), [&](const FloorCq& c) { return c.cq->channel != channel; });
    channels_.push_back({channel, &*it, &*it + (last - it)});
    it = last;
  }
  epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_ < 0) check(errno, "epoll_create1");
  for (Channel& channel : channels_) {
    // ibev made the fds non-blocking when it watched the CQs; a floor that
    // relied on that and met a blocking one would hang on its one read.
    const int fd = channel.channel->fd;
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) check(errno, "fcntl");
    epoll_event interest{};
    interest.events = EPOLLIN;
    interest.data.ptr = &channel;
    if (::epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &interest) != 0) check(errno, "epoll_ctl");
  }
}

// ibv_destroy_cq waits until every event read for the CQ is acked.
FloorLoop::~FloorLoop() {
  for (FloorCq& cq : cqs_) {
    if (cq.unacked > 0) ibv_ack_cq_events(cq.cq, cq.unacked);
    cq.unacked = 0;
  }
  ::close(epoll_);
}

bool FloorLoop::run(const std::function<bool()>& done) {
  std::array<epoll_event, 64> ready;
  int quiet_seconds = 0;
  while (!done()) {
    // The timeout only counts toward the stall bound.
    const int n = ::epoll_wait(epoll_, ready.data(), static_cast<int>(ready.size()), 1000);
    if (n < 0 && errno != EINTR) check(errno, "epoll_wait");
    if (n <= 0) {
      if (++quiet_seconds >= 600) return false;
      continue;
    }
    quiet_seconds = 0;
    for (int i = 0; i < n; ++i) serve(*static_cast<Channel*>(ready[i].data.ptr));
  }
  return true;
}

void FloorLoop::serve(Channel& channel) {
  const auto counted = [this](FloorCq& cq) {
    ++cq.events;
    if (++cq.unacked < ack_batch_) return;
    ibv_ack_cq_events(cq.cq, cq.unacked);
    cq.unacked = 0;
  };
  const auto arm = [](const FloorCq& cq) {
    check(ibv_req_notify_cq(cq.cq, 0), "ibv_req_notify_cq");
  };
  const auto unknown_cq = [] {
    std::fprintf(stderr, "softroce_bench: an event for a CQ its channel does not serve\n");
    std::exit(3);
  };
  const auto served = static_cast<std::size_t>(channel.last - channel.first);
  if (served == 1) {
    FloorCq& only = *channel.first;
    drain_into(only);
    ibv_cq* const cq = read_event(channel.channel);
    if (cq == nullptr) return;
    if (cq != only.cq) unknown_cq();
    counted(only);
    arm(only);
    drain_into(only);
    return;
  }
  const std::size_t to_read = std::min<std::size_t>(batch_, served);
  for (std::size_t k = 0; k < to_read; ++k) {
    ibv_cq* const cq = read_event(channel.channel);
    if (cq == nullptr) break;
    FloorCq* const found =
        std::lower_bound(channel.first, channel.last, cq,
                         [](const FloorCq& c, const ibv_cq* key) { return cq_before(c.cq, key); });
    if (found == channel.last || found->cq != cq) unknown_cq();
    counted(*found);
    drain_into(*found);
    arm(*found);
    drain_into(*found);
  }
}

std::uint64_t FloorLoop::events(const ibv_cq* cq) const {
  std::uint64_t sum = 0;
  for (const FloorCq& c : cqs_) {
    if (cq == nullptr || c.cq == cq) sum += c.events;
  }
  return sum;
}

}  // namespace bench
