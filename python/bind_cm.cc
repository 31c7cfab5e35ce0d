// The module's CM room (python/bindings.h lists the rooms): CmEventChannel,
// the CmId a make_qp(id, attempt) is handed, and the sessions, CmSession
// (the active side) and CmAcceptor (the passive side), whose semantics are
// cm/cm_session.h's.
#include "objects.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ibev/cm/cm_id.h>
#include <ibev/cm/cm_session.h>

using namespace pybind11::literals;

namespace ibev::python {
namespace {

// Its end waits for the dispatching thread (which may run a handler waiting
// for the GIL): dropped without the GIL, as every Shared is.
struct PyCmEventChannel : Shared<CmEventChannel> {
  PyCmEventChannel(std::shared_ptr<CmEventChannel> channel, py::object dispatcher)
      : Shared(std::move(channel)), dispatcher(std::move(dispatcher)) {}
  py::object dispatcher;  // the Python Dispatcher it is served by
};

// The CmId a make_qp is handed: valid only during that call (the id is the
// session's; Python may keep the object, which then raises OSError(ENODEV)).
struct PyCmId {
  struct Ref {
    CmId* id = nullptr;
  };
  std::shared_ptr<Ref> ref = std::make_shared<Ref>();
  CmId& get(const char* verb) const {
    if (ref->id == nullptr) {
      throw_system_error(std::string(verb) + ": the CmId is only valid during make_qp", ENODEV);
    }
    return *ref->id;
  }
};

// A Python make_qp(id, attempt) -> QueuePair as a MakeQp: run with the GIL
// taken; what it raises (or a result that is no QueuePair) fails the attempt.
MakeQp make_qp_of(py::object function) {
  if (!PyCallable_Check(function.ptr())) throw py::type_error("make_qp must be callable");
  Kept kept(std::move(function));
  return [kept](CmId& id, const RecoveryAttempt& attempt) -> std::shared_ptr<QueuePair> {
    if (!Py_IsInitialized() || _Py_IsFinalizing()) {
      throw std::runtime_error("not called: the Python interpreter is finalizing");
    }
    py::gil_scoped_acquire gil;
    PyCmId handed;
    handed.ref->id = &id;
    struct Invalidate {
      PyCmId& id;
      ~Invalidate() { id.ref->id = nullptr; }
    } invalidate{handed};
    try {
      py::object qp = kept.get()(handed, attempt);
      if (!py::isinstance<PyQueuePair>(qp)) {
        throw std::runtime_error("make_qp returned " +
                                 py::str(py::type::of(qp).attr("__name__")).cast<std::string>() +
                                 ", not a QueuePair");
      }
      return qp.cast<PyQueuePair&>().ref();
    } catch (py::error_already_set& raised) {
      throw std::runtime_error(py::str(raised.type().attr("__name__")).cast<std::string>() + ": " +
                               py::str(raised.value()).cast<std::string>());
    }
  };
}

std::vector<std::uint8_t> bytes_of(const py::bytes& data) {
  const std::string text = data;
  return {text.begin(), text.end()};
}

std::uint16_t port_of(int port) {
  if (port < 0 || port > 65535) throw py::value_error("port " + std::to_string(port));
  return static_cast<std::uint16_t>(port);
}

using PyCmSession = Shared<CmSession>;

// A session's health as a ConnectionHealth object that keeps the session.
py::object health_of(const PyCmSession& session) {
  const std::shared_ptr<CmSession>& ref = session.ref();
  return py::cast(std::make_unique<Shared<ConnectionHealth>>(
      std::shared_ptr<ConnectionHealth>(ref, &ref->health())));
}

class PyCmAcceptor : public Shared<CmAcceptor> {
 public:
  using Shared::Shared;
  ~PyCmAcceptor() override { close(); }
};

}  // namespace

void bind_cm(py::module_& m) {
  py::class_<PyCmEventChannel>(m, "CmEventChannel",
                               "An rdma_cm event channel served by a Dispatcher: the CM ids of "
                               "the sessions made on it hear their events on its dispatching "
                               "thread. Raises OSError (rdma_create_event_channel: ENODEV "
                               "without rdma_cm) or ValueError (a closed Dispatcher).")
      .def(py::init([](py::object dispatcher) {
             InUse d = dispatcher_of(dispatcher, "CmEventChannel").use();
             return std::make_unique<PyCmEventChannel>(CmEventChannel::create(*d),
                                                       std::move(dispatcher));
           }),
           "dispatcher"_a)
      .def_property_readonly(
          "dispatcher", [](const PyCmEventChannel& c) { return c.dispatcher; },
          "The Dispatcher it was made on.");

  py::class_<PyCmId>(m, "CmId",
                     "The CM id of one attempt, handed to make_qp(id, attempt), valid only "
                     "during that call (then OSError ENODEV).")
      .def_property_readonly(
          "device_name", [](const PyCmId& id) { return id.get("CmId.device_name").device_name(); },
          "The RDMA device the id is bound to ('rxe0'): make the QP there.")
      .def_property_readonly(
          "port_num", [](const PyCmId& id) { return id.get("CmId.port_num").port_num(); },
          "The device's port the id is bound to.")
      .def(
          "init_qp",
          [](const PyCmId& id, PyQueuePair& qp) {
            open_object(qp, "CmId.init_qp: the QueuePair");
            id.get("CmId.init_qp").init_qp(*qp);
          },
          "qp"_a,
          "RESET -> INIT with the CM's attributes: post receives after it, before returning the "
          "QP. Raises OSError naming the verb and errno.");

  py::class_<PyCmSession>(
      m, "CmSession",
      "One RC connection through the CM that outlives its QPs: its health is one signal from "
      "the first connect to the end, and when it goes down its recovery makes the connection "
      "again on a new id and QP (make_qp), with the backoff, damping and give_up_after of its "
      "HealthOptions. on_change(HealthChange) runs as a ConnectionHealth's handler, make_qp on "
      "the CM's dispatching thread or the health's, with the GIL taken. close() (or the "
      "object's end) closes the health, then the id.")
      .def_static(
          "connect",
          [](const PyCmEventChannel& channel, const std::string& host, int port,
             py::object on_change, py::object make_qp, std::uint64_t id,
             std::optional<PyHealthOptions> options, py::bytes private_data,
             std::optional<std::string> source, double resolve_timeout, double connect_timeout) {
            CmSession::Options o;
            o.id = id;
            o.make_qp = make_qp_of(std::move(make_qp));
            o.connect.private_data = bytes_of(private_data);
            if (options) o.health = options->options;
            if (source) o.source = CmAddress::parse(*source, 0);
            o.resolve_timeout = seconds(resolve_timeout, "resolve_timeout");
            o.connect_timeout = seconds(connect_timeout, "connect_timeout");
            const CmAddress destination = CmAddress::parse(host, port_of(port));
            HealthHandler handler = health_handler(std::move(on_change));
            return std::make_unique<PyCmSession>(without_gil([&] {
              return CmSession::connect(channel.ref(), destination, std::move(handler),
                                        std::move(o));
            }));
          },
          "channel"_a, "host"_a, "port"_a, "on_change"_a, "make_qp"_a, py::kw_only(), "id"_a,
          "options"_a = py::none(), "private_data"_a = py::bytes(), "source"_a = py::none(),
          "resolve_timeout"_a = 2.0, "connect_timeout"_a = 5.0,
          "The active side: connects to host:port (a numeric address), down until ESTABLISHED; "
          "a peer not there yet is retried as a lost one is. id (nonzero) is how the acceptor "
          "knows the session. Raises ValueError (id 0, a bad address or timeout, private data "
          "past 40 bytes, options refused) or TypeError (a callback that is not callable).")
      .def_property_readonly(
          "id", [](const PyCmSession& s) { return (*s).id(); }, "The session's id.")
      .def_property_readonly("health", &health_of,
                             "Its ConnectionHealth (state, causes(), completion(), retry_now()).")
      .def_property_readonly(
          "queue_pair", [](const PyCmSession& s) { return queue_pair_object((*s).queue_pair()); },
          "The QueuePair it runs on now (None before the first).")
      .def("close", &PyCmSession::close,
           "Closes the health (its handler waited for, without the GIL), then disconnects and "
           "closes the id; the QP is let go.")
      .def(
          "__enter__", [](py::object self) { return self; }, "Returns itself.")
      .def(
          "__exit__", [](PyCmSession& s, py::args) { s.close(); }, "close().");

  py::class_<PyCmAcceptor>(
      m, "CmAcceptor",
      "A CM listener whose requests are sessions (CmSession's passive side): a reconnecting "
      "peer is known by its session id and taken as the same session. on_session(CmSession) "
      "and on_change(id, HealthChange) run on the dispatching thread (or the options' "
      "WorkerThread for on_change), with the GIL taken; keep the sessions given, or they are "
      "closed.")
      .def_static(
          "listen",
          [](const PyCmEventChannel& channel, const std::string& host, int port,
             py::object on_session, py::object on_change, py::object make_qp,
             std::optional<PyHealthOptions> options, py::bytes private_data, int backlog,
             double connect_timeout) {
            CmAcceptor::Options o;
            o.make_qp = make_qp_of(std::move(make_qp));
            o.accept.private_data = bytes_of(private_data);
            if (options) o.health = options->options;
            o.backlog = backlog;
            o.connect_timeout = seconds(connect_timeout, "connect_timeout");
            Callable sessions(std::move(on_session), "on_session");
            Callable changes(std::move(on_change), "on_change");
            const CmAddress address = CmAddress::parse(host, port_of(port));
            return std::make_unique<PyCmAcceptor>(without_gil([&] {
              return CmAcceptor::listen(
                  channel.ref(), address,
                  [sessions](const std::shared_ptr<CmSession>& session) {
                    py::gil_scoped_acquire gil;
                    sessions(std::make_unique<PyCmSession>(session));
                  },
                  [changes](std::uint64_t id, const HealthChange& change) { changes(id, change); },
                  std::move(o));
            }));
          },
          "channel"_a, "host"_a, "port"_a, "on_session"_a, "on_change"_a, "make_qp"_a,
          py::kw_only(), "options"_a = py::none(), "private_data"_a = py::bytes(),
          "backlog"_a = 64, "connect_timeout"_a = 5.0,
          "rdma_listen on host:port (port 0: any; local_port tells). Raises ValueError (a bad "
          "address or timeout, options refused), TypeError (a callback that is not callable) "
          "or OSError naming the librdmacm call and errno (rdma_bind_addr: EADDRINUSE).")
      .def_property_readonly(
          "local_port", [](const PyCmAcceptor& a) { return (*a).local_address().port(); },
          "The port it listens on.")
      .def_property_readonly(
          "local_address", [](const PyCmAcceptor& a) { return (*a).local_address().to_string(); },
          "Where it listens, as '10.0.0.1:7471' or '[fd00::1]:7471'.")
      .def_property_readonly(
          "sessions", [](const PyCmAcceptor& a) { return (*a).sessions(); },
          "How many sessions it knows by id (neither failed nor closed).")
      .def("close", &PyCmAcceptor::close,
           "Stops listening (without the GIL); the sessions go on, each its keeper's.")
      .def(
          "__enter__", [](py::object self) { return self; }, "Returns itself.")
      .def(
          "__exit__", [](PyCmAcceptor& a, py::args) { a.close(); }, "close().");
}

}  // namespace ibev::python
