#include "tests/softroce/verbs_fixture.h"

#include <algorithm>
#include <future>
#include <map>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "tests/support/testing.h"

namespace ibev::testing {

Handler Recorder::as(const std::string& who) {
  return [this, who](const Event& event) { add(who, event); };
}

void Recorder::add(const std::string& who, const Event& event) {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.push_back({who, event});
  changed_.notify_all();
}

bool Recorder::wait_until(
    const std::function<bool(const std::vector<Entry>&)>& done,
    std::chrono::milliseconds limit) {
  std::unique_lock<std::mutex> lock(mutex_);
  return changed_.wait_for(lock, limit, [&] { return done(entries_); });
}

bool Recorder::wait_for(const std::string& who, std::size_t count,
                        std::chrono::milliseconds limit) {
  return wait_until(
      [&](const std::vector<Entry>& entries) {
        std::size_t n = 0;
        for (const Entry& e : entries) n += e.who == who ? 1 : 0;
        return n >= count;
      },
      limit);
}

std::vector<Recorder::Entry> Recorder::entries() {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_;
}

std::vector<Recorder::Entry> Recorder::from(const std::string& who) {
  std::vector<Entry> mine;
  for (const Entry& e : entries()) {
    if (e.who == who) mine.push_back(e);
  }
  return mine;
}

std::string Recorder::summary() {
  std::map<std::string, std::map<std::string, int>> heard;
  for (const Entry& e : entries()) ++heard[e.who][std::string(e.event.name())];
  std::ostringstream out;
  for (const auto& [who, events] : heard) {
    out << who << ":";
    for (const auto& [name, count] : events) out << " " << name << " x" << count;
    out << "; ";
  }
  return out.str();
}

namespace {

// Every Failure is kept. The watchdog stays off: under TCG emulation, with
// several VMs on two cores, a turn can take a second; tests/dispatch tests it.
}  // namespace

Env::Env(const std::string& device_name)
    : dispatcher(failures.options()),
      registry(dispatcher.registry()),
      device(Device::open(dispatcher, device_name)),
      pd(ProtectionDomain::create(device)) {
  dispatcher.start();
}

Env::~Env() { dispatcher.stop(); }

Dispatcher::Options FailureLog::options(DeviceMonitor monitor) {
  Dispatcher::Options options;
  options.stall_after = std::chrono::milliseconds(0);
  options.device_monitor = monitor;
  options.on_failure = [this](const Failure& failure) {
    std::lock_guard<std::mutex> lock(mutex_);
    lines_.push_back(describe(failure));
    if (echo_) echo_(lines_.back());
  };
  return options;
}

void FailureLog::echo_to(std::function<void(const std::string&)> echo) {
  std::lock_guard<std::mutex> lock(mutex_);
  echo_ = std::move(echo);
}

std::vector<std::string> FailureLog::lines() {
  std::lock_guard<std::mutex> lock(mutex_);
  return lines_;
}

std::string FailureLog::summary() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::to_string(lines_.size()) + " failures" +
         (lines_.empty() ? "" : ", the first: " + lines_.front());
}

std::shared_ptr<CompletionQueue> plain_cq(const std::shared_ptr<Device>& device,
                                          int cqe) {
  CompletionQueue::Options options;
  options.cqe = cqe;
  return CompletionQueue::create_polled(device, nullptr, options);
}

namespace {

ibv_sge sge_of(const MemoryRegion& mr, char* slot) {
  return ibv_sge{reinterpret_cast<std::uintptr_t>(slot), 64, mr.lkey()};
}

void check(int rc, const char* verb) {
  if (rc != 0) throw std::runtime_error(std::string(verb) + " failed: " + std::to_string(rc));
}

}  // namespace

// One signaled 64-byte send from `slot`; `sge` must outlive the post.
ibv_send_wr send_wr(ibv_sge& sge, std::uint64_t id) {
  ibv_send_wr wr{};
  wr.wr_id = id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  return wr;
}

void post_send(ibv_qp* qp, const MemoryRegion& mr, char* slot, std::uint64_t id) {
  ibv_sge sge = sge_of(mr, slot);
  ibv_send_wr wr = send_wr(sge, id);
  ibv_send_wr* bad = nullptr;
  check(ibv_post_send(qp, &wr, &bad), "ibv_post_send");
}

void post_send(QueuePair& qp, const MemoryRegion& mr, char* slot, std::uint64_t id) {
  ibv_sge sge = sge_of(mr, slot);
  ibv_send_wr wr = send_wr(sge, id);
  qp.post_send(wr);
}

// One 64-byte receive into `slot`; `sge` must outlive the post.
ibv_recv_wr recv_wr(ibv_sge& sge, std::uint64_t id) {
  ibv_recv_wr wr{};
  wr.wr_id = id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  return wr;
}

void post_recv(ibv_qp* qp, const MemoryRegion& mr, char* slot, std::uint64_t id) {
  ibv_sge sge = sge_of(mr, slot);
  ibv_recv_wr wr = recv_wr(sge, id);
  ibv_recv_wr* bad = nullptr;
  check(ibv_post_recv(qp, &wr, &bad), "ibv_post_recv");
}

void post_recv(QueuePair& qp, const MemoryRegion& mr, char* slot, std::uint64_t id) {
  ibv_sge sge = sge_of(mr, slot);
  ibv_recv_wr wr = recv_wr(sge, id);
  qp.post_recv(wr);
}

void post_srq_recv(SharedReceiveQueue& srq, const MemoryRegion& mr, char* slot,
                   std::uint64_t id) {
  ibv_sge sge = sge_of(mr, slot);
  ibv_recv_wr wr = recv_wr(sge, id);
  ibv_recv_wr* bad = nullptr;
  check(ibv_post_srq_recv(srq.get(), &wr, &bad), "ibv_post_srq_recv");
}

bool finishes_within(const std::function<void()>& call,
                     std::chrono::milliseconds limit) {
  auto done = std::make_shared<std::promise<void>>();
  auto future = done->get_future();
  std::thread([call, done] {
    try {
      call();
      done->set_value();
    } catch (...) {
      done->set_exception(std::current_exception());
    }
  }).detach();
  if (future.wait_for(limit) != std::future_status::ready) return false;
  future.get();  // rethrows what the call threw
  return true;
}

void Lines::add(const std::string& line) {
  std::lock_guard<std::mutex> lock(mutex_);
  lines_.push_back(line);
  changed_.notify_all();
}

bool Lines::wait_count(const std::string& line, std::size_t count,
                       std::chrono::milliseconds limit) {
  std::unique_lock<std::mutex> lock(mutex_);
  return changed_.wait_for(lock, limit, [&] { return count_locked(line) >= count; });
}

std::size_t Lines::count(const std::string& line) {
  std::lock_guard<std::mutex> lock(mutex_);
  return count_locked(line);
}

std::string Lines::text() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string all;
  for (const auto& line : lines_) all += line + "\n";
  return all;
}

std::vector<std::string> Lines::starting_with(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> found;
  for (const auto& line : lines_) {
    if (line.rfind(prefix, 0) == 0) found.push_back(line.substr(prefix.size()));
  }
  return found;
}

std::size_t Lines::count_locked(const std::string& line) const {
  return static_cast<std::size_t>(std::count(lines_.begin(), lines_.end(), line));
}

Workload::Workload(const std::shared_ptr<Device>& device, Executor executor,
                 std::atomic<int>& completions, std::atomic<int>& after_close)
    : device(device), memory(64 * kSlots) {
  pd = ProtectionDomain::create(device);
  mr = MemoryRegion::create(pd, memory.data(), memory.size(), IBV_ACCESS_LOCAL_WRITE);
  CompletionQueue::Options options;
  options.cqe = 4 * kSlots;
  options.completion.executor = std::move(executor);
  cq = CompletionQueue::create(
      device,
      [this, &completions, &after_close](const CompletionBatch& batch) {
        if (this->device->context() == nullptr) ++after_close;
        // A while on purpose, a duration and no condition: so that a
        // removal finds the handler mid-call (verbs_fixture.h).
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        std::lock_guard<std::mutex> lock(posting);
        for (const ibv_wc& wc : batch) {
          ++completions;
          if (stopped || wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV) continue;
          char* slot = memory.data() + 64 * wc.wr_id;
          post_srq_recv(*srq, *mr, slot, wc.wr_id);
          post_send(*a, *mr, slot, wc.wr_id);
        }
      },
      nullptr, options);
  srq = SharedReceiveQueue::create(pd, nullptr);
  QueuePair::Options qp_options;
  qp_options.send_cq = qp_options.recv_cq = cq;
  qp_options.signal_all = true;
  a = QueuePair::create(pd, nullptr, qp_options);
  qp_options.srq = srq;
  b = QueuePair::create(pd, nullptr, qp_options);
  connect_rc_pair(*a, *b);
  for (int i = 0; i < kSlots / 2; ++i) {
    post_srq_recv(*srq, *mr, memory.data() + 64 * i, static_cast<std::uint64_t>(i));
  }
  for (int i = 0; i < kSlots / 2; ++i) {
    post_send(*a, *mr, memory.data() + 64 * i, static_cast<std::uint64_t>(i));
  }
}

void Workload::stop() {
  std::lock_guard<std::mutex> lock(posting);
  stopped = true;
}

bool grows_by(const std::atomic<int>& counter, int more) {
  const int from = counter.load();
  return eventually([&] { return counter.load() >= from + more; });
}

}  // namespace ibev::testing
