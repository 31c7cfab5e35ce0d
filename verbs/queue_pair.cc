// Locking: Drain::mutex_ (one drain's progress) and Drains::mutex (the drains
// of one QP) are leaves: neither is held across `done`, a handle's release
// or a verb. The two call guards order the rest: drain_verbs_ is held (as a
// call) while a drain posts its markers and registers, Drains::polls while it
// polls kPolled CQs for them; close() closes both and waits for each, holding
// no lock, and a drain that finds `closing` set under Drains::mutex is
// refused. So close() racing drain() either waits for the drain's verbs or
// refuses the drain, and never frees the QP under it.
#include <ibev/verbs/queue_pair.h>

#include <ibev/core/happens_before.h>
#include <ibev/dispatch/event_wait.h>
#include <ibev/verbs/test_seams.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <future>
#include <mutex>
#include <random>
#include <string>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

namespace ibev {

void (*detail::test_seams::before_drain_posts)(ibv_qp*) = nullptr;

namespace {

std::uint32_t random_psn() {
  thread_local std::mt19937 engine{std::random_device{}()};
  return std::uniform_int_distribution<std::uint32_t>(0, detail::kMax24Bits)(engine);
}

// RESET or INIT -> INIT, the one step of connect() that needs no remote;
// returns the mask.
int rc_init(const ConnectOptions& options, ibv_qp_attr& init) {
  init.qp_state = IBV_QPS_INIT;
  init.port_num = options.port;
  init.pkey_index = options.pkey_index;
  init.qp_access_flags = options.access_flags;
  return IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
}

using DrainDone = std::function<void(const DrainReport&, std::error_code)>;

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

  void expect(int count) { waiting_ += count; }
  // Kept until the drain is over; released at once if it already is.
  void hold(Handle handle) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
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
      std::lock_guard<std::mutex> lock(mutex_);
      if (over_) return;
      if (!answered_) note(report_);
      last = --waiting_ == 0;
    }
    if (last) finish({});
  }

  bool answered() {
    std::lock_guard<std::mutex> lock(mutex_);
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
      std::lock_guard<std::mutex> lock(mutex_);
      answered_ = true;
    }
    release_all();
  }

 private:
  void release_all() noexcept {
    std::vector<Handle> handles;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (over_) return;
      over_ = true;
      handles.swap(handles_);
    }
    // From inside one of their own callbacks: that one does not wait.
    for (auto it = handles.rbegin(); it != handles.rend(); ++it) it->release();
  }
  void answer(std::error_code error) noexcept {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (answered_) return;
      answered_ = true;
    }
    if (auto threw = exception_text([&] { done_(report_, error); })) {
      Failure failure = Failure::handler_threw("drain's done", std::move(*threw));
      failure.device = device_;
      failure.object = qp_;
      if (const std::shared_ptr<Registry> registry = failures_.lock()) {
        registry->report(failure);
      } else {
        send_to({}, failure);
      }
    }
  }

  std::mutex mutex_;
  int waiting_ = 0;
  bool answered_ = false;
  bool over_ = false;
  DrainReport report_;
  DrainDone done_;
  const std::weak_ptr<Registry> failures_;
  ibv_context* const device_;  // for the failure record only: never dereferenced
  const void* const qp_;       // likewise (`done` may have destroyed it)
  std::vector<Handle> handles_;
};

using Queues = detail::DrainedQueues;

bool polled(const std::shared_ptr<CompletionQueue>& cq) {
  return cq->mode() == CompletionMode::kPolled;
}

// A marker on a kPolled CQ, which drain polls for itself.
struct PolledMarker {
  ibv_cq* cq;
  std::uint64_t wr_id;
  bool is_send;
};

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

// Markers on kPolled CQs, which the drain polls for itself once its verbs
// are done: run by the caller after it let go of the QP, since `done` may
// drop the last reference to it. Holds those CQs while it polls.
struct MarkerPoll {
  std::shared_ptr<Drain> drain;  // null: nothing to poll
  std::vector<PolledMarker> markers;
  std::vector<std::shared_ptr<CompletionQueue>> cqs;
  std::uint32_t qp_num = 0;
  void run(const DrainOptions& options) noexcept;
};

// The kernel's __ib_drain_sq/__ib_drain_rq, for userspace: what to wait for
// is registered first (the markers' completions, LAST_WQE_REACHED, a
// timer), then the QP goes to ERR and the markers are posted; markers on
// kPolled CQs are left to the MarkerPoll it returns. `done` runs once.
// Throws (and `done` never runs) when it cannot start.
// `track`: told of the drain once it exists, before its verbs, so that a
// close() can end it; it throws to refuse (the QP is closing).
MarkerPoll start_drain(ibv_qp* qp, const QueuePairOptions& parents, Dispatcher& events, Queues queues,
                 const DrainOptions& options, DrainDone done,
                 const std::function<void(const std::shared_ptr<Drain>&)>& track = {}) {
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
            if (auto drain = weak.lock()) {
              drain->arrived([is_send](DrainReport& report) {
                (is_send ? report.send_drained : report.receive_drained) = true;
              });
            }
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
        [&](bool is_send) {
          drain->arrived([is_send](DrainReport& report) {
            (is_send ? report.send_drained : report.receive_drained) = true;
          });
        });
    // All came, or a close() stopped the polling: the drain ends with its
    // last awaited thing, its timer, or this hold on it.
    if (!all_came) drain->finish(std::make_error_code(std::errc::timed_out));
  } catch (const std::system_error& e) {
    drain->finish(e.code());
  } catch (const std::exception&) {  // DrainOptions::polled threw
    drain->finish(std::make_error_code(std::errc::io_error));
  }
}

// A QP dropped with drain_on_destroy, between its drain and its destroy:
// what it needs stays alive, and Device::close() can still reach it.
class DrainingQp : public detail::Closeable {
 public:
  DrainingQp(ibv_qp* qp, std::shared_ptr<ProtectionDomain> pd, QueuePairOptions parents)
      : pd_(std::move(pd)),
        parents_(std::move(parents)),
        qp_(qp, qp->context, &pd_->device()->registry()) {}

  void close() noexcept override { qp_.close(); }

 private:
  const std::shared_ptr<ProtectionDomain> pd_;
  const QueuePairOptions parents_;  // its CQs and SRQ
  detail::Owned<ibv_qp, ibv_destroy_qp, detail::kDestroyQp> qp_;
};

}  // namespace

std::shared_ptr<QueuePair> QueuePair::create(std::shared_ptr<ProtectionDomain> pd,
                                             Handler on_event, Options options) {
  if (!pd || !options.send_cq || !options.recv_cq) {
    throw std::invalid_argument(
        "QueuePair::create: needs a domain, a send CQ and a receive CQ");
  }
  const auto& device = pd->device();
  if (options.send_cq->device() != device || options.recv_cq->device() != device ||
      (options.srq && options.srq->pd()->device() != device)) {
    throw std::invalid_argument(
        "QueuePair::create: the CQs and SRQ must be on the domain's device");
  }
  if (options.psn) detail::require_psn("QueuePair::create", *options.psn);
  ibv_qp_init_attr init{};
  init.send_cq = options.send_cq->get();
  init.recv_cq = options.recv_cq->get();
  init.srq = options.srq ? options.srq->get() : nullptr;
  init.qp_type = options.type;
  init.cap = options.cap;
  init.sq_sig_all = options.signal_all ? 1 : 0;
  if (init.send_cq == nullptr || init.recv_cq == nullptr ||
      (options.srq && init.srq == nullptr)) {
    throw_system_error("ibv_create_qp: a CQ or the SRQ was closed", ENODEV);
  }
  ibv_qp* qp = ibv_create_qp(pd->require_open("ibv_create_qp"), &init);
  if (qp == nullptr) throw_system_error("ibv_create_qp", errno);
  auto queue_pair = std::make_shared<QueuePair>(Token{}, pd, std::move(options), qp);
  if (on_event) {
    // By its number too: what names a QP without its address (a DevX
    // event, an injected ObjectNumber) reaches the same handler, one object
    // (a handler with state has one state).
    Registry& registry = device->registry();
    const auto handler = std::make_shared<const Handler>(std::move(on_event));
    const Handler calls_it = [handler](const Event& event) { (*handler)(event); };
    queue_pair->qp_.serve_with(registry.attach(
        qp->context, ObjectNumber{ElementKind::kQp, qp->qp_num}, EventFilter{}, calls_it));
    queue_pair->qp_.serve_with(registry.attach(qp, calls_it));
  }
  device->track(queue_pair);
  return queue_pair;
}

QueuePair::QueuePair(Token, std::shared_ptr<ProtectionDomain> pd, Options options,
                     ibv_qp* qp)
    : pd_(std::move(pd)),
      parents_(std::move(options)),
      psn_(parents_.psn ? *parents_.psn : random_psn()),
      qp_(qp, qp->context, &pd_->device()->registry()) {}

// With drain_on_destroy, and a device still there, the QP drains first and
// the dispatching thread destroys it when its markers have come (or the
// drain's timeout passed). A kPolled CQ is polled here, bounded.
QueuePair::~QueuePair() {
  if (!parents_.drain_on_destroy || qp_.get() == nullptr || qp_.inherited() ||
      pd_->device()->loss() != DeviceLoss::kNone) {
    return;  // qp_ destroys it at once (in a forked child: forgets it)
  }
  ibv_qp* qp = qp_.release();
  auto draining = std::make_shared<DrainingQp>(qp, pd_, parents_);
  try {
    pd_->device()->track(draining);
    DrainOptions options;
    options.polled = [](const CompletionBatch&) {};  // nobody is left to hear them
    start_drain(qp, parents_, pd_->device()->dispatcher(), Queues::kBoth, options,
                [draining](const DrainReport&, std::error_code) { draining->close(); })
        .run(options);
  } catch (const std::exception&) {
    draining->close();
  }
}

// Weak: a drain that ended (its timer or markers gone) is nobody's to end.
struct QueuePair::Drains {
  std::mutex mutex;
  bool closing = false;
  std::vector<std::weak_ptr<Drain>> running;
  // Held while a drain polls kPolled CQs for its markers, after its verbs:
  // close() waits for it (the CQs may go once it returns), and it lives on
  // with the drain when `done` destroys the QueuePair.
  detail::CallGuard polls;
};

std::shared_ptr<QueuePair::Drains> QueuePair::drains() {
  std::shared_ptr<Drains> drains = std::atomic_load(&drains_);
  if (drains) return drains;
  auto made = std::make_shared<Drains>();
  return std::atomic_compare_exchange_strong(&drains_, &drains, made) ? made : drains;
}

// A drain that got past its check of the QP is either in its verbs (waited
// for below) or registered (ended here), or both; one that registers after
// `closing` is set is refused there.
void QueuePair::close() noexcept {
  if (qp_.inherited()) return qp_.close();  // a forked child's: no drain of its own
  drain_verbs_.close();
  if (const std::shared_ptr<Drains> drains = std::atomic_load(&drains_)) {
    std::vector<std::weak_ptr<Drain>> running;
    {
      std::lock_guard<std::mutex> lock(drains->mutex);
      drains->closing = true;
      running.swap(drains->running);
    }
    const auto cancelled = std::make_error_code(std::errc::operation_canceled);
    for (const auto& weak : running) {
      if (auto drain = weak.lock()) drain->cancel(cancelled);
    }
  }
  drain_verbs_.wait_idle();  // not for a drain on this thread (close() from its callback)
  if (const std::shared_ptr<Drains> drains = std::atomic_load(&drains_)) {
    drains->polls.close();  // cancelled: its polling stops at its next look
    drains->polls.wait_idle();
  }
  qp_.close();
}

// The verbs under drain_verbs_, the polling for markers on kPolled CQs
// after it under Drains::polls (close() waits for both), touching nothing of
// this QueuePair then: `done` may destroy it.
void QueuePair::run_drain(const char* verb, detail::DrainedQueues queues,
                          const DrainOptions& options,
                          std::function<void(const DrainReport&, std::error_code)> done) {
  MarkerPoll rest;
  std::shared_ptr<Drains> drains;
  {
    const auto entered = drain_verbs_.enter();
    if (!entered) detail::throw_closed(verb);
    ibv_qp* qp = qp_.require(verb);
    drains = this->drains();
    rest = start_drain(qp, parents_, pd_->device()->dispatcher(), queues, options,
                       std::move(done), [&drains, verb](const std::shared_ptr<Drain>& drain) {
                         std::lock_guard<std::mutex> lock(drains->mutex);
                         if (drains->closing) detail::throw_closed(verb);
                         auto& running = drains->running;
                         running.erase(
                             std::remove_if(running.begin(), running.end(),
                                            [](const auto& weak) { return weak.expired(); }),
                             running.end());
                         running.push_back(drain);
                       });
  }
  if (!rest.drain) return;  // nothing to poll
  if (const auto entered = drains->polls.enter()) rest.run(options);  // else cancelled
}

std::uint32_t QueuePair::qp_num() const { return qp_.require("QueuePair::qp_num")->qp_num; }

void QueuePair::modify(ibv_qp_attr& attr, int mask, const char* step) {
  // ibv_modify_qp returns the errno value itself.
  if (const int rc = ibv_modify_qp(qp_.require(step), &attr, mask); rc != 0) {
    throw_system_error(step, rc);
  }
}

void QueuePair::post_send(ibv_send_wr& wr, ibv_send_wr** bad_wr) {
  detail::release_before_post(parents_.send_cq->get());
  ibv_send_wr* bad = nullptr;
  // ibv_post_send returns the errno value itself.
  if (const int rc = ibv_post_send(qp_.require("ibv_post_send"), &wr, bad_wr ? bad_wr : &bad); rc != 0) {
    throw_system_error("ibv_post_send", rc);
  }
}

void QueuePair::post_recv(ibv_recv_wr& wr, ibv_recv_wr** bad_wr) {
  detail::release_before_post(parents_.recv_cq->get());
  ibv_recv_wr* bad = nullptr;
  if (const int rc = ibv_post_recv(qp_.require("ibv_post_recv"), &wr, bad_wr ? bad_wr : &bad); rc != 0) {
    throw_system_error("ibv_post_recv", rc);
  }
}

RcEndpoint QueuePair::endpoint(std::uint8_t port, int gid_index) const {
  const auto& device = pd_->device();
  return {qp_num(), device->query_gid(port, gid_index), psn_,
          device->query_port(port).lid};
}

void QueuePair::to_init(const ConnectOptions& options) {
  ibv_qp_attr init{};
  const int mask = rc_init(options, init);
  modify(init, mask, "ibv_modify_qp(INIT)");
}

void QueuePair::connect(const RcEndpoint& remote, const ConnectOptions& options) {
  const auto& device = pd_->device();
  const detail::RcTransitions steps = detail::rc_transitions(
      remote, psn_, device->query_port(options.port),
      device->query_gid(options.port, options.gid_index), options);
  ibv_qp_attr init = steps.init, rtr = steps.rtr, rts = steps.rts;
  modify(init, steps.init_mask, "ibv_modify_qp(INIT)");
  modify(rtr, steps.rtr_mask, "ibv_modify_qp(RTR)");
  modify(rts, steps.rts_mask, "ibv_modify_qp(RTS)");
}

void QueuePair::drain_send_queue() {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_SQD;
  attr.en_sqd_async_notify = 1;
  modify(attr, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY, "ibv_modify_qp(SQD)");
}

void QueuePair::resume_send_queue() {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTS;
  attr.cur_qp_state = IBV_QPS_SQD;
  modify(attr, IBV_QP_STATE | IBV_QP_CUR_STATE, "ibv_modify_qp(SQD->RTS)");
}

void QueuePair::drain_async(DrainOptions options,
                            std::function<void(const DrainReport&, std::error_code)> done) {
  if (!done) throw std::invalid_argument("QueuePair::drain_async: `done` is empty");
  run_drain("QueuePair::drain", Queues::kBoth, options, std::move(done));
}

// The blocking form: the caller waits, so it must not be the thread that
// delivers the markers.
DrainReport QueuePair::drain_and_wait(const char* verb, detail::DrainedQueues queues,
                                      const DrainOptions& options) {
  for (const auto* cq : {&parents_.send_cq, &parents_.recv_cq}) {
    Dispatcher* served_by = (*cq)->served_by();
    if (served_by != nullptr && served_by->in_dispatcher_thread()) {
      throw std::logic_error(
          "QueuePair::drain: called on the dispatching thread, which delivers the drain's "
          "marker; use drain_async there");
    }
  }
  using Outcome = std::pair<DrainReport, std::error_code>;
  auto outcome = std::make_shared<std::promise<Outcome>>();
  std::future<Outcome> result = outcome->get_future();
  run_drain(verb, queues, options, [outcome](const DrainReport& report, std::error_code error) {
    outcome->set_value({report, error});
  });
  // The drain's own timer ends it; this bound is for a Dispatcher that
  // does not dispatch (stopped, or never started).
  const auto bound = options.timeout + options.last_wqe_timeout + std::chrono::seconds(1);
  if (result.wait_for(bound) != std::future_status::ready) {
    throw_system_error(std::string(verb) + " (is the Dispatcher running?)", ETIMEDOUT);
  }
  const Outcome got = result.get();
  if (got.second) throw_system_error(verb, got.second.value());
  return got.first;
}

DrainReport QueuePair::drain(const DrainOptions& options) {
  return drain_and_wait("QueuePair::drain", Queues::kBoth, options);
}

DrainReport QueuePair::drain_send(const DrainOptions& options) {
  return drain_and_wait("QueuePair::drain_send", Queues::kSend, options);
}

DrainReport QueuePair::drain_receive(const DrainOptions& options) {
  return drain_and_wait("QueuePair::drain_receive", Queues::kReceive, options);
}

void connect_rc_pair(QueuePair& a, QueuePair& b, const ConnectOptions& options) {
  const RcEndpoint a_end = a.endpoint(options.port, options.gid_index);
  const RcEndpoint b_end = b.endpoint(options.port, options.gid_index);
  a.connect(b_end, options);
  b.connect(a_end, options);
}

namespace detail {

RcTransitions rc_transitions(const RcEndpoint& remote, std::uint32_t own_psn,
                             const ibv_port_attr& port, const ibv_gid& local_gid,
                             const ConnectOptions& options) {
  // Drivers that predate link_layer report UNSPECIFIED: InfiniBand.
  const bool infiniband = port.link_layer != IBV_LINK_LAYER_ETHERNET;
  if (infiniband && remote.lid() == 0) {
    throw std::invalid_argument(
        "QueuePair::connect: the remote has no LID, and an InfiniBand port "
        "addresses by LID");
  }
  const bool grh = !infiniband || remote.gid().global.subnet_prefix !=
                                      local_gid.global.subnet_prefix;
  RcTransitions steps;

  steps.init_mask = rc_init(options, steps.init);

  ibv_qp_attr& rtr = steps.rtr;
  rtr.qp_state = IBV_QPS_RTR;
  rtr.path_mtu = options.path_mtu.value_or(port.active_mtu);
  rtr.dest_qp_num = remote.qp_num();
  rtr.rq_psn = remote.psn();
  rtr.max_dest_rd_atomic = options.max_dest_rd_atomic;
  rtr.min_rnr_timer = options.min_rnr_timer;
  rtr.ah_attr.port_num = options.port;
  rtr.ah_attr.sl = options.service_level;
  rtr.ah_attr.dlid = infiniband ? remote.lid() : 0;
  rtr.ah_attr.is_global = grh ? 1 : 0;
  if (grh) {
    rtr.ah_attr.grh.dgid = remote.gid();
    rtr.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(options.gid_index);
    rtr.ah_attr.grh.hop_limit = options.hop_limit;
    rtr.ah_attr.grh.traffic_class = options.traffic_class;
  }
  steps.rtr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;

  ibv_qp_attr& rts = steps.rts;
  rts.qp_state = IBV_QPS_RTS;
  rts.timeout = options.timeout;
  rts.retry_cnt = options.retry_cnt;
  rts.rnr_retry = options.rnr_retry;
  rts.sq_psn = own_psn;
  rts.max_rd_atomic = options.max_rd_atomic;
  steps.rts_mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                   IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
  return steps;
}

}  // namespace detail

}  // namespace ibev
