// The module's health room (python/bindings.h lists the rooms): a
// connection's one health signal, ConnectionHealth, with its HealthOptions,
// the HealthChange its handler hears (HealthCause) and a recovery's
// RecoveryAttempt. The semantics are verbs/connection_health.h's; durations
// are seconds, states and sources the strings health/health.h spells.
#include "objects.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ibev/health/health.h>
#include <ibev/health/recovery.h>
#include <ibev/verbs/connection_health.h>

using namespace pybind11::literals;

namespace ibev::python {
namespace {

using Recovery = ConnectionHealth::Options::Recovery;

ConnectionState state_named(const std::string& name) {
  for (auto state : {ConnectionState::kUp, ConnectionState::kDown}) {
    if (to_string(state) == name) return state;
  }
  throw py::value_error("initial is 'up' or 'down', not '" + name + "'");
}

Recovery::Mode mode_named(const std::string& name) {
  if (name == "reset in place") return Recovery::Mode::kResetInPlace;
  if (name == "reconnect") return Recovery::Mode::kReconnect;
  throw py::value_error("mode is 'reset in place' or 'reconnect', not '" + name + "'");
}

std::string describe(const HealthCause& cause) {
  return std::string(to_string(cause.source)) + (cause.what.empty() ? "" : ": " + cause.what);
}

}  // namespace

HealthHandler health_handler(py::object on_change) {
  Callable call(std::move(on_change), "on_change");
  return [call](const HealthChange& change) { call(change); };
}

void bind_health(py::module_& m) {
  py::class_<HealthCause>(m, "HealthCause",
                          "Why a connection went down: source ('completion', 'async event', "
                          "'CM event', 'keepalive', 'deadline', 'application', 'recovery'), "
                          "code (an ibv_wc_status, ibv_event_type or rdma_cm_event_type, by "
                          "source), wr_id (a completion's or a deadline's request) and what "
                          "(for people: 'IBV_EVENT_QP_FATAL').")
      .def_property_readonly(
          "source", [](const HealthCause& c) { return std::string(to_string(c.source)); },
          "Where the cause was heard.")
      .def_readonly("code", &HealthCause::code, "The event code or status, read by source.")
      .def_readonly("wr_id", &HealthCause::wr_id, "The work request a completion or deadline names.")
      .def_readonly("what", &HealthCause::what, "The cause in words.")
      .def("__repr__",
           [](const HealthCause& c) { return "<ibev.HealthCause " + describe(c) + ">"; });

  py::class_<HealthChange>(m, "HealthChange",
                           "One transition of a connection's health: previous and state ('up', "
                           "'down', 'recovering', 'failed') and the cause that made it (to "
                           "recovering or up: the outage's first cause).")
      .def_property_readonly(
          "previous", [](const HealthChange& c) { return std::string(to_string(c.from)); },
          "The state before.")
      .def_property_readonly(
          "state", [](const HealthChange& c) { return std::string(to_string(c.to)); },
          "The state now.")
      .def_readonly("cause", &HealthChange::cause, "The HealthCause of the change.")
      .def("__repr__", [](const HealthChange& c) {
        return "<ibev.HealthChange " + std::string(to_string(c.from)) + " -> " +
               std::string(to_string(c.to)) + " (" + describe(c.cause) + ")>";
      });

  py::class_<RecoveryAttempt>(
      m, "RecoveryAttempt",
      "One attempt to bring a connection back, handed to a ConnectionHealth's reconnect(attempt) "
      "(on the handler's thread). In place, its QP is drained and in RESET with a fresh PSN: tell "
      "the peer local, learn its endpoint, post receives, then connect(remote). With mode "
      "'reconnect', bring a new connected QP with replace(qp). An attempt dropped without "
      "connect(), replace() or fail() failed ('abandoned'); the next follows, farther apart.")
      .def_property_readonly("number", &RecoveryAttempt::number, "1 for an outage's first attempt.")
      .def_property_readonly("step", &RecoveryAttempt::step,
                             "The recovery's step it was made at: a later attempt's is larger.")
      .def_property_readonly("cause", &RecoveryAttempt::cause, "What the outage began with.")
      .def_property_readonly("undelivered", &RecoveryAttempt::undelivered,
                             "wr_ids posted through ConnectionHealth.post_send() and not "
                             "delivered, in posting order: the application's to send again.")
      .def_property_readonly("local", &RecoveryAttempt::local,
                             "In place: this QP's RcEndpoint as the peer must now see it.")
      .def_property_readonly(
          "queue_pair", [](const RecoveryAttempt& a) { return queue_pair_object(a.queue_pair()); },
          "In place: the QP, in RESET. With 'reconnect': the QP being replaced (None at first).")
      .def_property_readonly("current", &RecoveryAttempt::current,
                             "Not settled, and the recovery still on it.")
      .def(
          "connect",
          [](const RecoveryAttempt& a, const RcEndpoint& remote) {
            without_gil([&] { a.connect(remote); });
          },
          "remote"_a,
          "Takes the QP to RTS against remote: the connection is up. Raises OSError: the verb's "
          "errno (the attempt failed, the next is scheduled), ECANCELED (the recovery ended: "
          "failed, gave up, closed) or EALREADY (this attempt was settled).")
      .def(
          "fail", [](const RecoveryAttempt& a, const std::string& why) { a.fail(why); }, "why"_a,
          "The attempt failed, why: the next is scheduled. OSError(EALREADY) once settled.")
      .def(
          "replace",
          [](const RecoveryAttempt& a, const PyQueuePair& qp) {
            std::shared_ptr<QueuePair> ref = qp.ref();
            without_gil([&] { a.replace(std::move(ref)); });
          },
          "qp"_a,
          "Mode 'reconnect': the connection is up again on qp, a new RC QP in RTS, connected. "
          "Raises ValueError (in place; a closed or unusable QP), OSError ECANCELED or EALREADY; "
          "any raise fails the attempt.");

  py::class_<PyHealthOptions>(
      m, "HealthOptions",
      "What a ConnectionHealth (or CmSession, CmAcceptor) is made with, durations in seconds: "
      "port (whose PORT_ERR is a cause; None: the QP's), initial ('up' or 'down'), executor (a "
      "WorkerThread the handler runs on; None: the dispatching thread; keep it open while used, "
      "a closed one drops the calls), keepalive (a probe's interval; 0: none) and misses, "
      "deadline (a post_send() request's; 0: none), and the recovery's mode ('reset in place' "
      "or 'reconnect'), backoff (first_delay, max_delay, jitter), damping (max_recoveries "
      "within window), give_up_after, and the port and gid_index an in-place attempt connects "
      "with (connect_port). Raises ValueError for what ConnectionHealth refuses, naming it.")
      .def(py::init([](std::optional<int> port, const std::string& initial,
                       const PyWorkerThread* executor, double keepalive, unsigned misses,
                       double deadline, const std::string& mode, double first_delay,
                       double max_delay, double jitter, unsigned max_recoveries, double window,
                       double give_up_after, int connect_port, int gid_index) {
             PyHealthOptions made;
             ConnectionHealth::Options& o = made.options;
             if (port) {
               if (*port < 1 || *port > 255) {
                 throw py::value_error("HealthOptions: port " + std::to_string(*port));
               }
               o.port = static_cast<std::uint8_t>(*port);
             }
             if (connect_port < 1 || connect_port > 255) {
               throw py::value_error("HealthOptions: connect_port " +
                                     std::to_string(connect_port));
             }
             o.initial = state_named(initial);
             if (executor != nullptr) o.executor = executor->executor();
             o.keepalive.interval = seconds(keepalive, "keepalive");
             o.keepalive.misses = misses;
             o.deadline = seconds(deadline, "deadline");
             o.recovery.mode = mode_named(mode);
             o.recovery.policy.first_delay = seconds(first_delay, "first_delay");
             o.recovery.policy.max_delay = seconds(max_delay, "max_delay");
             o.recovery.policy.jitter = jitter;
             o.recovery.policy.max_recoveries = max_recoveries;
             o.recovery.policy.window = seconds(window, "window");
             o.recovery.policy.give_up_after = seconds(give_up_after, "give_up_after");
             o.recovery.connect.port = static_cast<std::uint8_t>(connect_port);
             o.recovery.connect.gid_index = gid_index;
             ConnectionHealth::validate("HealthOptions", o);
             return made;
           }),
           py::kw_only(), "port"_a = py::none(), "initial"_a = "up", "executor"_a = nullptr,
           "keepalive"_a = 0.0, "misses"_a = 3, "deadline"_a = 0.0, "mode"_a = "reset in place",
           "first_delay"_a = 0.1, "max_delay"_a = 5.0, "jitter"_a = 0.5, "max_recoveries"_a = 3,
           "window"_a = 3.0, "give_up_after"_a = 60.0, "connect_port"_a = 1, "gid_index"_a = 0);

  py::class_<Shared<ConnectionHealth>>(
      m, "ConnectionHealth",
      "One health signal for an RC connection (a QP and its peer): on_change(HealthChange) runs "
      "once per transition (up, down, recovering, failed), on the dispatching thread (or the "
      "options' WorkerThread), one call at a time, with the GIL taken; what it raises is a "
      "failure record. It hears the QP's fatal events, PORT_ERR on its port, DEVICE_FATAL, the "
      "completions given to completion(), the keepalive and deadlines. With reconnect, "
      "reconnect(RecoveryAttempt) runs on the same thread after the change to recovering, once "
      "per attempt (verbs/connection_health.h). close() (or with, or the object's end) stops "
      "both, waiting for a running call unless it is that call's thread.")
      .def(py::init([](const PyQueuePair& qp, py::object on_change,
                       std::optional<PyHealthOptions> options, py::object reconnect) {
             ConnectionHealth::Options o = options ? options->options : ConnectionHealth::Options{};
             if (!reconnect.is_none()) {
               Callable call(std::move(reconnect), "reconnect");
               o.recovery.reconnect = [call](const RecoveryAttempt& attempt) { call(attempt); };
             }
             HealthHandler handler = health_handler(std::move(on_change));
             std::shared_ptr<QueuePair> ref = qp.ref();
             return std::make_unique<Shared<ConnectionHealth>>(without_gil([&] {
               return ConnectionHealth::create(std::move(ref), std::move(handler), std::move(o));
             }));
           }),
           "qp"_a, "on_change"_a, "options"_a = py::none(), "reconnect"_a = py::none(),
           "Watches qp (an RC QP, connected unless options.initial is 'down'). Raises TypeError "
           "(a handler that is not callable), ValueError (a closed or non-RC QP, a port beyond "
           "the device's, options refused) or OSError (ibv_query_qp, ibv_query_port, timers).")
      .def_property_readonly(
          "state",
          [](const Shared<ConnectionHealth>& h) { return std::string(to_string((*h).state())); },
          "'up', 'down', 'recovering' or 'failed'.")
      .def(
          "causes", [](const Shared<ConnectionHealth>& h) { return (*h).causes(); },
          "The HealthCauses heard since the connection was last up, first first.")
      .def_property_readonly(
          "keepalive_stats",
          [](const Shared<ConnectionHealth>& h) {
            const KeepaliveStats stats = (*h).keepalive_stats();
            return py::make_tuple(stats.sent, stats.answered);
          },
          "(probes sent, probes answered in time).")
      .def_property_readonly(
          "queue_pair",
          [](const Shared<ConnectionHealth>& h) { return queue_pair_object((*h).queue_pair()); },
          "The QueuePair it runs on now (with 'reconnect', the latest; None before the first).")
      .def(
          "completion",
          [](Shared<ConnectionHealth>& h, const WorkCompletion& wc) {
            ibv_wc raw{};
            raw.wr_id = wc.wr_id;
            raw.status = static_cast<ibv_wc_status>(wc.status);
            raw.opcode = static_cast<ibv_wc_opcode>(wc.opcode);
            raw.byte_len = wc.byte_len;
            raw.qp_num = wc.qp_num;
            (*h).completion(raw);
          },
          "wc"_a,
          "Tells it a WorkCompletion polled from the QP's CQs: a non-flush error is a cause. With "
          "deadlines or recovery, give it every one.")
      .def(
          "post_send",
          [](Shared<ConnectionHealth>& h, const PyMemoryRegion& mr, std::size_t offset,
             std::size_t length, std::uint64_t wr_id, bool signaled) {
            post_send_of(mr, offset, length, wr_id, signaled,
                         [&](ibv_send_wr& wr) { (*h).post_send(wr); });
          },
          "mr"_a, "offset"_a, "length"_a, "wr_id"_a = 0, "signaled"_a = true,
          "QueuePair.post_send on the connection's QP, the request tracked for its deadline "
          "and, if not delivered, for a RecoveryAttempt's undelivered. Raises what post_send "
          "raises, and OSError(ENOTCONN) with recovery while not up (nothing posted).")
      .def(
          "cause",
          [](Shared<ConnectionHealth>& h, const std::string& what, int code) {
            (*h).cause(HealthCause{HealthSource::kApplication, code, 0, what});
          },
          "what"_a, "code"_a = 0,
          "A cause of the application's own (source 'application'): an up connection goes down.")
      .def(
          "retry_now", [](Shared<ConnectionHealth>& h) { (*h).retry_now(); },
          "With recovery: the way to the peer is back; an attempt waited for starts now, one in "
          "progress fails and the next starts at once.")
      .def(
          "recovering", [](Shared<ConnectionHealth>& h) { (*h).recovering(); },
          "down -> recovering (the application's own recovery).")
      .def(
          "up", [](Shared<ConnectionHealth>& h) { (*h).up(); },
          "down or recovering -> up, the causes cleared.")
      .def(
          "fail",
          [](Shared<ConnectionHealth>& h, const std::string& what) {
            (*h).fail(HealthCause{HealthSource::kApplication, 0, 0, what});
          },
          "what"_a, "Any state -> failed, for good, what saying why.")
      .def("close", &Shared<ConnectionHealth>::close,
           "Stops the handler and the recovery (waiting, without the GIL, for a running call "
           "unless on its thread); nothing is heard after. Again: nothing.")
      .def(
          "__enter__", [](py::object self) { return self; }, "Returns itself.")
      .def(
          "__exit__", [](Shared<ConnectionHealth>& h, py::args) { h.close(); }, "close().");
}

}  // namespace ibev::python
