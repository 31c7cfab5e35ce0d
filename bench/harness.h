// What softroce_bench's benchmarks share: their options, one connected side
// of an RC connection (device, PD, MR, CQs, QP) served by its own
// Dispatcher, a forked peer for the two-process runs (as perftest's server
// and client), and the distribution of what was measured.
//
// Everything here exits the process on a failed verb (status 3): a
// benchmark that cannot run prints why and stops; it never reports a figure
// from a run that went wrong.
#ifndef IBEV_BENCH_HARNESS_H_
#define IBEV_BENCH_HARNESS_H_

#include <ibev/verbs/completion_queue.h>
#include <ibev/verbs/device.h>
#include <ibev/verbs/protection_domain.h>
#include <ibev/verbs/queue_pair.h>
#include <sys/types.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bench/cpu_time.h"

namespace bench {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string command;
  std::string mode = "event";  // event|adaptive|raw-poll|raw-event|raw-floor
  std::string device = "rxe0";
  std::string netdev = "d0";
  std::string executor;  // "", or "worker": completion handlers on a WorkerThread
  std::string samples;   // latency: write the sorted one-way samples here
  int iters = 10000;
  int budget_us = 0;
  unsigned ack_batch = 32;
  int messages = 20000;
  int size = 2;           // bytes a message
  int depth = 128;        // rate: sends outstanding
  int signal_every = 32;  // one send in this many asks for a completion
  // latency: "polled" (the send CQ reaped without waiting) or "event" (its
  // completions through the event path, as perftest's -e waits for each
  // signaled send's event: a handler on the Dispatcher in ibev's modes; in
  // raw-event, this thread blocks for each one right after posting it; in
  // raw-floor, raw-floor's epoll loop serves it beside the receive CQ).
  std::string send_cq = "polled";
  // Sends of at most this many bytes go inline. perftest's ib_send_lat and
  // ib_send_bw report "Max inline data : 0[B]" on rxe, so by default none
  // does here either: like with like.
  int inline_bytes = 0;
  int pairs = 1;     // scale: QP pairs
  int channels = 0;  // scale: completion channels shared by the CQs; 0: one each
  // fairness: 0 no saturating CQ, 1 on the same Dispatcher, 2 on its own;
  // the saturated CQ's CompletionOptions::budget.
  int load = 1;
  // fairness: the saturating sender's pace, messages/s (the same load in every
  // configuration whatever the threads' placement); 0: a closed loop.
  int load_rate = 0;
  unsigned turn_budget = 256;
  int rounds = 20;
  int seconds = 2;
  unsigned batch = 16;  // Dispatcher::Options::batch
  int server_cpu = -1;  // --cpus S,C: where each side of a two-process run runs
  int client_cpu = -1;
  std::string holder = "ibev";  // removal: who holds the device
  int hold_ms = 3000;           // removal: how long the raw holder keeps it
};

// Exits with status 2 on an unknown option.
Args parse(int argc, char** argv);

// Exits with status 3 naming the verb when rc != 0.
void check(int rc, const char* verb);

// Exits with status 4 naming the status of a work completion that failed.
void require_success(const ibv_wc& wc);
void require_success(const ibev::CompletionBatch& batch);

// The device called `name`, opened with raw verbs (no ibev): a holder that
// knows nothing, or a clock of its own. Null when there is none.
ibv_context* open_raw_device(const std::string& name);

// Takes `netdev` up or down (SIOCSIFFLAGS); false when that failed.
bool set_link(const std::string& netdev, bool up);

// Runs `loop` on a thread of its own and waits for it, as a Dispatcher runs
// its loop on its thread while the caller waits, so that a raw loop runs in
// a process with two threads as ibev's does: glibc's system call wrappers
// take their cancellation path, and libstdc++ its atomic counts, only then.
// What `loop` throws is thrown here.
void run_on_own_thread(const std::function<void()>& loop);

// Blocks until set() or the limit; false on timeout.
class Flag {
 public:
  void set();
  bool wait(std::chrono::seconds limit);

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool set_ = false;
};

// The completion options a run's --mode, --budget-us, --ack-batch and
// --executor ask for; `executor` is the WorkerThread's when --executor worker.
ibev::CompletionOptions options_for(const Args& args, ibev::Executor executor = {});

// One side of an RC connection, with its own Dispatcher (not started). Each
// CQ has its handler (`on_receive`, `on_send`) in `options`' mode, or is
// polled by the caller (kPolled) when its handler is empty.
struct Side {
  Side(const Args& args, ibev::CompletionHandler on_receive, ibev::CompletionOptions options,
       ibev::CompletionHandler on_send = {});

  // Posts `count` receives of Args::size bytes (the QP must be past RESET).
  void post_recv(int count);
  // One SEND of Args::size bytes, inline up to Args::inline_bytes, one in
  // Args::signal_every signaled. With a polled send CQ, every signal_every
  // sends reap what completed, without waiting, which frees the slots.
  // Returns whether this send was signaled: a caller that waits for each
  // signaled send's completion (raw-event's perftest order) knows when to.
  bool send();

  const Args args;
  ibev::Dispatcher dispatcher;
  std::vector<char> buffer;
  std::shared_ptr<ibev::Device> device;
  std::shared_ptr<ibev::ProtectionDomain> pd;
  std::shared_ptr<ibev::MemoryRegion> mr;
  std::shared_ptr<ibev::CompletionQueue> send_cq, recv_cq;
  std::shared_ptr<ibev::QueuePair> qp;
  std::uint64_t sends = 0;
};

// The two-process runs: fork() into a server (the child) and a client, each
// pinned to its --cpus CPU before any thread starts (so the Dispatcher's
// thread inherits it), talking over a socket pair.
class Peer {
 public:
  explicit Peer(const Args& args);
  bool server() const noexcept { return child_ == 0; }
  // Swaps RC endpoints and connects the QP; then both sides are connected.
  void connect(Side& side);
  // Each side waits for the other.
  void barrier();
  void send_value(double value);
  double receive_value();
  // The client reaps the server.
  void wait_for_server();

 private:
  void write_all(const void* data, std::size_t size);
  void read_all(void* data, std::size_t size);

  pid_t child_ = -1;
  int fd_ = -1;
};

// What was measured, sorted: quantiles as perftest takes them.
class Distribution {
 public:
  explicit Distribution(std::vector<double> values);
  bool empty() const noexcept { return values_.empty(); }
  std::size_t size() const noexcept { return values_.size(); }
  double at(double quantile) const;  // 0 for an empty one
  // Whether at(quantile) rests on enough samples to print: at least 10 lie
  // beyond it, size() >= ceil(10 / (1 - quantile)). p99 needs 1000 samples,
  // p99.9 10000; with fewer, at() is one of the last few values (of 100,
  // at(0.99) is the max).
  bool supports(double quantile) const;
  // at(quantile) printed with two decimals, or "na" when not supported.
  std::string text_at(double quantile) const;
  double mean() const;
  // One value a line, ascending; exits with status 3 when it cannot.
  void write(const std::string& path) const;

 private:
  std::vector<double> values_;
};

// --mode raw-floor's loop, in latency and scale: ibev's dispatch order
// (dispatch/completion_source.cc: ChannelSource::serve, CqEntry::serve_turn)
// with nothing else of ibev's, a floor under its loop over the same objects.
// One epoll set over the CQs' channels, made non-blocking, each
// epoll_event's data.ptr the channel's slot, so that a ready fd leads to its
// CQs with no lookup. A channel with one CQ holds at most one event (a CQ is
// armed again only after its event is read), so it is drained first (the
// handler's reply goes out before any system call), then read once (EAGAIN
// ends its turn, as in ibev, without arming), the event counted for the
// batched ack, the CQ re-armed and drained again. (ibev's turn polls once
// more between the read and the re-arm; the floor leaves that poll out:
// what lands meanwhile raises no event, the CQ being unarmed, and the drain
// after the re-arm takes it.) A channel shared by several CQs is read at
// most min(`batch`, its CQs) times, each event's CQ (found by binary search)
// counted, drained, re-armed and drained. The CQs must be armed before
// run(); the destructor acks what the batches left, so it must run before
// the CQs are destroyed.
struct FloorCq {
  ibv_cq* cq = nullptr;
  ibev::CompletionHandler handler;
  unsigned unacked = 0;      // events read and not acked yet
  std::uint64_t events = 0;  // events read
};

class FloorLoop {
 public:
  // Groups `cqs` by channel (reordering them) and makes the epoll set: set-up,
  // before anything is timed. Exits the process on a failing verb.
  FloorLoop(std::vector<FloorCq>& cqs, unsigned ack_batch, unsigned batch);
  ~FloorLoop();
  FloorLoop(const FloorLoop&) = delete;
  FloorLoop& operator=(const FloorLoop&) = delete;

  // Serves until done(), checked before each wait; false when no channel
  // was ready for 600 s (the peer is gone).
  bool run(const std::function<bool()>& done);
  // Events read for `cq`, or for all (null).
  std::uint64_t events(const ibv_cq* cq = nullptr) const;

 private:
  struct Channel;
  void serve(Channel& channel);

  std::vector<FloorCq>& cqs_;
  const unsigned ack_batch_;
  const unsigned batch_;
  std::vector<Channel> channels_;
  int epoll_ = -1;
};

}  // namespace bench

#endif  // IBEV_BENCH_HARNESS_H_
