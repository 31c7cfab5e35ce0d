// The C API of the connection manager (cm/cm_id.h, cm/cm_session.h): the
// event channel, CM ids (the application's own, or one lent to a make_qp
// function), the active session and the acceptor. A session's health is lent as an ibev_health
// (ibev_c_health.cc's functions serve it). The boundary and the helpers are
// capi/ibev_c_internal.h's.
#include <ibev/ibev_c.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <ibev/cm/cm_id.h>
#include <ibev/cm/cm_session.h>
#include <ibev/verbs/connection_health.h>
#include "ibev_c_internal.h"

using namespace ibev::detail::capi;

namespace {

// Each attempt's QP from the C function; a NULL it returns fails the
// attempt with what it left in errno and ibev_last_error().
ibev::MakeQp make_qp(ibev_make_qp_fn make, void* context) {
  if (make == nullptr) throw std::invalid_argument("attr->make_qp is NULL");
  return [make, context](ibev::CmId& id, const ibev::RecoveryAttempt& attempt) {
    ibev_cm_id lent(&id);
    const ibev_recovery_attempt lent_attempt{attempt};
    errno = 0;
    const std::unique_ptr<ibev_qp> made(make(&lent, &lent_attempt, context));
    if (made == nullptr) {
      const int error = errno != 0 ? errno : EIO;
      throw std::system_error(error, std::generic_category(),
                              std::string("make_qp returned NULL (") + ibev_last_error() + ")");
    }
    return made->ref;
  };
}

// `length` bytes at `data`, which `what` names when NULL.
std::vector<std::uint8_t> bytes(const void* data, size_t length,
                                const char* what = "attr->private_data") {
  if (length == 0) return {};
  if (data == nullptr) throw std::invalid_argument(std::string(what) + " is NULL");
  const auto* at = static_cast<const std::uint8_t*>(data);
  return std::vector<std::uint8_t>(at, at + length);
}

ibev::CmAddress address(const char* host, uint16_t port) {
  return ibev::CmAddress::parse(&require(host, "host"), port);
}

// The application's own id, whose events `on_event` hears: a
// CONNECT_REQUEST's new id becomes one too (rerouted to its own C++ handler,
// so each event names its ibev_cm_id), handed to the C handler to keep.
// The handler holds `self` raw: ibev_cm_id_destroy() closes the id (the
// handler stopped) before it frees it.
ibev::CmHandler cm_handler(ibev_cm_id* self, ibev_cm_event_fn on_event, void* context) {
  return [self, on_event, context](const ibev::CmEvent& event) {
    std::unique_ptr<ibev_cm_id> child;
    if (event.new_id != nullptr) {
      child = std::make_unique<ibev_cm_id>(event.new_id.get());
      child->owned = event.new_id;
      child->owned->reroute(cm_handler(child.get(), on_event, context));
    }
    const std::string name = event.name();
    ibev_cm_event c{};
    c.code = event.code;
    c.name = name.c_str();
    c.status = event.status;
    c.id = self;
    c.new_id = child.release();
    c.private_data = event.private_data.empty() ? nullptr : event.private_data.data();
    c.private_data_length = event.private_data.size();
    on_event(&c, context);
  };
}

// The id for a call that changes it: the application's own, never a lent one.
ibev::CmId& own(ibev_cm_id* id) {
  if (require(id, "id").owned == nullptr) {
    throw std::invalid_argument("id is a session's, lent to make_qp");
  }
  return *id->owned;
}

std::uint8_t byte_in_range(int value, const char* what) {
  if (value < 0 || value > 255) {
    throw std::invalid_argument(std::string(what) + " " + std::to_string(value) +
                                " is not in 0..255");
  }
  return static_cast<std::uint8_t>(value);
}

ibev::CmConnectOptions cm_connect_options(const ibev_cm_connect_attr* attr) {
  ibev::CmConnectOptions options;
  if (attr == nullptr) return options;
  options.private_data = bytes(attr->private_data, attr->private_data_length);
  if (attr->responder_resources != -1) {
    options.responder_resources =
        byte_in_range(attr->responder_resources, "attr->responder_resources");
  }
  if (attr->initiator_depth != -1) {
    options.initiator_depth = byte_in_range(attr->initiator_depth, "attr->initiator_depth");
  }
  options.retry_count = attr->retry_count;
  options.rnr_retry_count = attr->rnr_retry_count;
  return options;
}

ibev_cm_session* hand_out_session(std::shared_ptr<ibev::CmSession> session) {
  ibev_health lent;
  lent.ref = std::shared_ptr<ibev::ConnectionHealth>(session, &session->health());
  return hand_out<ibev_cm_session>(std::move(session), std::move(lent));
}

}  // namespace

extern "C" {

ibev_cm_channel* ibev_cm_channel_create(ibev_dispatcher* dispatcher) {
  return make_call("ibev_cm_channel_create", [&] {
    return hand_out<ibev_cm_channel>(
        ibev::CmEventChannel::create(require(dispatcher, "dispatcher").dispatcher));
  });
}

void ibev_cm_channel_destroy(ibev_cm_channel* channel) { take_back(channel); }

const char* ibev_cm_id_device_name(const ibev_cm_id* id) {
  if (id == nullptr) return nullptr;
  return api_call(
      "ibev_cm_id_device_name",
      [&] {
        ibev::detail::MutexLock lock(id->mutex);
        if (id->device_name.empty()) id->device_name = id->id->device_name();
        return id->device_name.c_str();
      },
      [](int) -> const char* { return nullptr; });
}

int ibev_cm_id_init_qp(const ibev_cm_id* id, ibev_qp* qp) {
  return status_call("ibev_cm_id_init_qp",
                     [&] { require(id, "id").id->init_qp(*require(qp, "qp").ref); });
}

ibev_cm_id* ibev_cm_id_create(ibev_cm_channel* channel, ibev_cm_event_fn on_event,
                              void* context) {
  return make_call("ibev_cm_id_create", [&] {
    ibev_cm_event_fn const event_fn = &require(on_event, "on_event");
    auto made = std::make_unique<ibev_cm_id>(nullptr);
    made->owned = ibev::CmId::create(require(channel, "channel").ref,
                                     cm_handler(made.get(), event_fn, context));
    made->id = made->owned.get();
    return made.release();
  });
}

void ibev_cm_id_destroy(ibev_cm_id* id) {
  if (id == nullptr || id->owned == nullptr) return;
  id->owned->close();
  take_back(id);
}

int ibev_cm_id_resolve_addr(ibev_cm_id* id, const char* source_host, const char* host,
                            uint16_t port, int timeout_ms) {
  return status_call("ibev_cm_id_resolve_addr", [&] {
    // Bad input is named whatever the id.
    std::optional<ibev::CmAddress> source;
    if (source_host != nullptr) source = ibev::CmAddress::parse(source_host, 0);
    const ibev::CmAddress destination = address(host, port);
    own(id).resolve_addr(source ? &*source : nullptr, destination,
                         std::chrono::milliseconds(timeout_ms));
  });
}

int ibev_cm_id_resolve_route(ibev_cm_id* id, int timeout_ms) {
  return status_call("ibev_cm_id_resolve_route",
                     [&] { own(id).resolve_route(std::chrono::milliseconds(timeout_ms)); });
}

int ibev_cm_id_listen(ibev_cm_id* id, const char* host, uint16_t port, int backlog) {
  return status_call("ibev_cm_id_listen", [&] {
    const ibev::CmAddress bound = address(host, port);
    own(id).listen(bound, backlog);
  });
}

void ibev_cm_connect_attr_init(ibev_cm_connect_attr* attr) {
  if (attr == nullptr) return;
  const ibev::CmConnectOptions d;
  *attr = ibev_cm_connect_attr{};
  attr->responder_resources = d.responder_resources ? *d.responder_resources : -1;
  attr->initiator_depth = d.initiator_depth ? *d.initiator_depth : -1;
  attr->retry_count = d.retry_count;
  attr->rnr_retry_count = d.rnr_retry_count;
}

int ibev_cm_id_connect(ibev_cm_id* id, ibev_qp* qp, const ibev_cm_connect_attr* attr) {
  return status_call("ibev_cm_id_connect", [&] {
    const ibev::CmConnectOptions options = cm_connect_options(attr);
    ibev::CmId& connecting = own(id);
    connecting.connect(require(qp, "qp").ref, options);
  });
}

int ibev_cm_id_accept(ibev_cm_id* id, ibev_qp* qp, const ibev_cm_connect_attr* attr) {
  return status_call("ibev_cm_id_accept", [&] {
    const ibev::CmConnectOptions options = cm_connect_options(attr);
    ibev::CmId& accepting = own(id);
    accepting.accept(require(qp, "qp").ref, options);
  });
}

int ibev_cm_id_reject(ibev_cm_id* id, const void* data, size_t length) {
  return status_call("ibev_cm_id_reject", [&] {
    std::vector<std::uint8_t> reply = bytes(data, length, "data");  // bad input before the id
    own(id).reject(std::move(reply));
  });
}

int ibev_cm_id_disconnect(ibev_cm_id* id) {
  return status_call("ibev_cm_id_disconnect", [&] { own(id).disconnect(); });
}

int ibev_cm_id_port_num(const ibev_cm_id* id) {
  return api_call(
      "ibev_cm_id_port_num", [&] { return static_cast<int>(require(id, "id").id->port_num()); },
      [](int) { return 0; });
}

int ibev_cm_id_local_address(const ibev_cm_id* id, char* buffer, size_t size, size_t* length) {
  return status_call("ibev_cm_id_local_address", [&] {
    const ibev::CmId& bound = *require(id, "id").id;
    write_text(bound.local_address().to_string(), buffer, size, length);
  });
}

int ibev_cm_id_peer_address(const ibev_cm_id* id, char* buffer, size_t size, size_t* length) {
  return status_call("ibev_cm_id_peer_address", [&] {
    const ibev::CmId& bound = *require(id, "id").id;
    write_text(bound.peer_address().to_string(), buffer, size, length);
  });
}

void ibev_cm_session_attr_init(ibev_cm_session_attr* attr) {
  if (attr == nullptr) return;
  const ibev::CmSession::Options d;
  *attr = ibev_cm_session_attr{};
  ibev_health_attr_init(&attr->health);
  attr->resolve_timeout_ms = static_cast<int>(d.resolve_timeout.count());
  attr->connect_timeout_ms = static_cast<int>(d.connect_timeout.count());
}

ibev_cm_session* ibev_cm_session_connect(ibev_cm_channel* channel, const char* host,
                                         uint16_t port, const ibev_cm_session_attr* attr,
                                         ibev_health_fn on_change, void* context) {
  return make_call("ibev_cm_session_connect", [&] {
    const ibev_cm_session_attr& a = require(attr, "attr");
    ibev::CmSession::Options options;
    options.id = a.id;
    options.make_qp = make_qp(a.make_qp, a.make_qp_context);
    options.connect.private_data = bytes(a.private_data, a.private_data_length);
    options.health = health_options(a.health);
    // What is wrong with the options is said whatever the channel.
    ibev::ConnectionHealth::validate("CmSession::connect", options.health);
    options.resolve_timeout = std::chrono::milliseconds(a.resolve_timeout_ms);
    options.connect_timeout = std::chrono::milliseconds(a.connect_timeout_ms);
    ibev::HealthHandler handler = health_handler(&require(on_change, "on_change"), context);
    return hand_out_session(ibev::CmSession::connect(require(channel, "channel").ref,
                                                     address(host, port), std::move(handler),
                                                     std::move(options)));
  });
}

void ibev_cm_session_destroy(ibev_cm_session* session) {
  if (session == nullptr) return;
  session->session->close();
  take_back(session);
}

uint64_t ibev_cm_session_id(const ibev_cm_session* session) {
  return session != nullptr ? session->session->id() : 0;
}

ibev_health* ibev_cm_session_health(ibev_cm_session* session) {
  return session != nullptr ? &session->health : nullptr;
}

void ibev_cm_acceptor_attr_init(ibev_cm_acceptor_attr* attr) {
  if (attr == nullptr) return;
  const ibev::CmAcceptor::Options d;
  *attr = ibev_cm_acceptor_attr{};
  ibev_health_attr_init(&attr->health);
  attr->backlog = d.backlog;
  attr->connect_timeout_ms = static_cast<int>(d.connect_timeout.count());
}

ibev_cm_acceptor* ibev_cm_acceptor_listen(ibev_cm_channel* channel, const char* host,
                                          uint16_t port, const ibev_cm_acceptor_attr* attr,
                                          ibev_cm_session_fn on_session,
                                          ibev_cm_change_fn on_change, void* context) {
  return make_call("ibev_cm_acceptor_listen", [&] {
    const ibev_cm_acceptor_attr& a = require(attr, "attr");
    ibev::CmAcceptor::Options options;
    options.make_qp = make_qp(a.make_qp, a.make_qp_context);
    options.accept.private_data = bytes(a.private_data, a.private_data_length);
    options.health = health_options(a.health);
    ibev::ConnectionHealth::validate("CmAcceptor::listen", options.health);
    options.backlog = a.backlog;
    options.connect_timeout = std::chrono::milliseconds(a.connect_timeout_ms);
    ibev_cm_session_fn const session_fn = &require(on_session, "on_session");
    ibev_cm_change_fn const change_fn = &require(on_change, "on_change");
    auto sessions = [session_fn, context](const std::shared_ptr<ibev::CmSession>& session) {
      session_fn(hand_out_session(session), context);
    };
    auto changes = [change_fn, context](std::uint64_t id, const ibev::HealthChange& change) {
      const ibev_health_change c = to_c(change);
      change_fn(id, &c, context);
    };
    return hand_out<ibev_cm_acceptor>(ibev::CmAcceptor::listen(
        require(channel, "channel").ref, address(host, port), std::move(sessions),
        std::move(changes), std::move(options)));
  });
}

void ibev_cm_acceptor_destroy(ibev_cm_acceptor* acceptor) {
  if (acceptor == nullptr) return;
  acceptor->ref->close();
  take_back(acceptor);
}

// A listener closed under its acceptor (its device removed) has no address:
// 0 with errno ENODEV, not an exception out of C.
uint16_t ibev_cm_acceptor_port(const ibev_cm_acceptor* acceptor) {
  if (acceptor == nullptr) return 0;
  return api_call(
      "ibev_cm_acceptor_port", [&] { return acceptor->ref->local_address().port(); },
      [](int) -> std::uint16_t { return 0; });
}

size_t ibev_cm_acceptor_sessions(const ibev_cm_acceptor* acceptor) {
  if (acceptor == nullptr) return 0;
  return api_call(
      "ibev_cm_acceptor_sessions", [&] { return acceptor->ref->sessions(); },
      [](int) -> std::size_t { return 0; });
}

}  // extern "C"
