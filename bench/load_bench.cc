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
#include <cstring>
#include <functional>
#include <memory>
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

// --mode raw-event's loop, perftest's order, hash-indexed: one epoll over the
// CQs' channels; each ready channel is read until EAGAIN, and each event is
// acked, its CQ re-armed, then drained into its handler (found by fd and by
// CQ in hash maps), until `done`. Arming before draining makes nearly every
// completion raise an event of its own. Returns the channel events read.
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
// is the dispatching thread's CPU per work completion handled. The raw modes
// serve the same objects and handlers with no Dispatcher running, on this
// thread's own epoll over the channels, which is what the objects cost
// without ibev: --mode raw-event in perftest -e's order, hash-indexed
// (serve_raw); --mode raw-floor in ibev's order, indexed by pointer
// (FloorLoop, bench/harness.h), the floor under ibev's loop. events_per_completion shows
// whether two loops did the same event work.
int scale(const Args& args) {
  const bool raw_event = args.mode == "raw-event";
  const bool raw_floor = args.mode == "raw-floor";
  const bool raw = raw_event || raw_floor;
  raise_fd_limit();
  const int n = args.pairs;
  const long total = args.messages;  // round trips
  // The raw modes never start it: it runs no watchdog either, so that
  // nothing of ibev's runs beside the baseline (as harness.cc's Sides).
  ibev::Dispatcher::Options dispatcher_options;
  if (raw) dispatcher_options.stall_after = std::chrono::milliseconds(0);
  ibev::Dispatcher dispatcher(dispatcher_options);
  Loopback at(dispatcher, args.device);
  std::vector<std::shared_ptr<ibev::CompletionChannel>> channels;
  for (int c = 0; c < args.channels; ++c) {
    channels.push_back(ibev::CompletionChannel::create(at.device));
  }
  std::vector<End> pings(static_cast<std::size_t>(n)), pongs(static_cast<std::size_t>(n));
  std::unordered_map<ibv_cq*, ibev::CompletionHandler> raw_handlers;  // raw-event's
  std::vector<FloorCq> floor_cqs;                                     // raw-floor's
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
    if (raw_event) {
      raw_handlers[pings[i].cq->get()] = std::move(on_ping);
      raw_handlers[pongs[i].cq->get()] = std::move(on_pong);
    } else if (raw_floor) {
      floor_cqs.push_back({pings[i].cq->get(), std::move(on_ping)});
      floor_cqs.push_back({pongs[i].cq->get(), std::move(on_pong)});
    }
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
  const auto done = [&] { return round_trips >= total; };
  // The raw loops run on a thread of their own, this one waiting, as a
  // Dispatcher's does (run_on_own_thread: what glibc costs differs).
  if (raw_event) {
    run_on_own_thread([&] { events = serve_raw(raw_handlers, begin, done); });
  } else if (raw_floor) {
    // The ack batch and the reads per channel of ibev's run of this benchmark.
    FloorLoop floor(floor_cqs, options_for(args).ack_batch, dispatcher_options.batch);
    bool served = false;
    run_on_own_thread([&] {
      begin();
      served = floor.run(done);
    });
    if (!served) {
      std::fprintf(stderr, "softroce_bench: the round robin stalled\n");
      return 4;
    }
    events = floor.events();
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
  const char* const mode = raw_event ? "raw-event" : raw_floor ? "raw-floor" : "ibev";
  std::printf(
      "scale mode=%s pairs=%d cqs=%d channels=%d round_trips=%ld completions=%llu events=%llu "
      "events_per_completion=%.3f dispatch_cpu_s=%.3f dispatch_us_per_completion=%.3f "
      "wall_us_per_round_trip=%.1f setup_s=%.2f\n",
      mode, n, 2 * n, args.channels > 0 ? args.channels : 2 * n, total,
      static_cast<unsigned long long>(completions), static_cast<unsigned long long>(events),
      static_cast<double>(events) / static_cast<double>(completions), cpu,
      1e6 * cpu / static_cast<double>(completions), 1e6 * wall / static_cast<double>(total),
      setup_s);
  return 0;
}

// Heap in use (glibc's count over every arena, mmapped chunks included)
// after making --pairs QP+CQ pairs, with raw verbs and then as ibev
// wrappers: what ibev adds per pair is the difference. Memory the kernel maps
// for the queues is in neither.
//
// The headline (the `memory` line): a CQ with a completion and an event
// handler, then a QP with an event handler, each made for every pair before
// the next, against raw channel+CQ (armed) and raw QP. Then the breakdown,
// one `memory_step` line per kind, so that what each part of a pair costs is
// measured, not estimated: cq_polled (the wrapper and its CQ, against a raw
// CQ without a channel), cq_watched (a completion handler: the channel and
// its watch), cq_event_handler (and an event handler), qp, qp_event_handler
// (each against raw channel+CQ or raw QP). `memory_growth` is what the
// headline's first N cost beyond N more of the same kinds: the Dispatcher's
// tables (by fd, the registry's) growing to N, which the breakdown's kinds
// find grown.
int memory(const Args& args) {
  raise_fd_limit();
  const auto heap = [] {
    const struct mallinfo2 m = mallinfo2();
    return static_cast<double>(m.uordblks + m.hblkhd);
  };
  const int n = args.pairs;
  const auto count = static_cast<std::size_t>(n);
  ibev::Dispatcher dispatcher;
  // Bytes per pair of one kind, made for all pairs.
  const auto per_pair = [&](auto& objects, auto step) {
    const double before = heap();
    for (auto& object : objects) step(object);
    return (heap() - before) / n;
  };
  // What an application gives: a completion handler, an event handler each.
  const auto on_completion = [](const ibev::CompletionBatch&) {};
  const auto on_event = [](const ibev::Event&) {};
  const auto cq_options = [] {
    ibev::CompletionQueue::Options options;
    options.cqe = 64;
    return options;
  };
  const auto cq_polled = [&](Loopback& at, End& end) {
    end.cq = ibev::CompletionQueue::create_polled(at.device, nullptr, cq_options());
  };
  const auto cq_watched = [&](Loopback& at, End& end) {
    end.cq = ibev::CompletionQueue::create(at.device, on_completion, nullptr, cq_options());
  };
  const auto cq_event_handler = [&](Loopback& at, End& end) {
    end.cq = ibev::CompletionQueue::create(at.device, on_completion, on_event, cq_options());
  };
  const auto qp = [&](Loopback& at, End& end) { end.qp = make_qp(at, end.cq, 16); };
  const auto qp_event_handler = [&](Loopback& at, End& end) {
    end.qp = make_qp(at, end.cq, 16, on_event);
  };

  double raw_polled_cq_bytes = 0, raw_cq_bytes = 0, raw_qp_bytes = 0;
  double ibev_cq_bytes = 0, ibev_qp_bytes = 0;
  {
    Loopback at(dispatcher, args.device);
    ibv_context* const context = at.device->context();
    struct Raw {
      ibv_comp_channel* channel = nullptr;
      ibv_cq* cq = nullptr;
      ibv_qp* qp = nullptr;
    };
    const auto raw_polled_cq = [&](Raw& raw) {
      raw.cq = ibv_create_cq(context, 64, nullptr, nullptr, 0);
      if (raw.cq == nullptr) check(errno, "ibv_create_cq");
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
      if (raw.qp != nullptr) ibv_destroy_qp(raw.qp);
      ibv_destroy_cq(raw.cq);
      if (raw.channel != nullptr) ibv_destroy_comp_channel(raw.channel);
    };
    // Once each first: what is made on first use (rdma-core's and ibev's
    // tables, the Dispatcher's) is not per pair. The ibev ones are kept: a
    // wrapper released stays allocated while the Device's list of its
    // objects holds a weak_ptr to it, and that list forgets the expired ones
    // when it doubles, which would free them in the middle of a measurement.
    {
      Raw raw;
      raw_cq(raw);
      raw_qp(raw);
      destroy_raw(raw);
      Raw polled;
      raw_polled_cq(polled);
      destroy_raw(polled);
    }
    End warm;
    cq_event_handler(at, warm);
    qp_event_handler(at, warm);

    // Each kind made for all pairs before the next, as today's headline was.
    // Each pair is made in two steps, so that the CQ side (a completion
    // channel, its CQ armed and watched, its handlers) and the QP side (its
    // event handler) are counted apart.
    std::vector<Raw> raws(count);
    raw_cq_bytes = per_pair(raws, raw_cq);
    raw_qp_bytes = per_pair(raws, raw_qp);
    for (const Raw& raw : raws) destroy_raw(raw);
    std::vector<Raw> polled(count);
    raw_polled_cq_bytes = per_pair(polled, raw_polled_cq);
    for (const Raw& raw : polled) destroy_raw(raw);
    std::vector<End> ends(count);
    ibev_cq_bytes = per_pair(ends, [&](End& end) { cq_event_handler(at, end); });
    ibev_qp_bytes = per_pair(ends, [&](End& end) { qp_event_handler(at, end); });
    if (args.command == "memory-blocks") {
      // Under valgrind's DHAT (bench/vm_benchmarks.sh), which lists the
      // blocks live at exit by where they were made: an exit that destroys
      // nothing leaves it all that is held, the pairs among the rest (the
      // Dispatcher, the device), and bench/dhat_blocks.py picks out ibev's
      // places that made a block or more per pair.
      std::printf("memory_blocks pairs=%d\n", n);
      std::fflush(stdout);
      std::_Exit(0);
    }
  }  // released with their device, before the breakdown

  // One kind of the breakdown: made on a device of its own (so that its
  // Device's list of objects grows from one, as the headline's did, and
  // nothing released before is freed during it), after one of the kind
  // (first use on that device); QPs on CQs with both handlers made first,
  // not counted. Released with the device before the next kind.
  const auto step = [&](const char* name, double raw_bytes, bool on_cqs, const auto& make) {
    Loopback at(dispatcher, args.device);
    std::vector<End> ends(count + 1);  // the last: the warm-up
    if (on_cqs) {
      for (End& end : ends) cq_event_handler(at, end);
    }
    make(at, ends.back());
    const double before = heap();
    for (std::size_t i = 0; i < count; ++i) make(at, ends[i]);
    const double bytes = (heap() - before) / n;
    std::printf(
        "memory_step name=%s bytes_per_pair=%.0f raw_bytes_per_pair=%.0f "
        "overhead_bytes_per_pair=%.0f\n",
        name, bytes, raw_bytes, bytes - raw_bytes);
    return bytes;
  };
  step("cq_polled", raw_polled_cq_bytes, false, cq_polled);
  step("cq_watched", raw_cq_bytes, false, cq_watched);
  const double again_cq_bytes = step("cq_event_handler", raw_cq_bytes, false, cq_event_handler);
  step("qp", raw_qp_bytes, true, qp);
  const double again_qp_bytes = step("qp_event_handler", raw_qp_bytes, true, qp_event_handler);

  const double raw_bytes = raw_cq_bytes + raw_qp_bytes, ibev_bytes = ibev_cq_bytes + ibev_qp_bytes;
  std::printf("memory_growth bytes_per_pair=%.0f\n", ibev_bytes - again_cq_bytes - again_qp_bytes);
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

// fairness pins its threads alike in every configuration, so that what
// differs between them is the loop, not which threads share a CPU: every
// Dispatcher's thread on CPU 0, the saturating sender on CPU 1.
constexpr int kDispatcherCpu = 0;
constexpr int kTrafficCpu = 1;

// Pins the calling thread to `cpu`. A run where that fails goes on (a VM
// with one CPU still gives figures), saying so.
void pin_to(int cpu, const char* who) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (const int rc = pthread_setaffinity_np(pthread_self(), sizeof set, &set); rc != 0) {
    std::fprintf(stderr, "softroce_bench: %s not pinned to CPU %d: %s\n", who, cpu,
                 std::strerror(rc));
  }
}

// Pins `dispatcher`'s running thread from inside it; returns when it did.
// The task shares its Flag: it may still run after a wait that timed out.
void pin_dispatcher(ibev::Dispatcher& dispatcher) {
  const auto pinned = std::make_shared<Flag>();
  dispatcher.post([pinned] {
    pin_to(kDispatcherCpu, "a Dispatcher's thread");
    pinned->set();
  });
  if (!pinned->wait(10s)) {
    std::fprintf(stderr, "softroce_bench: a Dispatcher did not run its pinning task\n");
  }
}

}  // namespace

// One Dispatcher serves a CQ saturated by a sender thread (--mode, --load 1),
// a ping-pong between two other CQs, and the async fd of a second device whose
// netdev is taken down and up --rounds times. Reported: each port event's
// delay from its arrival on the async fd (ArrivalClock) to its listener's
// call, and the ping-pong's one-way latency while the flaps run. --load 0:
// no saturating sender; --load 2: the saturated CQ is served by a Dispatcher
// of its own, so the device and the CPUs are as loaded but the loop is not
// shared (what the load costs that no dispatcher could save). --load-rate R:
// the sender paces itself to R messages/s, so that every configuration
// carries the same load (a closed loop carries whatever its placement
// lets the receiver drain); 0: the closed loop. Either way at most 256 are in
// flight; cap_hits counts the sends that cap held back in the window.
int fairness(const Args& args) {
  if (args.load_rate < 0) {
    std::fprintf(stderr, "softroce_bench: --load-rate is >= 0\n");
    return 2;
  }
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
    pin_dispatcher(dispatcher);
    pin_dispatcher(apart);
    std::atomic<bool> sending{args.load != 0};
    std::atomic<long> cap_hits{0};
    long sent = 0;
    std::thread traffic([&] {
      pin_to(kTrafficCpu, "the traffic thread");
      std::array<ibv_wc, 32> wcs;
      // Message k is due at paced_start + k / load_rate: computed from the
      // count rather than summed, so that rounding does not drift the rate.
      const auto paced_start = Clock::now();
      const auto due = [&](long k) {
        return paced_start +
               std::chrono::duration_cast<Clock::duration>(
                   std::chrono::duration<double>(static_cast<double>(k) / args.load_rate));
      };
      bool capped = false;  // the cap holds back the send due now: counted once
      while (sending) {
        if (args.load_rate > 0 && Clock::now() < due(sent)) {
          std::this_thread::yield();
          continue;
        }
        if (sent - received.load() >= kInFlight) {
          if (!capped) ++cap_hits;
          capped = true;
          std::this_thread::yield();
          continue;
        }
        capped = false;
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
    const long cap_hits_before = cap_hits.load();
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
    const long window_cap_hits = cap_hits.load() - cap_hits_before;
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
    // p50 and p90 of 100 port events (50 rounds x 2 flaps) are order
    // statistics with room above them; their p99 would be the max, printed
    // as such.
    std::printf(
        "fairness load=%d mode=%s turn_budget=%u rounds=%d load_rate=%d port_events=%zu "
        "port_p50_us=%.1f port_p90_us=%.1f port_p99_us=%s port_max_us=%.1f "
        "flap_to_listener_p50_us=%.1f pingpongs=%zu pingpong_p50_us=%.1f pingpong_p99_us=%s "
        "saturating_per_s=%.0f cap_hits=%ld\n",
        args.load, args.mode.c_str(), args.turn_budget, args.rounds, args.load_rate, port.size(),
        port.at(0.5), port.at(0.9), port.text_at(0.99).c_str(), port.at(1.0), flap.at(0.5),
        latency.size(), latency.at(0.5), latency.text_at(0.99).c_str(),
        static_cast<double>(streamed) / window, window_cap_hits);
  }
  run_or_exit("rdma link delete " + flap_dev + " && ip link del " + flap_net);
  return status;
}

}  // namespace bench
