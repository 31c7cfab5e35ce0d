// Benchmarks on a soft-RoCE device; they print figures and never fail on
// timing. bench/run_benchmarks.sh runs them in one VM session beside perftest
// and writes docs/benchmarks.md.
//
//   softroce_bench latency --mode event|adaptive|raw-poll|raw-event|raw-floor
//                          [--iters N] [--budget-us B] [--ack-batch K]
//                          [--cpus SERVER,CLIENT] [--executor worker]
//                          [--samples FILE] [--signal-every K]
//                          [--send-cq polled|event]
//   softroce_bench rate --mode event|adaptive|raw-event [--size BYTES] [--depth D]
//                       [--signal-every K] [--messages N] [--cpus S,C]
//   softroce_bench stream --ack-batch K [--messages N]
//   softroce_bench scale --pairs N [--channels C] [--messages N]
//                        [--mode ibev|raw-event|raw-floor]
//   softroce_bench memory --pairs N
//   softroce_bench memory-blocks --pairs N  (for DHAT: exits holding the pairs)
//   softroce_bench fairness --load 0|1|2 [--load-rate MSGS_PER_S] [--rounds N]
//                           [--seconds S]
//   softroce_bench link-down --netdev NAME [--rounds N]
//   softroce_bench idle --budget-us B [--seconds S]
//   softroce_bench removal --holder ibev|raw [--rounds N] [--hold-ms M]
//
// latency: a 2-byte RC send ping-pong between two processes (fork), as
// perftest's ib_send_lat does, each process with its own Dispatcher; the
// receive CQ's completion handler answers. One-way latency = RTT / 2.
// raw-event and raw-floor are the same ping-pong without ibev: perftest -e's
// loop, and ibev's order (the floor under event mode). `--signal-every 1
// --send-cq event` is ib_send_lat -e's work: every send signaled, its
// completion taken through the event path (raw-poll has no event path).
// rate: a stream of SENDs from one process to another, as perftest's
// ib_send_bw: the client keeps --depth sends outstanding, one in
// --signal-every signaled, and posts more from its send CQ's completion
// handler; the server's receive CQ handler posts the receives back.
// scale, memory, fairness: bench/load_bench.cc.
#include <fcntl.h>
#include <ibev/dispatch/worker_thread.h>
#include <ibev/verbs/device_clients.h>
#include <ibev/verbs/shared_receive_queue.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench/harness.h"
#include "bench/load_bench.h"

namespace bench {
namespace {

using namespace std::chrono_literals;

// The raw-event baseline's loop, as perftest's -e and most hand-written code
// wait: this thread sleeps in a blocking ibv_get_cq_event on `cq`'s channel,
// acks the event at once, re-arms, and drains the CQ into `handler`, until
// `done()`. The CQ was armed when its Side watched it (its Dispatcher is
// never started). False when a read failed.
template <typename Done>
bool raw_event_loop(ibv_cq* cq, const ibev::CompletionHandler& handler, const Done& done) {
  std::array<ibv_wc, 16> wcs;
  while (!done()) {
    ibv_cq* event_cq = nullptr;
    void* context = nullptr;
    if (ibv_get_cq_event(cq->channel, &event_cq, &context) != 0) return false;
    ibv_ack_cq_events(event_cq, 1);
    check(ibv_req_notify_cq(event_cq, 0), "ibv_req_notify_cq");
    int n;
    while ((n = ibv_poll_cq(cq, static_cast<int>(wcs.size()), wcs.data())) > 0) {
      handler(ibev::CompletionBatch{cq, wcs.data(), static_cast<std::size_t>(n)});
    }
  }
  return true;
}

// ibev made the channel's fd non-blocking when its Side watched the CQ; the
// raw loop blocks on it. Called before the peers' barrier, so that a failure
// ends both sides there instead of leaving the peer waiting for a message.
void make_blocking(ibv_cq* cq) {
  const int fd = cq->channel->fd;
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) check(errno, "fcntl");
}

// What perftest -e does after posting each signaled send (run_iter_lat_send:
// ctx_notify_events, then ibv_poll_cq(send_cq, 1)): block on the send CQ's
// own channel for its event, ack it, re-arm, then poll until that one
// completion comes, which must have succeeded. The CQ was armed when its Side
// watched it, and this is the only reader of its channel.
void await_send_completion(ibv_cq* cq) {
  ibv_cq* event_cq = nullptr;
  void* context = nullptr;
  if (ibv_get_cq_event(cq->channel, &event_cq, &context) != 0) {
    check(errno != 0 ? errno : EIO, "ibv_get_cq_event");
  }
  ibv_ack_cq_events(event_cq, 1);
  check(ibv_req_notify_cq(event_cq, 0), "ibv_req_notify_cq");
  ibv_wc wc;
  int n;
  while ((n = ibv_poll_cq(cq, 1, &wc)) == 0) {
  }
  if (n < 0) check(-n, "ibv_poll_cq");
  require_success(wc);
}

int latency(const Args& args) {
  // The raw modes are this harness without ibev, the baselines for what the
  // harness itself costs. raw-poll: this thread spins on ibv_poll_cq, as
  // perftest's busy-poll mode does (its Dispatcher runs, with no CQ to
  // serve). raw-event: a thread of its own (run_on_own_thread), this one
  // waiting, sleeps in a blocking ibv_get_cq_event, acks, re-arms and
  // drains, as perftest -e does. raw-floor: ibev's order in a loop on a
  // thread of its own (FloorLoop), the floor under event mode. Both use the
  // CQs' channels directly and never start the Dispatcher. Their thread
  // starts after the first ping is sent: one sample in all of a run's pays
  // for its start, which moves the average and the maximum, not the
  // typical value or p99.
  const bool raw_poll = args.mode == "raw-poll";
  const bool raw_event = args.mode == "raw-event";
  const bool raw_floor = args.mode == "raw-floor";
  // --send-cq event: each signaled send's completion comes through the
  // event path too (with --signal-every 1, the work of perftest's -e loop).
  const bool send_events = args.send_cq == "event";
  if (!raw_poll && !raw_event && !raw_floor && args.mode != "event" && args.mode != "adaptive") {
    std::fprintf(stderr,
                 "softroce_bench: latency --mode is event, adaptive, raw-poll, raw-event or "
                 "raw-floor\n");
    return 2;
  }
  // raw-poll would leave the send CQ's events to a started Dispatcher: ibev
  // inside the baseline without ibev.
  if (send_events && raw_poll) {
    std::fprintf(stderr,
                 "softroce_bench: --send-cq event takes send completions through an event "
                 "path; raw-poll has none (it polls, as ib_send_lat without -e)\n");
    return 2;
  }
  Peer peer(args);
  const bool server = peer.server();
  std::optional<ibev::WorkerThread> worker;
  if (args.executor == "worker") worker.emplace();

  std::vector<double> rtt_us;
  rtt_us.reserve(static_cast<std::size_t>(args.iters));
  Flag finished;
  std::atomic<int> remaining{args.iters};
  Clock::time_point sent_at;
  Side* self = nullptr;
  // raw-event --send-cq event: perftest's order, each signaled send's
  // completion waited for right after its post, before the next receive.
  const bool await_sends = raw_event && send_events;
  std::uint64_t awaited_events = 0;  // the send CQ's events read by that wait
  const auto send_one = [&] {
    if (self->send() && await_sends) {
      await_send_completion(self->send_cq->get());
      ++awaited_events;
    }
  };
  // What each side does with one received message.
  auto on_message = [&] {
    self->post_recv(1);
    if (server) {
      send_one();  // pong
      if (--remaining == 0) finished.set();
    } else {
      const auto now = Clock::now();
      rtt_us.push_back(std::chrono::duration<double, std::micro>(now - sent_at).count());
      if (--remaining == 0) {
        finished.set();
      } else {
        sent_at = Clock::now();
        send_one();  // next ping
      }
    }
  };
  const ibev::CompletionHandler on_receive = [&](const ibev::CompletionBatch& batch) {
    for (std::size_t i = 0; i < batch.size; ++i) on_message();
  };
  // ibev's modes and raw-floor drain the send CQ into this; raw-event's wait
  // polls it itself. The CQ gets a channel of its own either way.
  const ibev::CompletionHandler on_send =
      send_events ? ibev::CompletionHandler{[](const ibev::CompletionBatch& batch) {
        require_success(batch);
      }}
                  : ibev::CompletionHandler{};
  Side side(args, raw_poll ? ibev::CompletionHandler{} : on_receive,
            options_for(args, worker ? worker->executor() : ibev::Executor{}), on_send);
  self = &side;
  peer.connect(side);
  side.post_recv(256);
  std::vector<FloorCq> floor_cqs{{side.recv_cq->get(), on_receive}};
  if (send_events) floor_cqs.push_back({side.send_cq->get(), on_send});
  std::optional<FloorLoop> floor;  // before the Side goes: it acks what is left
  if (raw_event) {
    make_blocking(side.recv_cq->get());
    if (await_sends) make_blocking(side.send_cq->get());
  } else if (raw_floor) {
    floor.emplace(floor_cqs, args.ack_batch, 1);
  } else {
    side.dispatcher.start();
  }
  peer.barrier();  // both connected: the client may start

  const double cpu_before = cpu_seconds();
  const auto start = Clock::now();
  if (!server) {
    sent_at = Clock::now();
    send_one();
  }
  std::array<ibv_wc, 16> wcs;
  ibv_cq* const recv_cq = side.recv_cq->get();
  const auto drain = [&] {
    int n;
    while ((n = ibv_poll_cq(recv_cq, 16, wcs.data())) > 0) {
      for (int i = 0; i < n; ++i) on_message();
    }
  };
  const auto all_done = [&] { return remaining <= 0; };
  while (raw_poll && remaining > 0) drain();
  // The blocking raw loops run on a thread of their own, as ibev's loop
  // does (run_on_own_thread). raw_poll stays here: perftest's busy poll,
  // which it stands beside, has one thread.
  bool served = true;
  if (raw_event) {
    int error = 0;
    run_on_own_thread([&] {
      if (!raw_event_loop(recv_cq, on_receive, all_done)) error = errno != 0 ? errno : EIO;
    });
    check(error, "ibv_get_cq_event");
  } else if (raw_floor) {
    run_on_own_thread([&] { served = floor->run(all_done); });
  }
  if (!served || !finished.wait(600s)) {
    std::fprintf(stderr, "softroce_bench: ping-pong stalled\n");
    return 4;
  }
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  const double cpu = cpu_seconds() - cpu_before;
  side.dispatcher.stop();

  if (server) {
    peer.send_value(cpu);
    return 0;
  }
  const double server_cpu = peer.receive_value();
  peer.wait_for_server();

  std::vector<double> one_way;
  for (double r : rtt_us) one_way.push_back(r / 2);
  const Distribution d(std::move(one_way));
  if (!args.samples.empty()) d.write(args.samples);
  const auto stats = side.recv_cq->completion_stats();
  // Channel events taken for the send CQ (this client's, as events= is):
  // counted by the raw loops, by ibev in its modes (0 with a polled send CQ).
  const std::uint64_t send_cq_events = raw_floor   ? floor->events(side.send_cq->get())
                                       : raw_event ? awaited_events
                                                   : side.send_cq->completion_stats().events;
  // The receive CQ's: ibev's count, or the floor's own (the blocking loop
  // keeps none).
  const std::uint64_t recv_cq_events =
      raw_floor ? floor->events(side.recv_cq->get()) : stats.events;
  // New fields go last: a script's `grep -o "events=..."` must not find
  // send_events= first.
  std::printf(
      "latency mode=%s executor=%s budget_us=%d iters=%zu typical_us=%.2f avg_us=%.2f "
      "p99_us=%s p999_us=%s cpu_s=%.3f wall_s=%.3f events=%llu polled=%llu "
      "empty_reads=%llu signal_every=%d send_cq=%s samples=%zu send_events=%llu\n",
      args.mode.c_str(), args.executor.empty() ? "dispatcher" : args.executor.c_str(),
      args.budget_us, d.size(), d.at(0.5), d.mean(), d.text_at(0.99).c_str(),
      d.text_at(0.999).c_str(), cpu + server_cpu, wall,
      static_cast<unsigned long long>(recv_cq_events),
      static_cast<unsigned long long>(stats.polled),
      static_cast<unsigned long long>(side.dispatcher.stats().empty_channel_reads),
      args.signal_every, send_events ? "event" : "poll", d.size(),
      static_cast<unsigned long long>(send_cq_events));
  return 0;
}

int rate(const Args& args) {
  Peer peer(args);
  const bool server = peer.server();
  const long every = args.signal_every;
  const long total = (args.messages + every - 1) / every * every;  // the last one signaled
  // raw-event: the same stream without ibev, each side's thread in
  // raw_event_loop on the CQ whose handler does the work (bench/run_syscalls.sh's floor).
  const bool raw_event = args.mode == "raw-event";
  Flag finished;
  std::atomic<bool> done{false};  // finished, for raw_event_loop
  const auto finish = [&] {
    done = true;
    finished.set();
  };
  Side* self = nullptr;
  long received = 0;           // server: messages received
  long sent = 0, signals = 0;  // client: sends posted, signaled ones completed
  // Keeps --depth sends outstanding: a signaled completion frees its own slot
  // and the unsignaled ones before it. Runs on the dispatching thread only.
  const auto post_more = [&] {
    while (sent < total && sent - signals * every < args.depth) {
      self->send();
      ++sent;
    }
  };
  auto on_receive = [&](const ibev::CompletionBatch& batch) {
    require_success(batch);
    self->post_recv(static_cast<int>(batch.size));
    if ((received += static_cast<long>(batch.size)) >= total) finish();
  };
  auto on_send = [&](const ibev::CompletionBatch& batch) {
    require_success(batch);
    signals += static_cast<long>(batch.size);
    if (signals * every >= total) {
      finish();
    } else {
      post_more();
    }
  };
  const auto options = options_for(args);
  std::optional<Side> side;
  if (server) {
    side.emplace(args, on_receive, options);
  } else {
    side.emplace(
        args, [](const ibev::CompletionBatch&) {}, options, on_send);
  }
  self = &*side;
  peer.connect(*side);
  if (server) side->post_recv(512);  // perftest's default rx depth
  ibv_cq* const raw_cq = (server ? side->recv_cq : side->send_cq)->get();
  if (raw_event) {
    make_blocking(raw_cq);
  } else {
    side->dispatcher.start();
  }
  peer.barrier();

  const double cpu_before = cpu_seconds();
  const auto start = Clock::now();
  // On this thread: only its system calls are counted (run_syscalls.sh's
  // raw_stream), which threads do not change.
  if (raw_event) {
    if (!server) post_more();
    const auto finished_here = [&] { return done.load(); };
    const bool ran = server ? raw_event_loop(raw_cq, on_receive, finished_here)
                            : raw_event_loop(raw_cq, on_send, finished_here);
    if (!ran) return 3;
  } else if (!server) {
    side->dispatcher.post(post_more);
  }
  if (!finished.wait(600s)) {
    std::fprintf(stderr, "softroce_bench: the stream stalled\n");
    return 4;
  }
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  const double cpu = cpu_seconds() - cpu_before;
  side->dispatcher.stop();
  const auto stats = (server ? side->recv_cq : side->send_cq)->completion_stats();
  if (server) {
    peer.send_value(cpu);
    peer.send_value(static_cast<double>(stats.events));
    peer.send_value(static_cast<double>(stats.ack_calls));
    return 0;
  }
  const double server_cpu = peer.receive_value();
  const double events = static_cast<double>(stats.events) + peer.receive_value();
  const double ack_calls = static_cast<double>(stats.ack_calls) + peer.receive_value();
  peer.wait_for_server();
  std::printf(
      "rate mode=%s size=%d depth=%d signal_every=%d messages=%ld msgs_per_s=%.0f "
      "cpu_s=%.3f cpu_us_per_msg=%.2f events=%.0f ack_calls=%.0f ack_calls_per_event=%.4f "
      "wall_s=%.3f\n",
      args.mode.c_str(), args.size, args.depth, args.signal_every, total, total / wall,
      cpu + server_cpu, 1e6 * (cpu + server_cpu) / static_cast<double>(total), events, ack_calls,
      events > 0 ? ack_calls / events : 0.0, wall);
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
  Side rx(args, on_receive, options_for(args));
  Side tx(
      args, [](const ibev::CompletionBatch&) {}, ibev::CompletionOptions{});
  ibev::connect_rc_pair(*rx.qp, *tx.qp);
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
      static_cast<unsigned long long>(stats.ack_calls), stats.events / wall, args.messages / wall,
      stats.ack_calls ? static_cast<double>(stats.events) / stats.ack_calls : 0.0);
  return 0;
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
  Side side(
      adaptive, [](const ibev::CompletionBatch&) {}, options_for(adaptive));
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
    context = open_raw_device(name);
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
    if (!pd || !channel || !cq || !srq || !qp || !srq_qp || !mr || ibv_req_notify_cq(cq, 0) != 0) {
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
    cq = ibev::CompletionQueue::create(
        device, [](const ibev::CompletionBatch&) {}, [](const ibev::Event&) {});
    srq = ibev::SharedReceiveQueue::create(pd, [](const ibev::Event&) {});
    ibev::QueuePair::Options options;
    options.send_cq = options.recv_cq = cq;
    qp = ibev::QueuePair::create(
        pd, [](const ibev::Event&) {}, options);
    options.srq = srq;
    srq_qp = ibev::QueuePair::create(
        pd, [](const ibev::Event&) {}, options);
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
      ibev::Handle client =
          clients.register_client({"bench",
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
}  // namespace bench

int main(int argc, char** argv) {
  using namespace bench;
  const Args args = parse(argc, argv);
  try {
    if (args.command == "latency") return latency(args);
    if (args.command == "rate") return rate(args);
    if (args.command == "stream") return stream(args);
    if (args.command == "scale") return scale(args);
    if (args.command == "memory" || args.command == "memory-blocks") return memory(args);
    if (args.command == "fairness") return fairness(args);
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
