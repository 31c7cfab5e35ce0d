// Helpers for the soft-RoCE tests of dispatch/ and verbs/: an environment
// (registry, running dispatcher, the test device, a protection domain), a
// thread-safe record of who heard what with bounded waits, and posting.
#ifndef IBEV_TESTS_SOFTROCE_VERBS_FIXTURE_H_
#define IBEV_TESTS_SOFTROCE_VERBS_FIXTURE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ibev/core/registry.h>
#include <ibev/dispatch/dispatcher.h>
#include <ibev/verbs/completion_queue.h>
#include <ibev/verbs/device.h>
#include <ibev/verbs/protection_domain.h>
#include <ibev/verbs/queue_pair.h>
#include <ibev/verbs/shared_receive_queue.h>

namespace ibev::testing {

// Who heard which event, in order; waits are bounded (TCG is slow: generous).
class Recorder {
 public:
  struct Entry {
    std::string who;
    Event event;
  };

  Handler as(const std::string& who);
  void add(const std::string& who, const Event& event);

  // Waits until `done(entries)` holds or `limit` passes; returns whether it held.
  bool wait_until(const std::function<bool(const std::vector<Entry>&)>& done,
                  std::chrono::milliseconds limit = std::chrono::seconds(20));
  // Waits for `count` entries from `who`.
  bool wait_for(const std::string& who, std::size_t count,
                std::chrono::milliseconds limit = std::chrono::seconds(20));
  std::vector<Entry> entries();
  std::vector<Entry> from(const std::string& who);
  // Everyone who heard anything, with counts, for messages.
  std::string summary();

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Entry> entries_;
};

// The Failures a Dispatcher reports, kept as lines for asserts.
class FailureLog {
 public:
  // Reporting here; no watchdog (TCG is slow enough to trip it in setup).
  Dispatcher::Options options(DeviceMonitor monitor = DeviceMonitor::kAuto);
  std::vector<std::string> lines();
  // "N failures, the first: ..." for a message.
  std::string summary();
  // Each failure from now on also given to `echo` as it is reported (on the
  // reporting thread, in order): a peer process tells its test at once.
  void echo_to(std::function<void(const std::string&)> echo);

 private:
  std::mutex mutex_;
  std::vector<std::string> lines_;
  std::function<void(const std::string&)> echo_;
};

// Registry, a started Dispatcher, the device, a protection domain. Errors the
// dispatcher reports are kept, for tests to assert there were none.
struct Env {
  explicit Env(const std::string& device_name);
  ~Env();

  std::vector<std::string> errors() { return failures.lines(); }

  FailureLog failures;
  Dispatcher dispatcher;
  Registry& registry;
  std::shared_ptr<Device> device;
  std::shared_ptr<ProtectionDomain> pd;
};

// A CQ without handlers, for QPs whose completions a test does not read.
std::shared_ptr<CompletionQueue> plain_cq(const std::shared_ptr<Device>& device,
                                          int cqe = 64);

// Posts one 64-byte send from `slot` of `buffer`; signaled, wr_id = `id`.
void post_send(ibv_qp* qp, const MemoryRegion& mr, char* slot, std::uint64_t id);
void post_recv(ibv_qp* qp, const MemoryRegion& mr, char* slot, std::uint64_t id);
// Through QueuePair::post_send/post_recv, as an application would.
void post_send(QueuePair& qp, const MemoryRegion& mr, char* slot, std::uint64_t id);
void post_recv(QueuePair& qp, const MemoryRegion& mr, char* slot, std::uint64_t id);
void post_srq_recv(SharedReceiveQueue& srq, const MemoryRegion& mr, char* slot,
                   std::uint64_t id);

// Lines several threads add (who heard what), with bounded waits.
class Lines {
 public:
  void add(const std::string& line);
  // Until `line` was added `count` times, or `limit` passed.
  bool wait_count(const std::string& line, std::size_t count, std::chrono::milliseconds limit);
  std::size_t count(const std::string& line);
  std::string text();
  // The lines that start with `prefix`, in order, the prefix taken off.
  std::vector<std::string> starting_with(const std::string& prefix);

 private:
  std::size_t count_locked(const std::string& line) const;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::string> lines_;
};

// What an application makes on a device: one object of every kind and RC
// loopback traffic that keeps itself going (b receives from the SRQ; each
// receive completion reposts it and sends another from a). The completion
// handler runs on `executor` and takes a while, so a removal finds it
// mid-call; it counts into `completions`, and into `after_close` when it
// runs after the device closed (which must never happen).
struct Workload {
  Workload(const std::shared_ptr<Device>& device, Executor executor,
          std::atomic<int>& completions, std::atomic<int>& after_close);
  // What an application does before it drops its objects: its handlers
  // post no more.
  void stop();

  static constexpr int kSlots = 16;
  std::shared_ptr<Device> device;
  std::vector<char> memory;
  std::mutex posting;
  bool stopped = false;
  std::shared_ptr<ProtectionDomain> pd;
  std::shared_ptr<MemoryRegion> mr;
  std::shared_ptr<CompletionQueue> cq;
  std::shared_ptr<SharedReceiveQueue> srq;
  std::shared_ptr<QueuePair> a;
  std::shared_ptr<QueuePair> b;
};

// Until `counter` grew by `more`, or 20 s passed.
bool grows_by(const std::atomic<int>& counter, int more);

// Runs `call` on another thread and waits at most `limit` for it: false
// means it hung (the thread is left behind; the test fails anyway).
bool finishes_within(const std::function<void()>& call,
                     std::chrono::milliseconds limit);

}  // namespace ibev::testing

#endif  // IBEV_TESTS_SOFTROCE_VERBS_FIXTURE_H_
