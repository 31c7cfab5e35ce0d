#include "tests/softroce/session_fixture.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <system_error>
#include <string>
#include <utility>

#include "tests/softroce/cm_fixture.h"
#include "tests/softroce/rdma_fixture.h"
#include "tests/support/testing.h"

namespace ibev::testing {

using namespace std::chrono_literals;

RecoveryPolicy quick_recovery(std::chrono::milliseconds give_up_after) {
  RecoveryPolicy policy;
  policy.first_delay = 50ms;
  policy.max_delay = 400ms;
  policy.give_up_after = give_up_after;
  return policy;
}

Numbered::Numbered(Env& env)
    : env_(env), memory_((kSendSlots + kRecvSlots) * kSlot) {
  on_devices_.push_back(make_on(env.device, env.pd));
}

// The session before the CQs its QPs complete on, and the QPs too: what the
// Dispatcher still holds for a moment (a drain under way, a reconnect task
// not run yet) lets go within seconds. A CQ is never closed under an open
// QP: its destroy is refused (EBUSY) and given up, its completion channel
// then cannot be destroyed either (its fd stays open), and rxe's provider
// keeps the CQ's ring mapped on the device's uverbs file, so that the
// context and the CQ outlive ibv_close_device for the process's life (what
// the campaign's (d) saw at seed 508: ctx, cq and one fd more). So a QP still
// held when the wait is over is closed here, by the application that made
// it, as Device::close() would, and said on stderr: whoever held it sees
// it closed (ENODEV).
namespace {
std::atomic<std::size_t>& held_at_teardown_count() {
  static std::atomic<std::size_t> count{0};
  return count;
}
}  // namespace

std::size_t Numbered::held_at_teardown() { return held_at_teardown_count().load(); }

Numbered::~Numbered() {
  std::shared_ptr<CmSession> session;
  std::vector<Made> made;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    session.swap(session_);
    made.swap(made_);
  }
  session.reset();
  static_cast<void>(eventually(
      [&] {
        return std::all_of(made.begin(), made.end(),
                           [](const Made& one) { return one.qp.expired(); });
      },
      let_go_within, 10ms));
  {
    // And any made since the swap (an attempt under way as it closed).
    std::lock_guard<std::mutex> lock(mutex_);
    made.insert(made.end(), made_.begin(), made_.end());
    made_.clear();
  }
  std::size_t held = 0;
  for (const Made& one : made) {
    if (const auto qp = one.qp.lock(); qp && qp->get() != nullptr) {
      ++held;
      qp->close();
    }
  }
  held_at_teardown_count() += held;
  if (held != 0) {
    std::fprintf(stderr,
                 "Numbered: %zu QP(s) still open %lld ms after the session closed, closed "
                 "before their CQ\n",
                 held, static_cast<long long>(let_go_within.count()));
  }
  for (const auto& on : on_devices_) on->cq->close();
}

std::shared_ptr<Numbered::OnDevice> Numbered::make_on(std::shared_ptr<Device> device,
                                                      std::shared_ptr<ProtectionDomain> pd) {
  auto on = std::make_shared<OnDevice>();
  on->device = std::move(device);
  on->pd = std::move(pd);
  on->mr = MemoryRegion::create(on->pd, memory_.data(), memory_.size(), IBV_ACCESS_LOCAL_WRITE);
  CompletionQueue::Options options;
  options.cqe = 512;
  on->cq = CompletionQueue::create(
      on->device,
      [this, at = on.get()](const CompletionBatch& batch) {
        for (const ibv_wc& wc : batch) completed(at, wc);
      },
      nullptr, options);
  return on;
}

std::shared_ptr<Numbered::OnDevice> Numbered::on_device(const std::string& name) {
  // A closed id names no device, and Device::open("") would open the
  // first one: the attempt fails instead.
  if (name.empty()) {
    throw std::system_error(ENODEV, std::generic_category(), "Numbered::make_qp: the id is closed");
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto& on = on_devices_.back();
    if (on->device->name() == name && on->device->loss() == DeviceLoss::kNone) return on;
  }
  auto device = Device::open(env_.dispatcher, name);
  auto on = make_on(device, ProtectionDomain::create(device));
  std::lock_guard<std::mutex> lock(mutex_);
  on_devices_.push_back(on);
  return on;
}

MakeQp Numbered::make_qp() {
  return [this](CmId& id, const RecoveryAttempt& attempt) {
    const auto on = on_device(id.device_name());
    QueuePairOptions options;
    options.send_cq = on->cq;
    options.recv_cq = on->cq;
    options.cap = ibv_qp_cap{64, kRecvSlots, 1, 1, 0};
    auto qp = QueuePair::create(on->pd, {}, options);
    id.init_qp(*qp);
    for (std::uint64_t slot = 0; slot < kRecvSlots; ++slot) post_recv(*qp, *on->mr, slot);
    std::lock_guard<std::mutex> lock(mutex_);
    // Kept ahead of the attempt's list: what an earlier outage's attempt
    // listed and resend() could not post again (down before it ran), which
    // no QP carried since, so no list names (connection_health.h). Each
    // number once: an outage's attempts list the same ones.
    for (const std::uint64_t seq : attempt.undelivered()) {
      if (std::find(undelivered_.begin(), undelivered_.end(), seq) == undelivered_.end()) {
        undelivered_.push_back(seq);
      }
    }
    made_.push_back({qp, on.get()});
    return qp;
  };
}

void Numbered::attach(std::shared_ptr<CmSession> session) {
  std::lock_guard<std::mutex> lock(mutex_);
  session_ = std::move(session);
}

void Numbered::send(std::uint64_t seq) {
  std::shared_ptr<CmSession> session;
  std::shared_ptr<MemoryRegion> mr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    session = session_;
    mr = on_devices_.back()->mr;
  }
  char* slot = memory_.data() + (seq % kSendSlots) * kSlot;
  const int length = std::snprintf(slot, kSlot, "seq %llu", static_cast<unsigned long long>(seq));
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(slot), static_cast<std::uint32_t>(length + 1),
              mr->lkey()};
  ibv_send_wr wr{};
  wr.wr_id = seq;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  session->health().post_send(wr);
}

void Numbered::resend() {
  std::vector<std::uint64_t> again;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    again.swap(undelivered_);
  }
  for (auto seq = again.begin(); seq != again.end(); ++seq) {
    try {
      send(*seq);
    } catch (const std::system_error&) {
      // Down again: the rest waits for the next up, ahead of what the next
      // attempt lists (make_qp() adds it, now or already).
      std::lock_guard<std::mutex> lock(mutex_);
      undelivered_.insert(undelivered_.begin(), seq, again.end());
      return;
    }
  }
}

std::string state_line(const HealthChange& change) {
  std::string line(to_string(change.to));
  if (change.to != ConnectionState::kUp && !change.cause.what.empty()) {
    line += ": " + change.cause.what;
  }
  return line;
}

void Numbered::post_recv(QueuePair& qp, const MemoryRegion& mr, std::uint64_t slot) {
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(memory_.data() + (kSendSlots + slot) * kSlot),
              kSlot, mr.lkey()};
  ibv_recv_wr wr{};
  wr.wr_id = slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  qp.post_recv(wr);
}

void Numbered::say(const std::string& line) {
  log.add(line);
  if (echo) echo(line);
}

std::shared_ptr<QueuePair> Numbered::made_on(const OnDevice* on, std::uint32_t qp_num) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = made_.rbegin(); it != made_.rend(); ++it) {
    if (it->on != on) continue;
    auto qp = it->qp.lock();
    if (!qp) continue;
    if (const ibv_qp* raw = qp->get(); raw != nullptr && raw->qp_num == qp_num) return qp;
  }
  return nullptr;
}

// On the dispatching thread, from the CQ on `on`'s device. Only the current
// device's completions are the health's: QP numbers are per device, so an
// old device's QP may carry the current QP's number.
//
// A receive goes back to the QP it completed on while that QP is open,
// whether or not the session runs on it yet, as an application's receive
// loop does: an accepted QP receives from rdma_accept on (RTS), before its
// ESTABLISHED makes it the session's QP (and never, when the RTU is lost
// and the attempt times out), and a client that is up sends at once (the
// next up's resend first). Given back only on the session's QP of the
// moment, as this once was (#50), such a QP took kRecvSlots messages, or
// was adopted short of receives, and answered every later one with an RNR
// NAK, each retried after rdma_cm's 655 ms timer, for as long as it lived:
// the client's sends stalled, and with none left a message never arrived.
void Numbered::completed(const OnDevice* on, const ibv_wc& wc) {
  std::shared_ptr<CmSession> session;
  bool current = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    session = session_;
    current = on_devices_.back().get() == on;
  }
  if (session && current) session->health().completion(wc);
  if (wc.status == IBV_WC_WR_FLUSH_ERR) return;
  if (wc.status != IBV_WC_SUCCESS) return say(std::string("error ") + ibv_wc_status_str(wc.status));
  if ((wc.opcode & IBV_WC_RECV) == 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    sent_.push_back(std::chrono::steady_clock::now());
    confirmed_.insert(wc.wr_id);
    return;
  }
  const std::string text(memory_.data() + (kSendSlots + wc.wr_id) * kSlot);
  unsigned long long seq = 0;
  const bool numbered = std::sscanf(text.c_str(), "seq %llu", &seq) == 1;
  // Read first: the slot is written again once it goes back. A QP closed
  // (its device removed) has no number, and is not found.
  if (auto qp = made_on(on, wc.qp_num)) {
    try {
      post_recv(*qp, *on->mr, wc.wr_id);
    } catch (const std::system_error&) {
      // Closed meanwhile: nothing receives there any more.
    }
  }
  if (!numbered) return say(std::string("received garbage: ") + text);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!received_.insert(seq).second) ++duplicates_;
  }
  say("received " + std::to_string(seq));
}

std::set<std::uint64_t> Numbered::received() {
  std::lock_guard<std::mutex> lock(mutex_);
  return received_;
}

std::size_t Numbered::duplicates() {
  std::lock_guard<std::mutex> lock(mutex_);
  return duplicates_;
}

std::vector<std::chrono::steady_clock::time_point> Numbered::sent_times() {
  std::lock_guard<std::mutex> lock(mutex_);
  return sent_;
}

std::set<std::uint64_t> Numbered::confirmed() {
  std::lock_guard<std::mutex> lock(mutex_);
  return confirmed_;
}

std::vector<std::shared_ptr<Device>> Numbered::devices() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::shared_ptr<Device>> devices;
  for (const auto& on : on_devices_) devices.push_back(on->device);
  return devices;
}

PeerProcess::PeerProcess(const std::string& program, std::uint16_t port, Options options) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe2");
  const std::vector<std::string> args{program,
                                      test_device2(),
                                      cm_host2(),
                                      std::to_string(port),
                                      std::to_string(options.give_up_after.count()),
                                      std::to_string(options.connect_timeout.count())};
  std::vector<char*> argv;
  for (const auto& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  pid_ = fork();
  if (pid_ < 0) {
    const int error = errno;
    close(out[0]);
    close(out[1]);
    throw std::system_error(error, std::generic_category(), "fork");
  }
  if (pid_ == 0) {
    dup2(out[1], STDOUT_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  reader_ = std::thread([this, fd = out[0], on_line = std::move(options.on_line)] {
    FILE* in = fdopen(fd, "r");
    char* line = nullptr;  // getline's, whatever a line's length
    std::size_t capacity = 0;
    for (ssize_t n; (n = getline(&line, &capacity, in)) > 0;) {
      std::string text(line, static_cast<std::size_t>(n));
      if (text.back() == '\n') text.pop_back();
      lines.add(text);
      if (on_line) on_line(text);
    }
    std::free(line);
    std::fclose(in);
  });
  if (!eventually([this] { return !lines.starting_with("listening ").empty(); }, 20s)) {
    stop(SIGKILL);
    throw std::runtime_error(program + " did not listen within 20 s: " + lines.text());
  }
  port_ = static_cast<std::uint16_t>(std::stoi(lines.starting_with("listening ").front()));
}

PeerProcess::~PeerProcess() { stop(SIGTERM); }

int PeerProcess::stop(int signal) {
  int status = 0;
  if (pid_ > 0) {
    kill(pid_, signal);
    if (!eventually([&] { return waitpid(pid_, &status, WNOHANG) == pid_; }, 10s, 10ms)) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
    }
    pid_ = -1;
  }
  if (reader_.joinable()) reader_.join();
  return status;
}

}  // namespace ibev::testing
