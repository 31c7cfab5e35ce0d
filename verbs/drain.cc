// A QP's drain, top-down (drain.h says what it is): start_drain registers
// what to wait for and posts the markers; each awaited thing's arrival
// counts down the Drain, which answers `done` once; MarkerPoll polls the
// markers of kPolled CQs.
#include "drain.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include <ibev/core/thread_annotations.h>
#include <ibev/dispatch/event_wait.h>
#include <ibev/verbs/test_seams.h>

namespace ibev {

void (*detail::test_seams::before_drain_posts)(ibv_qp*) = nullptr;

namespace detail {

// One drain in progress: what it still waits for (markers, LAST_WQE), and
// the one call of `done`. Its timer, in the Dispatcher's loop, owns it; the
// rest see it weakly. So a Dispatcher destroyed mid-drain takes it along:
// `done` is never called, and what `done` held (a QP dropped with
// drain_on_destroy) is destroyed with it.
//
// Answered (`done` called) and over (its subscriptions released) are apart
// for one case: a drain cancelled by close() is answered at once, but its
// markers may still come, and their takers stay until they have, or its
// timer has fired, so that no marker ever reaches the application.
class Drain {
 public:
  // What `done` throws goes to `failures` (the Dispatcher's Registry: its
  // sink and counters), naming `qp`; to stderr once that is gone. `qp` is
  // read now: `done` may destroy it.
  Drain(DrainDone done, std::weak_ptr<Registry> failures, ibv_qp* qp)
      : done_(std::move(done)), failures_(std::move(failures)), device_(qp->context), qp_(qp) {}

  void expect(int count) IBEV_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    waiting_ += count;
  }
  // Kept until the drain is over; released at once if it already is.
  void hold(Handle handle) {
    {
      MutexLock lock(mutex_);
      if (!over_) {
        handles_.push_back(std::move(handle));
        return;
      }
    }
    handle.release();
  }

  // One awaited thing came; `note` records it in the report.
  template <typename Note>
  void arrived(const Note& note) {
    bool last;
    {
      MutexLock lock(mutex_);
      if (over_) return;
      if (!answered_) note(report_);
      last = --waiting_ == 0;
    }
    if (last) finish({});
  }
  // A marker's completion came: its queue is drained.
  void marker_came(bool is_send) {
    arrived([is_send](DrainReport& report) {
      (is_send ? report.send_drained : report.receive_drained) = true;
    });
  }

  bool answered() {
    MutexLock lock(mutex_);
    return answered_;
  }

  // Over: `done` runs (unless it ran), and the subscriptions go.
  void finish(std::error_code error) noexcept {
    release_all();
    answer(error);
  }
  // close() ended it: `done` runs now; what it posted is still taken.
  void cancel(std::error_code error) noexcept { answer(error); }
  // It could not start: the subscriptions go, and `done` never runs (the
  // caller hears the exception instead).
  void abandon() noexcept {
    {
      MutexLock lock(mutex_);
      answered_ = true;
    }
    release_all();
  }

 private:
  void release_all() noexcept {
    std::vector<Handle> handles;
    {
      MutexLock lock(mutex_);
      if (over_) return;
      over_ = true;
      handles.swap(handles_);
    }
    // From inside one of their own callbacks: that one does not wait.
    for (auto it = handles.rbegin(); it != handles.rend(); ++it) it->release();
  }
  void answer(std::error_code error) noexcept {
    DrainReport report;  // final once answered
    {
      MutexLock lock(mutex_);
      if (answered_) return;
      answered_ = true;
      report = report_;
    }
    reported_call("drain's done", [&] { done_(report, error); }, [this](Failure failure) {
      failure.device = device_;
      failure.object = qp_;
      if (const std::shared_ptr<Registry> registry = failures_.lock()) {
        registry->report(failure);
      } else {
        send_to({}, failure);
      }
    });
  }

  Mutex mutex_;
  int waiting_ IBEV_GUARDED_BY(mutex_) = 0;
  bool answered_ IBEV_GUARDED_BY(mutex_) = false;
  bool over_ IBEV_GUARDED_BY(mutex_) = false;
  DrainReport report_ IBEV_GUARDED_BY(mutex_);
  DrainDone done_;
  const std::weak_ptr<Registry> failures_;
  ibv_context* const device_;  // for the failure record only: never dereferenced
  const void* const qp_;       // likewise (`done` may have destroyed it)
  std::vector<Handle> handles_ IBEV_GUARDED_BY(mutex_);
};

void cancel(Drain& drain, std::error_code error) noexcept { drain.cancel(error); }

namespace {

using Queues = DrainedQueues;

bool polled(const std::shared_ptr<CompletionQueue>& cq) {
  return cq->mode() == CompletionMode::kPolled;
}

// Polls the CQs of `markers` until each has come, handing every other
// completion to `handler`; `arrived` for each marker; false when `timeout`
// passed first. Stops early once `drain` was answered otherwise (a close()).
template <typename Arrived>
bool poll_for_markers(std::vector<PolledMarker> markers, std::uint32_t qp_num,
                      const CompletionHandler& handler, std::chrono::milliseconds timeout,
                      Drain& drain, const Arrived& arrived) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::array<ibv_wc, 32> wcs;
  while (!markers.empty() && !drain.answered()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    ibv_cq* cq = markers.front().cq;
    const int n = ibv_poll_cq(cq, static_cast<int>(wcs.size()), wcs.data());
    if (n < 0) throw_system_error("ibv_poll_cq", -n);
    int kept = 0;
    for (int i = 0; i < n; ++i) {
      auto it = std::find_if(markers.begin(), markers.end(), [&](const PolledMarker& m) {
        return m.cq == cq && wcs[i].qp_num == qp_num && wcs[i].wr_id == m.wr_id;
      });
      if (it == markers.end()) {
        wcs[kept++] = wcs[i];
        continue;
      }
      arrived(it->is_send);
      markers.erase(it);
    }
    if (kept > 0) handler(CompletionBatch{cq, wcs.data(), static_cast<std::size_t>(kept)});
    if (n == 0) {
      std::rotate(markers.begin(), markers.begin() + 1, markers.end());  // the other CQ
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  return true;
}

}  // namespace

void check_drain_options(const DrainOptions& options, const char* verb) {
  const auto check = [verb](std::chrono::milliseconds time, const char* field) {
    if (time.count() <= 0) {
      throw std::invalid_argument(std::string(verb) + ": DrainOptions::" + field + " is " +
                                  std::to_string(time.count()) +
                                  " ms; it must be above zero");
    }
  };
  check(options.timeout, "timeout");
  check(options.last_wqe_timeout, "last_wqe_timeout");
}

MarkerPoll start_drain(ibv_qp* qp, const QueuePairParents& parents, Dispatcher& events,
                       DrainedQueues queues, const DrainOptions& options, DrainDone done,
                       const std::function<void(const std::shared_ptr<Drain>&)>& track) {
  if (qp->qp_type == IBV_QPT_UD) {
    throw std::invalid_argument("QueuePair::drain: RC, UC and XRC QPs only (as ib_drain_qp)");
  }
  const bool on_srq = parents.srq != nullptr;
  if (queues == Queues::kReceive && on_srq) {
    throw std::invalid_argument(
        "QueuePair::drain_receive: the QP receives from an SRQ; drain() waits for its "
        "QP_LAST_WQE_REACHED instead");
  }
  const bool send = queues != Queues::kReceive;
  const bool receive = queues != Queues::kSend && !on_srq;
  const bool last_wqe = queues == Queues::kBoth && on_srq;
  if (((send && polled(parents.send_cq)) || (receive && polled(parents.recv_cq))) &&
      !options.polled) {
    throw std::invalid_argument("QueuePair::drain: a kPolled CQ needs DrainOptions::polled");
  }

  auto drain = std::make_shared<Drain>(std::move(done), events.shared_registry(), qp);
  // Unique while it runs (the Drain's address, aligned: +1 is still its).
  const auto send_marker = reinterpret_cast<std::uint64_t>(drain.get());
  const auto receive_marker = send_marker + 1;
  std::vector<PolledMarker> polled_markers;
  drain->expect((send ? 1 : 0) + (receive ? 1 : 0) + (last_wqe ? 1 : 0));
  bool timed = false;
  try {
    if (track) track(drain);
    const auto take = [&](const std::shared_ptr<CompletionQueue>& cq, bool is_send) {
      const std::uint64_t marker_id = is_send ? send_marker : receive_marker;
      if (polled(cq)) {
        polled_markers.push_back({cq->get(), marker_id, is_send});
        return;
      }
      timed = true;
      Dispatcher* served_by = cq->served_by();
      if (served_by == nullptr) {
        throw std::system_error(ENODEV, std::generic_category(),
                                "QueuePair::drain: the CQ's Dispatcher was destroyed");
      }
      drain->hold(served_by->take_completion(
          cq->get(), qp->qp_num, marker_id, [weak = std::weak_ptr<Drain>(drain), is_send](const ibv_wc&) {
            if (auto drain = weak.lock()) drain->marker_came(is_send);
          }));
    };
    if (send) take(parents.send_cq, true);
    if (receive) take(parents.recv_cq, false);
    if (last_wqe) {
      drain->hold(wait_for(events, qp, EventFilter{IBV_EVENT_QP_LAST_WQE_REACHED},
                           options.last_wqe_timeout,
                           [weak = std::weak_ptr<Drain>(drain)](const WaitResult& result) {
                             auto drain = weak.lock();
                             if (!drain) return;
                             if (result.outcome == WaitResult::Outcome::kDeviceLost) {
                               drain->finish(std::make_error_code(std::errc::no_such_device));
                               return;
                             }
                             drain->arrived([&](DrainReport& report) {
                               report.last_wqe_reached =
                                   result.outcome == WaitResult::Outcome::kEvent;
                             });
                           }));
    }
    if (timed) {
      drain->hold(events.call_after(options.timeout, [drain] {
        drain->finish(std::make_error_code(std::errc::timed_out));
      }));
    }

    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    if (const int rc = ibv_modify_qp(qp, &attr, IBV_QP_STATE); rc != 0) {
      throw_system_error("ibv_modify_qp(ERR)", rc);
    }
    if (detail::test_seams::before_drain_posts != nullptr) {
      detail::test_seams::before_drain_posts(qp);
    }
    if (send) {
      ibv_send_wr wr{};
      wr.wr_id = send_marker;
      wr.opcode = IBV_WR_RDMA_WRITE;  // zero-length, as ib_drain_sq posts
      wr.send_flags = IBV_SEND_SIGNALED;
      ibv_send_wr* bad = nullptr;
      if (const int rc = ibv_post_send(qp, &wr, &bad); rc != 0) {
        throw_system_error("ibv_post_send(drain marker)", rc);
      }
    }
    if (receive) {
      ibv_recv_wr wr{};
      wr.wr_id = receive_marker;
      ibv_recv_wr* bad = nullptr;
      if (const int rc = ibv_post_recv(qp, &wr, &bad); rc != 0) {
        throw_system_error("ibv_post_recv(drain marker)", rc);
      }
      // ERR again, which the spec allows: rxe (Linux 6.1) flushes a user
      // QP's receive queue only on entering ERR, and a receive posted after
      // never reaches the kernel, so its marker would wait for ever.
      if (const int rc = ibv_modify_qp(qp, &attr, IBV_QP_STATE); rc != 0) {
        throw_system_error("ibv_modify_qp(ERR->ERR)", rc);
      }
    }
  } catch (...) {
    drain->abandon();  // releases what it registered; `done` never runs
    throw;
  }
  MarkerPoll rest;
  if (polled_markers.empty()) return rest;
  rest.drain = std::move(drain);
  rest.markers = std::move(polled_markers);
  rest.qp_num = qp->qp_num;
  for (const auto* cq : {&parents.send_cq, &parents.recv_cq}) {
    if (polled(*cq)) rest.cqs.push_back(*cq);
  }
  return rest;
}

void MarkerPoll::run(const DrainOptions& options) noexcept {
  if (!drain) return;
  try {
    const bool all_came = poll_for_markers(
        std::move(markers), qp_num, options.polled, options.timeout, *drain,
        [&](bool is_send) { drain->marker_came(is_send); });
    // All came, or a close() stopped the polling: the drain ends with its
    // last awaited thing, its timer, or this hold on it.
    if (!all_came) drain->finish(std::make_error_code(std::errc::timed_out));
  } catch (const std::system_error& e) {
    drain->finish(e.code());
  } catch (const std::exception&) {  // DrainOptions::polled threw
    drain->finish(std::make_error_code(std::errc::io_error));
  }
}

}  // namespace detail
}  // namespace ibev
