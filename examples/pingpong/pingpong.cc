// ibev-pingpong: two processes, one RC connection, a message back and forth
// ITERS times: what every verbs program does first. It is rdma-core's
// ibv_rc_pingpong on ibev, and swaps endpoints exactly as ibv_rc_pingpong does
// (RcEndpoint's wire form over TCP), so either end may be ibv_rc_pingpong.
//
//   ibev-pingpong [-d DEVICE] [-g GID_INDEX] [-p TCP_PORT] [-n ITERS] [-s SIZE]
//                 [-t SECONDS] [SERVER]
//
// Without SERVER it waits for one client on TCP_PORT (default 18515, as
// ibv_rc_pingpong); with it, it connects to SERVER:TCP_PORT and sends first.
// Give both ends the same -s (ibv_rc_pingpong's default is 4096 too). Exits 0
// after ITERS messages each way; 1, saying why on stderr, on any error or
// when the whole run takes longer than -t (default 30 s); 2 for a usage error.
//
// The order is the one that avoids the classic races: receives are posted in
// INIT, before the peer learns our endpoint (so its first send never finds
// an empty receive queue); the server is in RTR before it answers the
// client; the PSN we send from is the QP's (QueuePairOptions::psn, random by
// default), never edited on the endpoint.
#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <ibev/dispatch/dispatcher.h>
#include <ibev/verbs/completion_queue.h>
#include <ibev/verbs/device.h>
#include <ibev/verbs/protection_domain.h>
#include <ibev/verbs/queue_pair.h>
#include <ibev/verbs/rc_endpoint.h>

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string device;  // empty: the first
  int gid_index = 0;
  std::string tcp_port = "18515";
  int iters = 1000;
  std::size_t size = 4096;
  int timeout_s = 30;
  std::string server;  // empty: we are the server
};

// -h: the usage on stdout, exit 0; a usage error: on stderr, exit 2.
[[noreturn]] void usage(const char* argv0, int status = 2) {
  std::fprintf(status == 0 ? stdout : stderr,
               "usage: %s [-d DEVICE] [-g GID_INDEX] [-p TCP_PORT] [-n ITERS] [-s SIZE] "
               "[-t SECONDS] [SERVER]\n",
               argv0);
  std::exit(status);
}

int number(const char* text, long min, const char* argv0) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < min || value > 1 << 30) usage(argv0);
  return static_cast<int>(value);
}

Args parse(int argc, char** argv) {
  Args args;
  for (int opt; (opt = ::getopt(argc, argv, "d:g:p:n:s:t:h")) != -1;) {
    switch (opt) {
      case 'd': args.device = optarg; break;
      case 'g': args.gid_index = number(optarg, 0, argv[0]); break;
      case 'p': args.tcp_port = optarg; break;
      case 'n': args.iters = number(optarg, 1, argv[0]); break;
      case 's': args.size = static_cast<std::size_t>(number(optarg, 1, argv[0])); break;
      case 't': args.timeout_s = number(optarg, 1, argv[0]); break;
      case 'h': usage(argv[0], 0);
      default: usage(argv[0]);
    }
  }
  if (optind + 1 < argc) usage(argv[0]);
  if (optind < argc) args.server = argv[optind];
  return args;
}

// The TCP side: a connected socket, whole reads and writes, none waiting
// past the run's deadline.
class Socket {
 public:
  Socket(int fd, Clock::time_point deadline) : fd_(fd), deadline_(deadline) {}
  Socket(Socket&& other) noexcept
      : fd_(std::exchange(other.fd_, -1)), deadline_(other.deadline_) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  // The one client, on `port` of any local address.
  static Socket accept_one(const std::string& port, Clock::time_point deadline);
  // HOST:port, each of its addresses, retried while nobody listens yet.
  static Socket connect_to(const std::string& host, const std::string& port,
                           Clock::time_point deadline);

  void write_all(const void* data, std::size_t size) const {
    for (auto* at = static_cast<const char*>(data); size > 0;) {
      const ssize_t n = ::write(fd_, at, size);
      if (n < 0) throw std::system_error(errno, std::generic_category(), "write");
      at += n;
      size -= static_cast<std::size_t>(n);
    }
  }
  void read_all(void* data, std::size_t size) const {
    for (auto* at = static_cast<char*>(data); size > 0;) {
      wait_readable("read");
      const ssize_t n = ::read(fd_, at, size);
      if (n < 0) throw std::system_error(errno, std::generic_category(), "read");
      if (n == 0) throw std::runtime_error("read: the peer closed the connection");
      at += n;
      size -= static_cast<std::size_t>(n);
    }
  }

 private:
  // Throws ETIMEDOUT, naming `what`, when nothing comes before the deadline.
  void wait_readable(const char* what) const {
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline_ - Clock::now());
      pollfd ready{fd_, POLLIN, 0};
      const int n = ::poll(&ready, 1, static_cast<int>(std::max<long long>(left.count(), 0)));
      if (n > 0) return;
      if (n == 0) throw std::system_error(ETIMEDOUT, std::generic_category(), what);
      if (errno != EINTR) throw std::system_error(errno, std::generic_category(), "poll");
    }
  }

  int fd_;
  Clock::time_point deadline_;
};

// getaddrinfo's list, freed however the caller leaves.
using AddressList = std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)>;

AddressList resolve(const char* host, const std::string& port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = host == nullptr ? AI_PASSIVE : 0;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host, port.c_str(), &hints, &found); rc != 0) {
    throw std::runtime_error(std::string("getaddrinfo: ") + ::gai_strerror(rc));
  }
  return AddressList(found, &::freeaddrinfo);
}

Socket Socket::accept_one(const std::string& port, Clock::time_point deadline) {
  int error = 0;
  const AddressList addresses = resolve(nullptr, port);
  for (const addrinfo* a = addresses.get(); a != nullptr; a = a->ai_next) {
    Socket listener(::socket(a->ai_family, a->ai_socktype, a->ai_protocol), deadline);
    if (listener.fd_ < 0) {
      error = errno;
      continue;
    }
    const int yes = 1;
    ::setsockopt(listener.fd_, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (::bind(listener.fd_, a->ai_addr, a->ai_addrlen) != 0 || ::listen(listener.fd_, 1) != 0) {
      error = errno;
      continue;
    }
    listener.wait_readable("accept (no client came)");
    Socket client(::accept(listener.fd_, nullptr, nullptr), deadline);
    if (client.fd_ < 0) throw std::system_error(errno, std::generic_category(), "accept");
    return client;
  }
  throw std::system_error(error, std::generic_category(), "listen on port " + port);
}

Socket Socket::connect_to(const std::string& host, const std::string& port,
                          Clock::time_point deadline) {
  for (;;) {
    int error = 0;
    const AddressList addresses = resolve(host.c_str(), port);
    for (const addrinfo* a = addresses.get(); a != nullptr; a = a->ai_next) {
      Socket s(::socket(a->ai_family, a->ai_socktype, a->ai_protocol), deadline);
      if (s.fd_ >= 0 && ::connect(s.fd_, a->ai_addr, a->ai_addrlen) == 0) return s;
      error = errno;
    }
    if (error != ECONNREFUSED || Clock::now() >= deadline) {
      throw std::system_error(error, std::generic_category(), "connect to " + host + ":" + port);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void print(const char* who, const ibev::RcEndpoint& e) {
  char gid[64];
  ::inet_ntop(AF_INET6, e.gid().raw, gid, sizeof gid);
  std::printf("  %s address:  LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s\n", who, e.lid(),
              e.qp_num(), e.psn(), gid);
}

// The traffic, driven by completions on the dispatching thread: a side sends
// its next message once its last send has completed and the peer's answer to
// it has arrived (the client sends first), as ibv_rc_pingpong does. Uses the
// QP and memory region run() owns: run() calls stop() before they go, on
// every way out (a timeout leaves traffic in flight, and the CQ's handler
// runs until the CQ goes, after them).
class Pingpong {
 public:
  static constexpr int kReceives = 16;  // posted at all times

  Pingpong(const Args& args, bool client) : args_(args), client_(client), memory_(2 * args.size) {}

  void attach(ibev::QueuePair& qp, const ibev::MemoryRegion& mr) {
    qp_ = &qp;
    mr_ = &mr;
  }
  char* memory() { return memory_.data(); }
  std::size_t memory_size() const { return memory_.size(); }
  std::future<std::string> outcome() { return finished_.get_future(); }

  void post_receive() {
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(memory_.data() + args_.size),
                static_cast<std::uint32_t>(args_.size), mr_->lkey()};
    ibv_recv_wr wr{};
    wr.wr_id = kRecv;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    qp_->post_recv(wr);
  }

  // Called with the lock held, or before traffic starts.
  void send_next() {
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(memory_.data()),
                static_cast<std::uint32_t>(args_.size), mr_->lkey()};
    ibv_send_wr wr{};
    wr.wr_id = kSend;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    qp_->post_send(wr);
    ++sent_;
    send_in_flight_ = true;
  }

  // From here on the handler touches nothing; returns after a running one.
  void stop() {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
  }

  void start_sending() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (client_) send_next();
  }

  void on_completions(const ibev::CompletionBatch& batch) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_) return;
    try {
      for (const ibv_wc& wc : batch) {
        if (wc.status != IBV_WC_SUCCESS) {
          return finish(std::string(wc.wr_id == kSend ? "send" : "receive") + " completed with " +
                        ibv_wc_status_str(wc.status));
        }
        if (wc.wr_id == kSend) {
          send_in_flight_ = false;
        } else {
          ++received_;
          post_receive();
        }
      }
      if (sent_ == args_.iters && received_ == args_.iters && !send_in_flight_) return finish("");
      // The client answers after its own message came back; the server
      // answers each message it received.
      const int answered = client_ ? sent_ : sent_ + 1;
      if (sent_ < args_.iters && !send_in_flight_ && received_ >= answered) send_next();
    } catch (const std::exception& e) {
      finish(e.what());
    }
  }

 private:
  static constexpr std::uint64_t kSend = 1, kRecv = 2;

  void finish(std::string error) {
    done_ = true;
    finished_.set_value(std::move(error));
  }

  const Args& args_;
  const bool client_;
  std::vector<char> memory_;  // [send | receive], size bytes each
  ibev::QueuePair* qp_ = nullptr;
  const ibev::MemoryRegion* mr_ = nullptr;
  std::mutex mutex_;
  int sent_ = 0, received_ = 0;
  bool send_in_flight_ = false, done_ = false;
  std::promise<std::string> finished_;
};

int run(const Args& args) {
  const bool client = !args.server.empty();
  const auto deadline = Clock::now() + std::chrono::seconds(args.timeout_s);
  ibev::Dispatcher dispatcher;
  auto device = ibev::Device::open(dispatcher, args.device);
  auto pd = ibev::ProtectionDomain::create(device);
  Pingpong pingpong(args, client);
  auto cq = ibev::CompletionQueue::create(
      device, [&](const ibev::CompletionBatch& batch) { pingpong.on_completions(batch); },
      [](const ibev::Event& e) { std::fprintf(stderr, "CQ: %s\n", e.name().data()); });
  ibev::QueuePair::Options options;
  options.send_cq = options.recv_cq = cq;
  options.cap.max_recv_wr = Pingpong::kReceives;
  auto qp = ibev::QueuePair::create(
      pd, [](const ibev::Event& e) { std::fprintf(stderr, "QP: %s\n", e.name().data()); },
      options);
  auto mr = ibev::MemoryRegion::create(pd, pingpong.memory(), pingpong.memory_size(),
                                      IBV_ACCESS_LOCAL_WRITE);
  pingpong.attach(*qp, *mr);
  struct StopFirst {  // destroyed before mr and qp, however run() ends
    Pingpong& pingpong;
    ~StopFirst() { pingpong.stop(); }
  } stop_first{pingpong};
  dispatcher.start();

  ibev::ConnectOptions connect_options;
  connect_options.gid_index = args.gid_index;
  qp->to_init(connect_options);
  for (int i = 0; i < Pingpong::kReceives; ++i) pingpong.post_receive();
  const ibev::RcEndpoint ours = qp->endpoint(connect_options.port, args.gid_index);
  print("local", ours);

  std::array<char, ibev::RcEndpoint::kWireSize> wire = ours.to_wire();
  char done[sizeof "done"] = "done";
  ibev::RcEndpoint theirs;
  if (client) {
    Socket peer = Socket::connect_to(args.server, args.tcp_port, deadline);
    peer.write_all(wire.data(), wire.size());
    peer.read_all(wire.data(), wire.size());
    theirs = ibev::RcEndpoint::from_wire({wire.data(), wire.size()});
    qp->connect(theirs, connect_options);
    peer.write_all(done, sizeof done);
  } else {
    Socket peer = Socket::accept_one(args.tcp_port, deadline);
    std::array<char, ibev::RcEndpoint::kWireSize> remote{};
    peer.read_all(remote.data(), remote.size());
    theirs = ibev::RcEndpoint::from_wire({remote.data(), remote.size()});
    qp->connect(theirs, connect_options);  // in RTR before the client may send
    peer.write_all(wire.data(), wire.size());
    peer.read_all(done, sizeof done);
  }
  print("remote", theirs);

  auto outcome = pingpong.outcome();
  const auto started = Clock::now();
  pingpong.start_sending();
  if (outcome.wait_until(deadline) != std::future_status::ready) {
    std::fprintf(stderr, "ibev-pingpong: not done within %d s\n", args.timeout_s);
    return 1;
  }
  if (const std::string error = outcome.get(); !error.empty()) {
    std::fprintf(stderr, "ibev-pingpong: %s\n", error.c_str());
    return 1;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  std::printf("%d iters in %.2f seconds = %.2f usec/iter\n", args.iters, seconds,
              seconds * 1e6 / args.iters);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  try {
    return run(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ibev-pingpong: %s\n", e.what());
    return 1;
  }
}
