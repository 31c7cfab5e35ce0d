// The C API of sessions through the connection manager (cm/cm_session.h):
// the event channel, the CM id lent to a make_qp function, the active
// session and the acceptor. A session's health is lent as an ibev_health
// (ibev_c_health.cc's functions serve it). The boundary and the helpers are
// capi/ibev_c_internal.h's.
#include <ibev/ibev_c.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <memory>
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
    ibev_cm_id lent{id, id.device_name()};
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

std::vector<std::uint8_t> bytes(const void* data, size_t length) {
  if (length == 0) return {};
  if (data == nullptr) throw std::invalid_argument("attr->private_data is NULL");
  const auto* at = static_cast<const std::uint8_t*>(data);
  return std::vector<std::uint8_t>(at, at + length);
}

ibev::CmAddress address(const char* host, uint16_t port) {
  return ibev::CmAddress::parse(&require(host, "host"), port);
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
  return id != nullptr ? id->device_name.c_str() : nullptr;
}

int ibev_cm_id_init_qp(const ibev_cm_id* id, ibev_qp* qp) {
  return status_call("ibev_cm_id_init_qp",
                     [&] { require(id, "id").id.init_qp(*require(qp, "qp").ref); });
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

uint16_t ibev_cm_acceptor_port(const ibev_cm_acceptor* acceptor) {
  return acceptor != nullptr ? acceptor->ref->local_address().port() : 0;
}

size_t ibev_cm_acceptor_sessions(const ibev_cm_acceptor* acceptor) {
  return acceptor != nullptr ? acceptor->ref->sessions() : 0;
}

}  // extern "C"
