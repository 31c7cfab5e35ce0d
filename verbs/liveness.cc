// Liveness: what a connection hears about its peer while it carries (or
// does not carry) traffic, as the kernel keeps keep-alive apart from the
// transport. Two causes, each reported through core_.cause_locked():
//   - the keepalive: a tick per interval on the Dispatcher's timer, a probe
//     (a zero-length RDMA write, signaled) and its taken completion; the
//     peer unheard for `misses` intervals is a cause;
//   - deadlines: the requests posted through post_tracked(), retired by
//     their completions; a signaled one outstanding past its deadline is a
//     cause, and those that were not delivered are listed for recovery.
// Locking: health_core.h's.
#include <algorithm>
#include <mutex>
#include <string>
#include <system_error>
#include <utility>

#include <ibev/dispatch/dispatcher.h>
#include "health_core.h"

namespace ibev {
namespace detail {

// --- The keepalive ---

// While up, a probe, unless one is out. With one out, `misses` intervals
// since the peer was last heard (a probe answered, or the connection came
// up) are a cause: timed from that, not from the probe's post (a probe
// leaves up to an interval after the peer went, which would stretch the
// bound to misses + 1 intervals), and not by ticks counted (a busy loop
// runs late ticks once).
void Liveness::tick() {
  const auto now = Clock::now();
  std::shared_ptr<QueuePair> connection;
  {
    std::lock_guard<std::mutex> lock(core_.mutex);
    if (core_.stopped || core_.health.state() != ConnectionState::kUp || !core_.qp_open()) return;
    if (probe_) {
      // Half an interval early still counts: ticks come a little late or a
      // little early, and the last answer came just after one.
      if (now - heard_from_ + keepalive.interval / 2 < keepalive.interval * keepalive.misses) {
        return;
      }
      core_.cause_locked(
          HealthCause{HealthSource::kKeepalive, 0, probe_->wr_id(),
                      "no keepalive answer in " +
                          std::to_string(keepalive.interval.count() * keepalive.misses) + " ms"});
      return;  // down: no probe until up() again
    }
    connection = core_.qp;
  }
  send_probe(now, connection);
}

// A zero-length RDMA write, signaled; its completion is taken (answered).
// What fails is reported; nothing is out then, and the next tick tries
// again.
void Liveness::send_probe(Clock::time_point now, const std::shared_ptr<QueuePair>& connection) {
  Probe next;
  Dispatcher* cq_events = connection->send_cq()->served_by();
  if (cq_events == nullptr) return;
  try {
    next.taken = cq_events->take_completion(
        connection->send_cq()->get(), connection->qp_num(), next.wr_id(),
        [weak = core_.weak_from_this(), wr_id = next.wr_id()](const ibv_wc& wc) {
          if (auto self = weak.lock()) self->liveness.answered(wr_id, wc);
        });
    ibv_send_wr post{};
    post.wr_id = next.wr_id();
    post.opcode = IBV_WR_RDMA_WRITE;
    post.send_flags = IBV_SEND_SIGNALED;
    connection->post_send(post);
  } catch (const std::exception& e) {
    core_.registry->report(
        Failure::verb_failed("ConnectionHealth keepalive", errno_of(e), e.what()));
    return;
  }
  std::lock_guard<std::mutex> lock(core_.mutex);
  ++stats_.sent;
  if (!core_.stopped && !probe_ && core_.qp == connection) {
    // A probe that leaves late (a post that failed, a loop that stalled)
    // still gets misses - 1 intervals of its own to be answered.
    heard_from_ = std::max(heard_from_, now - keepalive.interval);
    probe_ = std::move(next);
  }
}  // a probe not kept (stopped or replaced meanwhile): its handle goes, the post is flushed or lost
   // with the QP

// The probe's completion (on the CQ's thread). A late one, of a probe
// given up on, was only taken.
void Liveness::answered(std::uint64_t wr_id, const ibv_wc& wc) {
  std::optional<Probe> done;
  std::lock_guard<std::mutex> lock(core_.mutex);
  if (!probe_ || probe_->wr_id() != wr_id) return;
  ++stats_.answered;
  done = std::move(probe_);
  probe_.reset();
  if (wc.status == IBV_WC_SUCCESS) heard_from_ = Clock::now();
  if (wc.status == IBV_WC_SUCCESS || wc.status == IBV_WC_WR_FLUSH_ERR) return;
  core_.cause_locked(HealthCause{HealthSource::kKeepalive, static_cast<int>(wc.status), wc.wr_id,
                                 std::string("keepalive: ") + ibv_wc_status_str(wc.status)});
}  // its handle released here, after the lock, from inside its own call: no wait

// A probe out that will not be answered here any more (the health closes,
// or comes up again: a reset QP drops what was posted) is still taken for
// interval x misses and kProbeGrace more, so that its completion never
// reaches the CQ's handler, by a timer of its own that lets go of the probe
// and itself when it fires.
void Liveness::give_up(std::optional<Probe> out) noexcept {
  auto events = core_.dispatcher.lock();
  if (!out || !events) return;
  struct Grace {
    std::mutex mutex;
    std::optional<Probe> probe;
    Handle timer;
    bool fired = false;
  };
  try {
    auto grace = std::make_shared<Grace>();
    grace->probe = std::move(out);
    Handle timer = events->call_after(keepalive.interval * keepalive.misses + kProbeGrace, [grace] {
      std::optional<Probe> probe;
      Handle timer;  // both released outside the lock; the timer from inside its task
      std::lock_guard<std::mutex> lock(grace->mutex);
      grace->fired = true;
      std::swap(probe, grace->probe);
      std::swap(timer, grace->timer);
    });
    std::lock_guard<std::mutex> lock(grace->mutex);
    if (!grace->fired) std::swap(grace->timer, timer);
  } catch (const std::exception&) {
    // No timer: the probe's completion, if it comes, reaches the handler.
  }
}

void Liveness::let_go_of_probe() noexcept {
  std::optional<Probe> out;
  {
    std::lock_guard<std::mutex> lock(core_.mutex);
    std::swap(out, probe_);
  }
  give_up(std::move(out));
}

// --- Deadlines: what post_tracked() posted, until its completion ---

void Liveness::completion(const ibv_wc& wc) {
  if (wc.qp_num != core_.qp_num.load(std::memory_order_relaxed)) return;
  auto cause = HealthCause::of_completion(wc);
  if (!cause && !tracking_.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(core_.mutex);
  if (wc.qp_num != core_.qp_num || !core_.qp_open()) return;
  retire(wc);
  if (cause) core_.cause_locked(std::move(*cause));
}

void Liveness::post_tracked(ibv_send_wr& wr, ibv_send_wr** bad_wr) {
  ibv_send_wr* bad = nullptr;
  std::lock_guard<std::mutex> lock(core_.mutex);
  tracking_.store(true, std::memory_order_relaxed);
  const auto now = Clock::now();
  const std::size_t before = posted_.size();
  for (const ibv_send_wr* next = &wr; next != nullptr; next = next->next) {
    const bool signaled = core_.signal_all || (next->send_flags & IBV_SEND_SIGNALED) != 0;
    posted_.push_back({next->wr_id, signaled, now});
  }
  try {
    // With recovery, what is posted while not up would reach no attempt's
    // undelivered(): it is refused (posted: nothing; bad_wr: the first).
    if (!core_.qp || (core_.recovery.reconnecter && core_.health.state() != ConnectionState::kUp)) {
      throw std::system_error(ENOTCONN, std::generic_category(),
                              "ConnectionHealth::post_send: the connection is not up");
    }
    core_.qp->post_send(wr, &bad);
  } catch (...) {
    // The requests from `bad` on were not posted (all of them when the
    // verb was not reached: a closed QP).
    if (bad == nullptr) bad = &wr;
    std::size_t sent = 0;
    for (const ibv_send_wr* next = &wr; next != nullptr && next != bad; next = next->next) ++sent;
    posted_.resize(before + sent);
    if (bad_wr != nullptr) *bad_wr = bad;
    throw;
  }
}

// A completion retires its request and those posted before it (a send
// queue completes in order; unsignaled requests have no completion of their
// own unless they fail); a request whose own completion is an error or a
// flush was not delivered.
void Liveness::retire(const ibv_wc& wc) {
  const bool success = wc.status == IBV_WC_SUCCESS;
  if (success && (wc.opcode & IBV_WC_RECV) != 0) return;
  // A success is a signaled request's; an error may be any request's.
  const auto it = std::find_if(posted_.begin(), posted_.end(), [&](const Posted& p) {
    return p.wr_id == wc.wr_id && (p.signaled || !success);
  });
  if (it == posted_.end()) return;
  if (!success) note_undelivered(wc.wr_id);
  posted_.erase(posted_.begin(), it + 1);
}

void Liveness::forget_requests() {
  posted_.clear();
  undelivered_.clear();
}

std::vector<std::uint64_t> Liveness::undelivered_now() {
  for (const Posted& p : posted_) note_undelivered(p.wr_id);
  posted_.clear();
  return undelivered_;
}

void Liveness::note_undelivered(std::uint64_t wr_id) {
  if (undelivered_.size() < kMaxUndelivered) undelivered_.push_back(wr_id);
}

// While up, the oldest signaled request outstanding past its deadline is a
// cause.
void Liveness::check_deadline() {
  std::lock_guard<std::mutex> lock(core_.mutex);
  if (core_.stopped || core_.health.state() != ConnectionState::kUp || !core_.qp_open()) return;
  const auto oldest =
      std::find_if(posted_.begin(), posted_.end(), [](const Posted& p) { return p.signaled; });
  if (oldest == posted_.end()) return;
  const auto waited =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - oldest->at);
  if (waited < deadline) return;
  core_.cause_locked(HealthCause{HealthSource::kDeadline, 0, oldest->wr_id,
                                 "wr_id " + std::to_string(oldest->wr_id) +
                                     " had no completion in " + std::to_string(waited.count()) +
                                     " ms (deadline " + std::to_string(deadline.count()) + " ms)"});
}

}  // namespace detail
}  // namespace ibev
