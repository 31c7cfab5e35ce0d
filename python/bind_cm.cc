// The module's CM room (python/bindings.h lists the rooms): CmEventChannel,
// CmId (made by Python, or lent to a make_qp(id, attempt)) with the CmEvent
// its handler hears, as cm/cm_id.h's, and the sessions, CmSession (the
// active side) and CmAcceptor (the passive side), whose semantics are
// cm/cm_session.h's.
#include "objects.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <functional>
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

// A CM id as Python holds it: its own (CmId(...), a CONNECT_REQUEST's new
// id, an id its handler hears of while Python keeps it), or lent for one
// call (a make_qp's, or a handler's for an id Python does not hold), after
// which it raises OSError(ENODEV): the lent id is the session's (or
// librdmacm's), and Python may keep the object. An own id keeps the C++ id
// alive and is dropped without the GIL (closing it waits for its handler).
struct PyCmId {
  struct Ref {
    CmId* id = nullptr;
    // Which C++ id it stands for, kept after a lent id's call ends (id is
    // then null), so its equality and hash never change while Python holds it.
    const CmId* key = nullptr;
    void lend(CmId* lent) { id = lent, key = lent; }
  };
  std::shared_ptr<Ref> ref = std::make_shared<Ref>();
  std::shared_ptr<CmId> owned;  // null for a lent id

  PyCmId() = default;
  explicit PyCmId(std::shared_ptr<CmId> id) : owned(std::move(id)) { ref->lend(owned.get()); }
  PyCmId(const PyCmId&) = default;
  PyCmId& operator=(const PyCmId&) = delete;
  // Under the GIL (pybind11's dealloc, or a handler's frame).
  ~PyCmId() {
    if (!owned) return;
    std::shared_ptr<CmId> ending = std::move(owned);
    without_gil([&] { ending.reset(); });
  }
  CmId& get(const char* verb) const {
    if (ref->id == nullptr) {
      throw_system_error(std::string(verb) + ": the CmId was lent for one call, which is over",
                         ENODEV);
    }
    return *ref->id;
  }
  // One of the id's calls, made without the GIL: close() and reroute() wait
  // for a handler in progress, which may be waiting for the GIL.
  template <typename Call>
  auto call(const char* verb, Call&& call) const {
    CmId& id = get(verb);
    return without_gil([&] { return call(id); });
  }
};

// A lent PyCmId's end of lending, however the call leaves.
struct Lending {
  PyCmId& id;
  ~Lending() { id.ref->id = nullptr; }
};

// One CM event as a Python handler is given it: copied values, and the id
// as a Python CmId.
struct PyCmEvent {
  int code = 0;
  int status = 0;
  py::object id;
  py::bytes private_data;
  std::uint32_t peer_qp_num = 0;
};

// The ids a Python CM handler hears of that Python holds (the one it was
// made for, and the CONNECT_REQUESTs' new ids), so that an event's id is
// that id, not a lent one. Read and changed under the GIL.
struct KnownIds {
  std::vector<std::weak_ptr<CmId>> ids;
  void add(const std::shared_ptr<CmId>& id) {
    ids.erase(std::remove_if(ids.begin(), ids.end(), [](const auto& w) { return w.expired(); }),
              ids.end());
    ids.push_back(id);
  }
  std::shared_ptr<CmId> find(const CmId* id) const {
    for (const auto& known : ids) {
      if (auto held = known.lock(); held.get() == id) return held;
    }
    return nullptr;
  }
};

// A Python handler(CmEvent) as a CmHandler: called with the GIL taken, on
// the dispatching thread or the executor's; what it raises is a failure
// record (Callable). For CONNECT_REQUEST the event's id is the new id (keep
// it, or the request is rejected, as in C++).
CmHandler cm_handler(py::object handler, std::shared_ptr<KnownIds> known) {
  Callable call(std::move(handler), "a CM handler");
  return [call, known](const CmEvent& event) {
    require_python_running();
    py::gil_scoped_acquire gil;
    PyCmId lent;
    Lending lending{lent};
    PyCmEvent e;
    e.code = event.code;
    e.status = event.status;
    e.private_data = py::bytes(reinterpret_cast<const char*>(event.private_data.data()),
                               event.private_data.size());
    e.peer_qp_num = event.connection.qp_num;
    if (event.new_id) {
      known->add(event.new_id);
      e.id = py::cast(PyCmId(event.new_id));
    } else if (auto held = known->find(event.id)) {
      e.id = py::cast(PyCmId(std::move(held)));
    } else {
      lent.ref->lend(event.id);
      e.id = py::cast(lent);
    }
    call(std::move(e));
  };
}

std::shared_ptr<KnownIds> known_ids() { return std::make_shared<KnownIds>(); }

std::uint8_t byte_of(int value, const char* what) {
  if (value < 0 || value > 255) {
    throw py::value_error(std::string(what) + " is 0 to 255, not " + std::to_string(value));
  }
  return static_cast<std::uint8_t>(value);
}

// A Python make_qp(id, attempt) -> QueuePair as a MakeQp: run with the GIL
// taken; what it raises (or a result that is no QueuePair) fails the attempt.
MakeQp make_qp_of(py::object function) {
  if (!PyCallable_Check(function.ptr())) throw py::type_error("make_qp must be callable");
  Kept kept(std::move(function));
  return [kept](CmId& id, const RecoveryAttempt& attempt) -> std::shared_ptr<QueuePair> {
    require_python_running();
    py::gil_scoped_acquire gil;
    PyCmId handed;
    handed.ref->lend(&id);
    Lending lending{handed};
    try {
      py::object qp = kept.get()(handed, attempt);
      if (!py::isinstance<PyQueuePair>(qp)) {
        throw std::runtime_error("make_qp returned " +
                                 py::str(py::type::of(qp).attr("__name__")).cast<std::string>() +
                                 ", not a QueuePair");
      }
      return qp.cast<PyQueuePair&>().ref();
    } catch (py::error_already_set& raised) {
      throw described(raised);
    }
  };
}

std::vector<std::uint8_t> bytes_of(const py::bytes& data) {
  const std::string text = data;
  return {text.begin(), text.end()};
}

// connect()'s and accept()'s keywords as CmConnectOptions (unset depths:
// the device's maximum); ValueError for a count that is not a byte.
CmConnectOptions connect_options(const py::bytes& private_data,
                                 std::optional<int> responder_resources,
                                 std::optional<int> initiator_depth, int retry_count,
                                 int rnr_retry_count) {
  CmConnectOptions o;
  o.private_data = bytes_of(private_data);
  if (responder_resources) {
    o.responder_resources = byte_of(*responder_resources, "responder_resources");
  }
  if (initiator_depth) o.initiator_depth = byte_of(*initiator_depth, "initiator_depth");
  o.retry_count = byte_of(retry_count, "retry_count");
  o.rnr_retry_count = byte_of(rnr_retry_count, "rnr_retry_count");
  return o;
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

  for (const CmEventTypeInfo& info : kCmEventTypes) {
    m.attr(std::string(info.enumerator).c_str()) = static_cast<int>(info.type);
  }

  py::class_<PyCmEvent>(m, "CmEvent",
                        "One CM event, as a CmId's handler is given it: values copied before "
                        "the event was acked.")
      .def_property_readonly(
          "type", [](const PyCmEvent& e) { return describe_cm_event_code(e.code); },
          "Its name, as rdma_event_str() spells it ('RDMA_CM_EVENT_ESTABLISHED').")
      .def_readonly("code", &PyCmEvent::code,
                    "Its rdma_cm_event_type (ibev.RDMA_CM_EVENT_ESTABLISHED, ...).")
      .def_readonly("status", &PyCmEvent::status,
                    "0, a negative errno (ADDR_ERROR, UNREACHABLE, CONNECT_ERROR, ...) or for "
                    "REJECTED the CM's reject reason (28: the consumer rejected).")
      .def_readonly("id", &PyCmEvent::id,
                    "The CmId it concerns; for CONNECT_REQUEST the new id, which hears the "
                    "listener's handler from now on: keep it and accept() or reject() it "
                    "(dropped, the request is rejected).")
      .def_readonly("private_data", &PyCmEvent::private_data,
                    "The peer's private data (bytes; the CM may pad it with zeros).")
      .def_readonly("peer_qp_num", &PyCmEvent::peer_qp_num,
                    "The peer's QP number (CONNECT_REQUEST, ESTABLISHED on the active side), "
                    "else 0.")
      .def(
          "__repr__",
          [](const PyCmEvent& e) {
            return "<CmEvent " + describe_cm_event_code(e.code) + " status " +
                   std::to_string(e.status) + ">";
          },
          "The type and status.");

  py::class_<PyCmId>(
      m, "CmId",
      "An rdma_cm id with its handler, as cm/cm_id.h's: CmId(channel, handler, executor=None) "
      "makes one (rdma_create_id, RDMA_PS_TCP); handler(CmEvent) runs on the channel's "
      "dispatching thread (or the WorkerThread given as executor), with the GIL taken, and what "
      "it raises is a failure record. Its calls raise OSError naming the librdmacm call and "
      "errno (ENODEV once closed), ValueError for bad input. close() (or the object's end, "
      "without the GIL) stops the handler and destroys the id; its QP is let go. A handler that "
      "refers to its id makes a cycle Python's collector cannot see through C++: close it. The "
      "id make_qp(id, attempt) is handed is lent: its session's, valid during that call only "
      "(then OSError ENODEV), and close() refuses it.")
      .def(py::init([](const PyCmEventChannel& channel, py::object handler,
                       const PyWorkerThread* executor) {
             auto known = known_ids();
             CmId::Options o;
             if (executor != nullptr) o.executor = executor->executor();
             CmHandler h = cm_handler(std::move(handler), known);
             auto id = without_gil(
                 [&] { return CmId::create(channel.ref(), std::move(h), std::move(o)); });
             known->add(id);
             return PyCmId(std::move(id));
           }),
           "channel"_a, "handler"_a, "executor"_a = nullptr)
      .def(
          "resolve_addr",
          [](const PyCmId& id, const std::string& host, int port, double timeout,
             std::optional<std::string> source) {
            const CmAddress destination = CmAddress::parse(host, port_of(port));
            std::optional<CmAddress> from;
            if (source) from = CmAddress::parse(*source, 0);
            const auto ms = seconds(timeout);
            id.call("rdma_resolve_addr", [&](CmId& i) {
              i.resolve_addr(from ? &*from : nullptr, destination, ms);
            });
          },
          "host"_a, "port"_a, "timeout"_a = 2.0, "source"_a = py::none(),
          "rdma_resolve_addr to host:port (numeric; source: the local address to use): "
          "ADDR_RESOLVED (or ADDR_ERROR) follows. ValueError for a bad address or timeout.")
      .def(
          "resolve_route",
          [](const PyCmId& id, double timeout) {
            const auto ms = seconds(timeout);
            id.call("rdma_resolve_route", [&](CmId& i) { i.resolve_route(ms); });
          },
          "timeout"_a = 2.0, "rdma_resolve_route: ROUTE_RESOLVED (or ROUTE_ERROR) follows.")
      .def(
          "listen",
          [](const PyCmId& id, const std::string& host, int port, int backlog) {
            const CmAddress address = CmAddress::parse(host, port_of(port));
            id.call("rdma_bind_addr", [&](CmId& i) { i.listen(address, backlog); });
          },
          "host"_a, "port"_a, "backlog"_a = 64,
          "rdma_bind_addr on host:port (port 0: any; local_port tells), then rdma_listen: "
          "CONNECT_REQUESTs follow, each with its new id (CmEvent.id).")
      .def(
          "init_qp",
          [](const PyCmId& id, PyQueuePair& qp) {
            open_object(qp, "CmId.init_qp: the QueuePair");
            id.call("rdma_init_qp_attr", [&](CmId& i) { i.init_qp(*qp); });
          },
          "qp"_a,
          "RESET -> INIT with the CM's attributes: post receives after it, before connect() or "
          "accept() (or returning the QP from make_qp). Raises OSError naming the verb and "
          "errno.")
      .def(
          "connect",
          [](const PyCmId& id, PyQueuePair& qp, py::bytes private_data,
             std::optional<int> responder_resources, std::optional<int> initiator_depth,
             int retry_count, int rnr_retry_count) {
            open_object(qp, "rdma_connect: the QueuePair");
            const CmConnectOptions o = connect_options(private_data, responder_resources,
                                                       initiator_depth, retry_count,
                                                       rnr_retry_count);
            id.call("rdma_connect", [&](CmId& i) { i.connect(qp.ref(), o); });
          },
          "qp"_a, py::kw_only(), "private_data"_a = py::bytes(),
          "responder_resources"_a = py::none(), "initiator_depth"_a = py::none(),
          "retry_count"_a = 7, "rnr_retry_count"_a = 7,
          "Sends the connection request for qp (an RC QueuePair on device_name, taken to INIT "
          "if it is not): ESTABLISHED (the QP in RTS), REJECTED, UNREACHABLE or CONNECT_ERROR "
          "follows. private_data: 56 bytes at most; depths unset: the device's maximum; "
          "rnr_retry_count 7: for ever.")
      .def(
          "accept",
          [](const PyCmId& id, PyQueuePair& qp, py::bytes private_data,
             std::optional<int> responder_resources, std::optional<int> initiator_depth,
             int retry_count, int rnr_retry_count) {
            open_object(qp, "rdma_accept: the QueuePair");
            const CmConnectOptions o = connect_options(private_data, responder_resources,
                                                       initiator_depth, retry_count,
                                                       rnr_retry_count);
            id.call("rdma_accept", [&](CmId& i) { i.accept(qp.ref(), o); });
          },
          "qp"_a, py::kw_only(), "private_data"_a = py::bytes(),
          "responder_resources"_a = py::none(), "initiator_depth"_a = py::none(),
          "retry_count"_a = 7, "rnr_retry_count"_a = 7,
          "On a CONNECT_REQUEST's new id: takes qp to RTS and replies (private_data: 196 bytes "
          "at most); ESTABLISHED follows when the peer's RTU comes.")
      .def(
          "reject",
          [](const PyCmId& id, py::bytes private_data) {
            const std::vector<std::uint8_t> data = bytes_of(private_data);
            id.call("rdma_reject", [&](CmId& i) { i.reject(data); });
          },
          "private_data"_a = py::bytes(),
          "On a CONNECT_REQUEST's new id: the peer hears REJECTED with private_data.")
      .def(
          "disconnect",
          [](const PyCmId& id) { id.call("rdma_disconnect", [](CmId& i) { i.disconnect(); }); },
          "Moves the QP to ERR and sends the DREQ: the peer hears DISCONNECTED and should "
          "disconnect() too (its DREP), then this side hears DISCONNECTED.")
      .def(
          "reroute",
          [](const PyCmId& id, py::object handler, const PyWorkerThread* executor) {
            auto known = known_ids();
            if (id.owned) known->add(id.owned);
            Executor e;
            if (executor != nullptr) e = executor->executor();
            CmHandler h = cm_handler(std::move(handler), known);
            id.call("CmId::reroute", [&](CmId& i) { i.reroute(std::move(h), std::move(e)); });
          },
          "handler"_a, "executor"_a = nullptr,
          "The id's events go to handler (on executor; None: the dispatching thread) from now "
          "on, each to one handler only: a CONNECT_REQUEST's new id given a handler of its own. "
          "Waits (without the GIL) for the old handler as close() does.")
      .def_property_readonly(
          "device_name", [](const PyCmId& id) { return id.get("CmId.device_name").device_name(); },
          "The RDMA device the id is bound to ('rxe0'; '' before): make the QP there.")
      .def_property_readonly(
          "port_num", [](const PyCmId& id) { return id.get("CmId.port_num").port_num(); },
          "The device's port the id is bound to.")
      .def_property_readonly(
          "local_address",
          [](const PyCmId& id) { return id.get("rdma_get_local_addr").local_address().to_string(); },
          "Its local address, as '10.0.0.1:7471' or '[fd00::1]:7471'.")
      .def_property_readonly(
          "local_port",
          [](const PyCmId& id) { return id.get("rdma_get_local_addr").local_address().port(); },
          "Its local port (a listener's on port 0: the one bound).")
      .def_property_readonly(
          "peer_address",
          [](const PyCmId& id) { return id.get("rdma_get_peer_addr").peer_address().to_string(); },
          "The peer's address, as local_address.")
      .def_property_readonly(
          "queue_pair",
          [](const PyCmId& id) {
            return queue_pair_object(id.get("CmId.queue_pair").queue_pair());
          },
          "The QueuePair given to connect() or accept() (None before).")
      .def_property_readonly(
          "closed",
          [](const PyCmId& id) { return id.ref->id == nullptr || id.ref->id->get() == nullptr; },
          "Whether it was closed (a lent id: whether its call is over).")
      .def(
          "close",
          [](PyCmId& id) {
            if (!id.owned) {
              throw py::value_error("CmId.close: a lent id is its session's to close");
            }
            id.call("CmId.close", [](CmId& i) { i.close(); });
          },
          "Stops the handler (waiting for it, without the GIL, unless called from it) and "
          "destroys the id; its QP is let go. Again: nothing.")
      .def(
          "__eq__",
          [](const PyCmId& a, py::object b) {
            return py::isinstance<PyCmId>(b) && a.ref->key != nullptr &&
                   a.ref->key == b.cast<const PyCmId&>().ref->key;
          },
          "Whether both are the same C++ id (an event's id and the CmId made).")
      .def(
          "__hash__", [](const PyCmId& id) { return std::hash<const void*>()(id.ref->key); },
          "The C++ id's.")
      .def(
          "__enter__", [](py::object self) { return self; }, "Returns itself.")
      .def(
          "__exit__",
          [](PyCmId& id, py::args) {
            if (id.owned) id.call("CmId.close", [](CmId& i) { i.close(); });
          },
          "close().");

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
                    require_python_running();
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
