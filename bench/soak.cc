// A soak: what short tests miss. For --seconds (default 600) on one soft-RoCE
// device: RC traffic on --pairs QP pairs (each receiving on a CQ of its own),
// link flaps and GID changes, QP pairs destroyed and made anew, and handlers
// attached and released from several threads. At the end it prints what was
// seen against what was expected, and RSS and open fds at start and end.
//
//   soak [--seconds N] [--pairs K]       (bench/run_soak.sh runs it in the VM)
//
// Expected: every successful send's message reaches its own pair's receive
// handler exactly once (lost: never; misrouted: on another pair's CQ); every
// port and GID event a raw-verbs watcher on its own context reads also
// reaches ibev's device listener, in the same order. Errors a flap causes
// (flushed or retried-out work) are counted apart: they are the link's doing.
// Exits 1 when anything was lost or misrouted. It prints; it is not a test.
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <ibev/ibev.h>

#include "bench/env_or.h"

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

using bench::env_or;

long rss_kib() {
  std::ifstream status("/proc/self/status");
  std::string key;
  long value = 0;
  while (status >> key) {
    if (key == "VmRSS:") {
      status >> value;
      return value;
    }
    status.ignore(4096, '\n');
  }
  return -1;
}

int open_fds() {
  int count = 0;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (dirent* entry = readdir(dir)) count += entry->d_name[0] != '.';
    closedir(dir);
  }
  return count - 1;  // the directory's own fd
}

void run(const std::string& command) {
  if (std::system(command.c_str()) != 0) std::fprintf(stderr, "soak: '%s' failed\n", command.c_str());
}

struct Totals {
  std::atomic<std::uint64_t> sent{0}, received{0}, misrouted{0}, lost{0}, send_errors{0},
      recv_errors{0}, pairs_made{0}, handler_churn{0};
};

constexpr int kDepth = 32;  // receives posted per pair, sends in flight

// One RC pair: a sends to b; b's receive CQ has a handler of its own that
// checks each message is its pair's and posts the receive again.
class Pair {
 public:
  Pair(std::uint32_t tag, const std::shared_ptr<ibev::ProtectionDomain>& pd, Totals& totals)
      : tag_(tag), totals_(totals) {
    mr_ = ibev::MemoryRegion::create(pd, buffer_, sizeof buffer_, IBV_ACCESS_LOCAL_WRITE);
    send_cq_ = ibev::CompletionQueue::create_polled(pd->device(), nullptr);
    recv_cq_ = ibev::CompletionQueue::create(
        pd->device(), [this](const ibev::CompletionBatch& batch) { on_receive(batch); },
        nullptr);
    ibev::QueuePair::Options options;
    options.send_cq = send_cq_;
    options.recv_cq = recv_cq_;
    options.cap = {kDepth, kDepth, 1, 1, 0};
    a_ = ibev::QueuePair::create(pd, nullptr, options);
    b_ = ibev::QueuePair::create(pd, nullptr, options);
    ibev::connect_rc_pair(*a_, *b_);
    for (int i = 0; i < kDepth; ++i) post_recv(i);
  }

  // Posts one send when fewer than kDepth are in flight; reaps send
  // completions. Returns false once the pair has failed (a flap's doing).
  bool step() {
    ibv_wc wcs[16];
    const int n = ibv_poll_cq(send_cq_->get(), 16, wcs);
    for (int i = 0; i < n; ++i) {
      --in_flight_;
      if (wcs[i].status == IBV_WC_SUCCESS) {
        ++sent_ok_;
        ++totals_.sent;
      } else {
        ++totals_.send_errors;
        failed_ = true;
      }
    }
    if (!failed_ && in_flight_ < kDepth / 2) {
      ibv_sge sge{reinterpret_cast<std::uintptr_t>(buffer_), 8, mr_->lkey()};
      std::memcpy(buffer_, &tag_, sizeof tag_);
      ibv_send_wr wr{};
      wr.wr_id = tag_;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = IBV_WR_SEND;
      wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
      try {
        a_->post_send(wr);
        ++in_flight_;
      } catch (const std::system_error&) {
        failed_ = true;
      }
    }
    return !failed_;
  }

  // Stops sending, waits for what is in flight, and settles the accounts:
  // every successful send must have been received.
  void retire() {
    const auto deadline = Clock::now() + 5s;
    while (in_flight_ > 0 && Clock::now() < deadline) {
      failed_ = true;  // no new sends
      step();
      std::this_thread::sleep_for(1ms);
    }
    std::this_thread::sleep_for(50ms);  // the receive handler's last turn
    const std::uint64_t received = received_ok_.load();
    if (received < sent_ok_) totals_.lost += sent_ok_ - received;
  }

 private:
  void post_recv(std::uint64_t slot) {
    char* at = buffer_ + 64 * (1 + slot);
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(at), 64, mr_->lkey()};
    ibv_recv_wr wr{};
    wr.wr_id = slot;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    try {
      b_->post_recv(wr);
    } catch (const std::system_error&) {
    }
  }

  void on_receive(const ibev::CompletionBatch& batch) {
    for (const ibv_wc& wc : batch) {
      if (wc.status != IBV_WC_SUCCESS) {
        ++totals_.recv_errors;
        continue;
      }
      std::uint32_t tag = 0;
      std::memcpy(&tag, buffer_ + 64 * (1 + wc.wr_id), sizeof tag);
      if (tag != tag_ || batch.cq != recv_cq_->get()) {
        ++totals_.misrouted;
      } else {
        ++received_ok_;
        ++totals_.received;
      }
      post_recv(wc.wr_id);
    }
  }

  const std::uint32_t tag_;
  Totals& totals_;
  char buffer_[64 * (kDepth + 1)] = {};
  std::shared_ptr<ibev::MemoryRegion> mr_;
  std::shared_ptr<ibev::CompletionQueue> send_cq_, recv_cq_;
  std::shared_ptr<ibev::QueuePair> a_, b_;
  int in_flight_ = 0;
  bool failed_ = false;
  std::uint64_t sent_ok_ = 0;
  std::atomic<std::uint64_t> received_ok_{0};
};

}  // namespace

int main(int argc, char** argv) {
  int seconds = 600, pairs = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--seconds") == 0) seconds = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--pairs") == 0) pairs = std::atoi(argv[i + 1]);
  }
  const std::string device_name = env_or("IBEV_TEST_DEVICE", "rxe0");
  const std::string netdev = env_or("IBEV_TEST_NETDEV", "d0");

  ibev::Dispatcher dispatcher;
  ibev::Registry& registry = dispatcher.registry();
  auto device = ibev::Device::open(dispatcher, device_name);
  auto pd = ibev::ProtectionDomain::create(device);
  dispatcher.start();
  Totals totals;

  // Fds before any pair or watcher exists, against after all are gone.
  const int fds_start = open_fds();

  // Port and GID events: ibev's listener against a raw watcher.
  std::mutex seen_mutex;
  std::vector<int> ibev_seen, raw_seen;
  const ibev::EventFilter port_events{IBV_EVENT_PORT_ERR, IBV_EVENT_PORT_ACTIVE,
                                      IBV_EVENT_GID_CHANGE};
  ibev::Handle listener = device->on_event(port_events, [&](const ibev::Event& e) {
    std::lock_guard<std::mutex> lock(seen_mutex);
    ibev_seen.push_back(e.code());
  });
  std::atomic<bool> running{true};
  std::thread raw_watcher([&] {
    int count = 0;
    ibv_device** list = ibv_get_device_list(&count);
    ibv_context* raw = nullptr;
    for (int i = 0; i < count && raw == nullptr; ++i) {
      if (device_name == ibv_get_device_name(list[i])) raw = ibv_open_device(list[i]);
    }
    ibv_free_device_list(list);
    if (raw == nullptr) return;
    while (running) {
      pollfd pfd{raw->async_fd, POLLIN, 0};
      if (::poll(&pfd, 1, 100) <= 0) continue;
      ibv_async_event event;
      if (ibv_get_async_event(raw, &event) != 0) continue;
      const int code = event.event_type;
      ibv_ack_async_event(&event);
      if (code == IBV_EVENT_PORT_ERR || code == IBV_EVENT_PORT_ACTIVE ||
          code == IBV_EVENT_GID_CHANGE) {
        std::lock_guard<std::mutex> lock(seen_mutex);
        raw_seen.push_back(code);
      }
    }
    ibv_close_device(raw);
  });

  // A pair made while the link is down (or its GID is gone) cannot connect:
  // ibv_modify_qp(RTR) says so, and the slot is tried again later.
  std::uint32_t next_tag = 1;
  std::uint64_t connect_refused = 0;
  const auto make_pair = [&]() -> std::unique_ptr<Pair> {
    try {
      auto pair = std::make_unique<Pair>(next_tag++, pd, totals);
      ++totals.pairs_made;
      return pair;
    } catch (const std::system_error&) {
      ++connect_refused;
      return nullptr;
    }
  };
  std::vector<std::unique_ptr<Pair>> live;
  for (int i = 0; i < pairs; ++i) live.push_back(make_pair());
  std::this_thread::sleep_for(5s);
  const long rss_start = rss_kib();  // the pairs live, as at the end

  // Handlers attached and released from several threads, on the device and
  // on objects, while events and completions flow.
  std::vector<std::thread> churners;
  for (int t = 0; t < 3; ++t) {
    churners.emplace_back([&, t] {
      std::mt19937 random(t);
      ibv_qp fake{};  // an address of its own: never a real QP's
      while (running) {
        ibev::Handle a = device->on_event({}, [](const ibev::Event&) {});
        ibev::Handle b = registry.attach(&fake, [](const ibev::Event&) {});
        std::this_thread::sleep_for(std::chrono::microseconds(random() % 2000));
        ++totals.handler_churn;
      }
    });
  }
  std::thread disturber([&] {
    for (int round = 0; running; ++round) {
      std::this_thread::sleep_for(2s);
      if (!running) break;
      if (round % 2 == 0) {
        run("ip link set " + netdev + " down && ip link set " + netdev + " up");
      } else {
        run("ip -6 addr add fd00::" + std::to_string(100 + round % 50) + "/64 dev " + netdev +
            " nodad 2>/dev/null; ip -6 addr flush dev " + netdev + " scope global");
      }
    }
  });

  const auto end = Clock::now() + std::chrono::seconds(seconds);
  auto next_churn = Clock::now() + 1s;
  // RSS once a minute: a leak climbs, a malloc arena's high-water mark levels.
  // The first minute is warm-up (each thread's arena, rdma-core's and the
  // kernel's first allocations); growth is measured from its end.
  std::string rss_samples = std::to_string(rss_start);
  long rss_after_warm_up = -1;
  auto next_sample = Clock::now() + 60s;
  std::size_t victim = 0;
  while (Clock::now() < end) {
    for (auto& pair : live) {
      if (!pair) {
        pair = make_pair();
      } else if (!pair->step()) {  // a flap broke it: settle, and make it anew
        pair->retire();
        pair = make_pair();
      }
    }
    if (Clock::now() >= next_churn) {  // objects destroyed and made anew
      auto& pair = live[victim++ % live.size()];
      if (pair) pair->retire();
      pair = make_pair();
      next_churn = Clock::now() + 1s;
    }
    if (Clock::now() >= next_sample) {
      const long rss = rss_kib();
      if (rss_after_warm_up < 0) rss_after_warm_up = rss;
      rss_samples += " " + std::to_string(rss);
      next_sample += 60s;
    }
    std::this_thread::sleep_for(200us);
  }
  const long rss_end = rss_kib();
  running = false;
  disturber.join();
  for (auto& t : churners) t.join();
  run("ip link set " + netdev + " up");
  for (auto& pair : live) {
    if (pair) pair->retire();
  }
  live.clear();
  std::this_thread::sleep_for(2s);  // the last port events reach both
  raw_watcher.join();
  const int fds_end = open_fds();

  std::lock_guard<std::mutex> lock(seen_mutex);
  const bool events_agree = ibev_seen == raw_seen;
  std::printf("soak: %d s, %d pairs at a time, %llu pairs made (%llu refused while the link was down)\n",
              seconds, pairs, static_cast<unsigned long long>(totals.pairs_made.load()),
              static_cast<unsigned long long>(connect_refused));
  std::printf("messages: %llu sent, %llu received, %llu lost, %llu misrouted\n",
              static_cast<unsigned long long>(totals.sent.load()),
              static_cast<unsigned long long>(totals.received.load()),
              static_cast<unsigned long long>(totals.lost.load()),
              static_cast<unsigned long long>(totals.misrouted.load()));
  std::printf("link's doing: %llu send errors, %llu receive errors (flushed or retried out)\n",
              static_cast<unsigned long long>(totals.send_errors.load()),
              static_cast<unsigned long long>(totals.recv_errors.load()));
  std::printf("port/GID events: raw watcher %zu, ibev listener %zu, %s\n", raw_seen.size(),
              ibev_seen.size(), events_agree ? "same sequence" : "DIFFERENT");
  std::printf("handlers attached and released: %llu\n",
              static_cast<unsigned long long>(totals.handler_churn.load()));
  // Runs shorter than the warm-up compare with the first seconds.
  const long rss_base = rss_after_warm_up > 0 ? rss_after_warm_up : rss_start;
  std::printf("rss: %ld KiB after %s, %ld KiB at the end, pairs live (%+.2f%%)\n", rss_base,
              rss_after_warm_up > 0 ? "the first minute" : "5 s", rss_end,
              100.0 * static_cast<double>(rss_end - rss_base) / static_cast<double>(rss_base));
  std::printf("rss each minute (KiB): %s\n", rss_samples.c_str());
  std::printf("fds: %d before any pair, %d after the last was destroyed\n", fds_start,
              fds_end);
  std::printf("dispatcher: %llu completions, %llu failures reported\n",
              static_cast<unsigned long long>(dispatcher.stats().work_completions),
              static_cast<unsigned long long>(dispatcher.stats().failures));
  const bool ok = totals.lost == 0 && totals.misrouted == 0 && events_agree;
  std::printf("soak: %s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
