#include "bench/load_bench.h"

#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace bench {
namespace {

using namespace std::chrono_literals;

constexpr std::uint32_t kMessage = 64;

// 1024 pairs on channels of their own want over 2048 fds.
void raise_fd_limit() {
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) check(errno, "setrlimit(RLIMIT_NOFILE)");
}

// One device, PD and memory region on one Dispatcher; every message of a run
// is sent from and received into the same bytes (their content is not read).
struct Loopback {
  Loopback(ibev::Dispatcher& dispatcher, const std::string& name)
      : device(ibev::Device::open(dispatcher, name)),
        pd(ibev::ProtectionDomain::create(device)),
        mr(ibev::MemoryRegion::create(pd, buffer.data(), buffer.size(), IBV_ACCESS_LOCAL_WRITE)) {}
  std::array<char, 2 * kMessage> buffer{};
  std::shared_ptr<ibev::Device> device;
  std::shared_ptr<ibev::ProtectionDomain> pd;
  std::shared_ptr<ibev::MemoryRegion> mr;
};

// A QP whose one CQ (send and receive) has `on_completion` (or is polled).
struct End {
  std::shared_ptr<ibev::CompletionQueue> cq;
  std::shared_ptr<ibev::QueuePair> qp;
};

// An RC QP with `depth` slots each way on `cq`, `on_event` its event handler.
std::shared_ptr<ibev::QueuePair> make_qp(Loopback& at,
                                         const std::shared_ptr<ibev::CompletionQueue>& cq,
                                         int depth, ibev::Handler on_event = nullptr) {
  ibev::QueuePair::Options options;
  options.send_cq = options.recv_cq = cq;
  options.cap = {static_cast<std::uint32_t>(depth), static_cast<std::uint32_t>(depth), 1, 1,
                 kMessage};
  return ibev::QueuePair::create(at.pd, std::move(on_event), options);
}

End make_end(Loopback& at, ibev::CompletionHandler on_completion,
             ibev::CompletionQueue::Options options, int depth) {
  End end;
  end.cq = on_completion ? ibev::CompletionQueue::create(at.device, std::move(on_completion),
                                                         nullptr, options)
                         : ibev::CompletionQueue::create_polled(at.device, nullptr, options);
  end.qp = make_qp(at, end.cq, depth);
  return end;
}

void connect(End& a, End& b) { ibev::connect_rc_pair(*a.qp, *b.qp); }

void post_recv(Loopback& at, End& end, int count = 1) {
  for (int i = 0; i < count; ++i) {
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(at.buffer.data() + kMessage), kMessage,
                at.mr->lkey()};
    ibv_recv_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    check(ibv_post_recv(end.qp->get(), &wr, &bad), "ibv_post_recv");
  }
}

void send(Loopback& at, End& end, bool signaled) {
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(at.buffer.data()), kMessage, at.mr->lkey()};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_INLINE | (signaled ? IBV_SEND_SIGNALED : 0);
  ibv_send_wr* bad = nullptr;
  check(ibv_post_send(end.qp->get(), &wr, &bad), "ibv_post_send");
}

void run_or_exit(const std::string& command) {
  if (std::system(command.c_str()) != 0) {
    std::fprintf(stderr, "softroce_bench: %s failed\n", command.c_str());
    std::exit(3);
  }
}

// The raw baseline's loop: one epoll over the CQs' channels; each event is
// read, acked, the CQ re-armed and drained into its handler, until `done`.
// Returns the channel events read.
std::uint64_t serve_raw(const std::unordered_map<ibv_cq*, ibev::CompletionHandler>& handlers,
                        const std::function<void()>& begin, const std::function<bool()>& done) {
  const int epoll = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll < 0) check(errno, "epoll_create1");
  std::unordered_map<int, ibv_comp_channel*> channels;
  for (const auto& [cq, handler] : handlers) {
    if (!channels.emplace(cq->channel->fd, cq->channel).second) continue;
    epoll_event interest{};
    interest.events = EPOLLIN;
    interest.data.fd = cq->channel->fd;
    if (::epoll_ctl(epoll, EPOLL_CTL_ADD, cq->channel->fd, &interest) != 0) {
      check(errno, "epoll_ctl");
    }
  }
  std::uint64_t events = 0;
  std::array<epoll_event, 64> ready;
  std::array<ibv_wc, 16> wcs;
  begin();
  while (!done()) {
    const int n = ::epoll_wait(epoll, ready.data(), static_cast<int>(ready.size()), 1000);
    if (n < 0 && errno != EINTR) check(errno, "epoll_wait");
    for (int i = 0; i < n; ++i) {
      ibv_cq* cq = nullptr;
      void* context = nullptr;
      // The channels are non-blocking (ibev made them so when it armed them).
      while (ibv_get_cq_event(channels.at(ready[i].data.fd), &cq, &context) == 0) {
        ++events;
        ibv_ack_cq_events(cq, 1);
        check(ibv_req_notify_cq(cq, 0), "ibv_req_notify_cq");
        const ibev::CompletionHandler& handler = handlers.at(cq);
        int got;
        while ((got = ibv_poll_cq(cq, static_cast<int>(wcs.size()), wcs.data())) > 0) {
          handler(ibev::CompletionBatch{cq, wcs.data(), static_cast<std::size_t>(got)});
        }
      }
    }
  }
  ::close(epoll);
  return events;
}

}  // namespace

// N QP pairs over rxe loopback, each QP with a CQ of its own, on a channel of
// its own (or on one of --channels shared ones). One message is in flight at
// a time, passed round-robin: pair i's ping, its pong, then pair i+1's ping,
// so every CQ of the set is used and the epoll set holds them all. The cost
// is the dispatching thread's CPU per work completion handled. With --mode
// raw-event the same objects and handlers are served by no Dispatcher: this
// thread's own epoll over the channels, then ibv_get_cq_event, ack, re-arm,
// drain (perftest -e's order), which is what the objects cost without ibev.
int scale(const Args& args) {
  const bool raw = args.mode == "raw-event";
  raise_fd_limit();
  const int n = args.pairs;
  const long total = args.messages;  // round trips
  ibev::Dispatcher dispatcher;
  Loopback at(dispatcher, args.device);
  std::vector<std::shared_ptr<ibev::CompletionChannel>> channels;
  for (int c = 0; c < args.channels; ++c) {
    channels.push_back(ibev::CompletionChannel::create(at.device));
  }
  std::vector<End> pings(static_cast<std::size_t>(n)), pongs(static_cast<std::size_t>(n));
  std::unordered_map<ibv_cq*, ibev::CompletionHandler> raw_handlers;
  long round_trips = 0;
  std::uint64_t completions = 0;  // handed to the handlers
  double cpu_start = 0, cpu_end = 0;
  Clock::time_point start, end;
  Flag finished;
  const auto setup_start = Clock::now();
  for (int i = 0; i < n; ++i) {
    const auto options_at = [&](int k) {
      ibev::CompletionQueue::Options options;
      options.cqe = 16;
      if (!raw) options.completion = options_for(args);
      if (!channels.empty())
        options.channel = channels[static_cast<std::size_t>(k) % channels.size()];
      return options;
    };
    ibev::CompletionHandler on_ping = [&, i](const ibev::CompletionBatch& batch) {
      completions += batch.size;
      for (const ibv_wc& wc : batch) {
        require_success(wc);
        if (wc.opcode != IBV_WC_RECV) continue;
        post_recv(at, pings[i]);
        if (++round_trips == total) {
          cpu_end = cpu_seconds(RUSAGE_THREAD);
          end = Clock::now();
          finished.set();
        } else {
          send(at, pings[(i + 1) % n], true);
        }
      }
    };
    ibev::CompletionHandler on_pong = [&, i](const ibev::CompletionBatch& batch) {
      completions += batch.size;
      for (const ibv_wc& wc : batch) {
        require_success(wc);
        if (wc.opcode != IBV_WC_RECV) continue;
        post_recv(at, pongs[i]);
        send(at, pongs[i], true);
      }
    };
    pings[i] = make_end(at, on_ping, options_at(2 * i), 16);
    pongs[i] = make_end(at, on_pong, options_at(2 * i + 1), 16);
    raw_handlers[pings[i].cq->get()] = std::move(on_ping);
    raw_handlers[pongs[i].cq->get()] = std::move(on_pong);
    connect(pings[i], pongs[i]);
    post_recv(at, pings[i], 2);
    post_recv(at, pongs[i], 2);
  }
  const double setup_s = std::chrono::duration<double>(Clock::now() - setup_start).count();
  std::uint64_t events = 0;
  const auto begin = [&] {
    cpu_start = cpu_seconds(RUSAGE_THREAD);
    start = Clock::now();
    send(at, pings[0], true);
  };
  if (raw) {
    events = serve_raw(raw_handlers, begin, [&] { return round_trips >= total; });
  } else {
    dispatcher.start();
    dispatcher.post(begin);
    if (!finished.wait(600s)) {
      std::fprintf(stderr, "softroce_bench: the round robin stalled\n");
      return 4;
    }
    dispatcher.stop();
    for (auto* ends : {&pings, &pongs}) {
      for (const End& e : *ends) events += e.cq->completion_stats().events;
    }
  }
  const double cpu = cpu_end - cpu_start;
  const double wall = std::chrono::duration<double>(end - start).count();
  std::printf(
      "scale mode=%s pairs=%d cqs=%d channels=%d round_trips=%ld completions=%llu events=%llu "
      "dispatch_cpu_s=%.3f dispatch_us_per_completion=%.3f wall_us_per_round_trip=%.1f "
      "setup_s=%.2f\n",
      raw ? "raw-event" : "ibev", n, 2 * n, args.channels > 0 ? args.channels : 2 * n, total,
      static_cast<unsigned long long>(completions), static_cast<unsigned long long>(events), cpu,
      1e6 * cpu / static_cast<double>(completions), 1e6 * wall / static_cast<double>(total),
      setup_s);
  return 0;
}

// Heap in use (glibc's count over every arena, mmapped chunks included)
// after making --pairs QP+CQ pairs, with raw verbs and then as ibev
// wrappers: what ibev adds per pair is the difference. Memory the kernel maps
// for the queues is in neither.
int memory(const Args& args) {
  raise_fd_limit();
  const auto heap = [] {
    const struct mallinfo2 m = mallinfo2();
    return static_cast<double>(m.uordblks + m.hblkhd);
  };
  const int n = args.pairs;
  ibev::Dispatcher dispatcher;
  Loopback at(dispatcher, args.device);
  ibv_context* const context = at.device->context();

  // Each pair is made in two steps, so that the CQ side (a completion
  // channel, its CQ armed and watched, its handlers) and the QP side (its
  // event handler) are counted apart.
  struct Raw {
    ibv_comp_channel* channel = nullptr;
    ibv_cq* cq = nullptr;
    ibv_qp* qp = nullptr;
  };
  const auto raw_cq = [&](Raw& raw) {
    raw.channel = ibv_create_comp_channel(context);
    raw.cq = raw.channel ? ibv_create_cq(context, 64, nullptr, raw.channel, 0) : nullptr;
    if (raw.cq == nullptr || ibv_req_notify_cq(raw.cq, 0) != 0) check(errno, "ibv_create_cq");
  };
  const auto raw_qp = [&](Raw& raw) {
    ibv_qp_init_attr attr{};
    attr.send_cq = attr.recv_cq = raw.cq;
    attr.qp_type = IBV_QPT_RC;
    attr.cap = {16, 16, 1, 1, kMessage};
    raw.qp = ibv_create_qp(at.pd->get(), &attr);
    if (raw.qp == nullptr) check(errno, "ibv_create_qp");
  };
  const auto destroy_raw = [](const Raw& raw) {
    ibv_destroy_qp(raw.qp);
    ibv_destroy_cq(raw.cq);
    ibv_destroy_comp_channel(raw.channel);
  };
  // What an application gives: a completion handler, an event handler each.
  const auto on_event = [](const ibev::Event&) {};
  const auto ibev_cq = [&](End& end) {
    ibev::CompletionQueue::Options options;
    options.cqe = 64;
    end.cq = ibev::CompletionQueue::create(
        at.device, [](const ibev::CompletionBatch&) {}, on_event, options);
  };
  const auto ibev_qp = [&](End& end) { end.qp = make_qp(at, end.cq, 16, on_event); };
  // Once each first: what is made on first use (rdma-core's and ibev's
  // tables, the Dispatcher's) is not per pair.
  {
    Raw raw;
    raw_cq(raw);
    raw_qp(raw);
    destroy_raw(raw);
    End end;
    ibev_cq(end);
    ibev_qp(end);
  }
  // Bytes per pair of each step, made for all pairs before the next step.
  const auto per_pair = [&](auto& objects, auto step) {
    const double before = heap();
    for (auto& object : objects) step(object);
    return (heap() - before) / n;
  };
  std::vector<Raw> raws(static_cast<std::size_t>(n));
  const double raw_cq_bytes = per_pair(raws, raw_cq);
  const double raw_qp_bytes = per_pair(raws, raw_qp);
  for (const Raw& raw : raws) destroy_raw(raw);
  std::vector<End> ends(static_cast<std::size_t>(n));
  const double ibev_cq_bytes = per_pair(ends, ibev_cq);
  const double ibev_qp_bytes = per_pair(ends, ibev_qp);
  const double raw_bytes = raw_cq_bytes + raw_qp_bytes, ibev_bytes = ibev_cq_bytes + ibev_qp_bytes;
  std::printf(
      "memory pairs=%d raw_bytes_per_pair=%.0f ibev_bytes_per_pair=%.0f "
      "ibev_overhead_bytes_per_pair=%.0f cq_side_overhead=%.0f qp_side_overhead=%.0f\n",
      n, raw_bytes, ibev_bytes, ibev_bytes - raw_bytes, ibev_cq_bytes - raw_cq_bytes,
      ibev_qp_bytes - raw_qp_bytes);
  return 0;
}

namespace {

// Port events as a raw ibv_get_async_event loop sees them: the moment each
// reaches a device's async fd. The thread runs SCHED_FIFO, so a busy
// dispatcher does not delay its clock.
class ArrivalClock {
 public:
  explicit ArrivalClock(const std::string& name) {
    context_ = open_raw_device(name);
    if (context_ == nullptr) check(ENODEV, "ibv_open_device");
    const int fd = context_->async_fd;
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    thread_ = std::thread([this] { run(); });
    sched_param param{};
    param.sched_priority = 50;
    if (pthread_setschedparam(thread_.native_handle(), SCHED_FIFO, &param) != 0) {
      std::fprintf(stderr, "softroce_bench: no SCHED_FIFO for the arrival clock\n");
    }
  }
  ~ArrivalClock() {
    stop_ = true;
    thread_.join();
    ibv_close_device(context_);
  }
  std::vector<Clock::time_point> arrivals() {
    std::lock_guard<std::mutex> lock(mutex_);
    return arrivals_;
  }

 private:
  void run() {
    while (!stop_) {
      pollfd fd{context_->async_fd, POLLIN, 0};
      if (::poll(&fd, 1, 50) <= 0) continue;
      ibv_async_event event{};
      while (ibv_get_async_event(context_, &event) == 0) {
        const auto now = Clock::now();
        if (event.event_type == IBV_EVENT_PORT_ERR || event.event_type == IBV_EVENT_PORT_ACTIVE) {
          std::lock_guard<std::mutex> lock(mutex_);
          arrivals_.push_back(now);
        }
        ibv_ack_async_event(&event);
      }
    }
  }

  ibv_context* context_ = nullptr;
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::vector<Clock::time_point> arrivals_;
  std::thread thread_;
};

}  // namespace

// One Dispatcher serves a CQ saturated by a sender thread (--mode, --load 1),
// a ping-pong between two other CQs, and the async fd of a second device whose
// netdev is taken down and up --rounds times. Reported: each port event's
// delay from its arrival on the async fd (ArrivalClock) to its listener's
// call, and the ping-pong's one-way latency while the flaps run. --load 0:
// no saturating sender; --load 2: the saturated CQ is served by a Dispatcher
// of its own, so the device and the CPUs are as loaded but the loop is not
// shared (what the load costs that no dispatcher could save).
int fairness(const Args& args) {
  const std::string flap_dev = "rxeflap", flap_net = "dflap";
  run_or_exit("ip link add " + flap_net + " type dummy && ip link set " + flap_net +
              " up && rdma link add " + flap_dev + " type rxe netdev " + flap_net);
  int status = 0;
  {
    ibev::Dispatcher dispatcher;
    ibev::Dispatcher apart;  // --load 2: the saturated CQ's
    Loopback at(dispatcher, args.device);
    auto flapped = ibev::Device::open(dispatcher, flap_dev);
    ArrivalClock arrivals(flap_dev);
    std::mutex mutex;
    std::condition_variable heard_cv;
    std::vector<Clock::time_point> heard;
    ibev::Handle listener = flapped->on_event(
        ibev::EventFilter{IBV_EVENT_PORT_ERR, IBV_EVENT_PORT_ACTIVE}, [&](const ibev::Event&) {
          const auto now = Clock::now();
          std::lock_guard<std::mutex> lock(mutex);
          heard.push_back(now);
          heard_cv.notify_all();
        });

    // The saturating stream: a sender thread keeps 256 in flight to `busy`.
    constexpr int kInFlight = 256;
    std::atomic<long> received{0};
    End busy, sender;
    ibev::CompletionQueue::Options busy_options;
    busy_options.cqe = 1024;
    busy_options.completion = options_for(args);
    busy_options.completion.budget = args.turn_budget;
    if (args.load == 2) busy_options.dispatcher = &apart;
    busy = make_end(
        at,
        [&](const ibev::CompletionBatch& batch) {
          for (const ibv_wc& wc : batch) require_success(wc);
          post_recv(at, busy, static_cast<int>(batch.size));
          received += static_cast<long>(batch.size);
        },
        busy_options, 512);
    ibev::CompletionQueue::Options sender_options;
    sender_options.cqe = 1024;
    sender = make_end(at, {}, sender_options, 512);
    connect(busy, sender);
    post_recv(at, busy, 512);

    // The ping-pong, in event mode, on the same Dispatcher.
    std::atomic<bool> pinging{true};
    std::vector<double> one_way_us;
    Clock::time_point sent_at;
    bool recording = false;
    End ping, pong;
    ibev::CompletionQueue::Options event_options;
    event_options.cqe = 64;
    ping = make_end(
        at,
        [&](const ibev::CompletionBatch& batch) {
          for (const ibv_wc& wc : batch) {
            require_success(wc);
            if (wc.opcode != IBV_WC_RECV) continue;
            post_recv(at, ping);
            if (recording) {
              one_way_us.push_back(
                  std::chrono::duration<double, std::micro>(Clock::now() - sent_at).count() / 2);
            }
            if (!pinging) continue;
            sent_at = Clock::now();
            send(at, ping, true);
          }
        },
        event_options, 16);
    pong = make_end(
        at,
        [&](const ibev::CompletionBatch& batch) {
          for (const ibv_wc& wc : batch) {
            require_success(wc);
            if (wc.opcode != IBV_WC_RECV) continue;
            post_recv(at, pong);
            send(at, pong, true);
          }
        },
        event_options, 16);
    connect(ping, pong);
    post_recv(at, ping, 4);
    post_recv(at, pong, 4);

    dispatcher.start();
    apart.start();
    std::atomic<bool> sending{args.load != 0};
    long sent = 0;
    std::thread traffic([&] {
      std::array<ibv_wc, 32> wcs;
      while (sending) {
        if (sent - received.load() >= kInFlight) {
          std::this_thread::yield();
          continue;
        }
        send(at, sender, ++sent % 32 == 0);
        const int n = ibv_poll_cq(sender.cq->get(), 32, wcs.data());
        for (int i = 0; i < n; ++i) require_success(wcs[i]);
      }
    });
    dispatcher.post([&] {
      sent_at = Clock::now();
      send(at, ping, true);
    });
    std::this_thread::sleep_for(300ms);  // the stream and the ping-pong settle
    const long received_before = received.load();
    dispatcher.post([&] { recording = true; });
    const auto flaps_start = Clock::now();
    std::vector<double> flap_to_listener_us;
    for (int round = 0; round < args.rounds && status == 0; ++round) {
      for (bool up : {false, true}) {
        std::unique_lock<std::mutex> lock(mutex);
        const std::size_t before = heard.size();
        const auto flapped_at = Clock::now();
        if (!set_link(flap_net, up)) check(errno, "SIOCSIFFLAGS");
        if (!heard_cv.wait_for(lock, 10s, [&] { return heard.size() > before; })) {
          std::fprintf(stderr, "softroce_bench: no port event within 10 s\n");
          status = 4;
          break;
        }
        flap_to_listener_us.push_back(
            std::chrono::duration<double, std::micro>(heard.back() - flapped_at).count());
        lock.unlock();
        std::this_thread::sleep_for(20ms);
      }
    }
    const double window = std::chrono::duration<double>(Clock::now() - flaps_start).count();
    const long streamed = received.load() - received_before;
    Flag stopped;
    dispatcher.post([&] {
      recording = false;
      pinging = false;
      stopped.set();
    });
    stopped.wait(10s);
    sending = false;
    traffic.join();
    std::this_thread::sleep_for(100ms);  // what was in flight lands
    dispatcher.stop();
    apart.stop();

    std::vector<Clock::time_point> arrived = arrivals.arrivals();
    std::vector<double> port_us;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (arrived.size() != heard.size()) {
        std::fprintf(stderr, "softroce_bench: %zu port events arrived, %zu heard\n", arrived.size(),
                     heard.size());
      }
      for (std::size_t i = 0; i < std::min(arrived.size(), heard.size()); ++i) {
        port_us.push_back(std::chrono::duration<double, std::micro>(heard[i] - arrived[i]).count());
      }
    }
    const Distribution port(std::move(port_us)), flap(std::move(flap_to_listener_us)),
        latency(std::move(one_way_us));
    std::printf(
        "fairness load=%d mode=%s turn_budget=%u rounds=%d port_events=%zu port_p50_us=%.1f "
        "port_p99_us=%.1f port_max_us=%.1f flap_to_listener_p50_us=%.1f pingpongs=%zu "
        "pingpong_p50_us=%.1f pingpong_p99_us=%.1f saturating_per_s=%.0f\n",
        args.load, args.mode.c_str(), args.turn_budget, args.rounds, port.size(), port.at(0.5),
        port.at(0.99), port.at(1.0), flap.at(0.5), latency.size(), latency.at(0.5),
        latency.at(0.99), static_cast<double>(streamed) / window);
  }
  run_or_exit("rdma link delete " + flap_dev + " && ip link del " + flap_net);
  return status;
}

}  // namespace bench
