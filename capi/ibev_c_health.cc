// The C API of a connection's health (verbs/connection_health.h): the
// health, its options, the changes and causes C reads, and the recovery
// attempts lent to a reconnect function. The boundary and the helpers are
// capi/ibev_c_internal.h's.
#include <ibev/ibev_c.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ibev/health/health.h>
#include <ibev/health/recovery.h>
#include <ibev/verbs/connection_health.h>
#include "ibev_c_internal.h"

namespace ibev {
namespace detail {
namespace capi {

// Its `what` is the C++ cause's: valid while that is.
ibev_health_cause to_c(const ibev::HealthCause& cause) noexcept {
  return {static_cast<ibev_health_source>(cause.source), cause.code, cause.wr_id,
          cause.what.c_str()};
}

ibev::HealthCause from_c(const ibev_health_cause* cause) {
  ibev::HealthCause result;
  if (cause == nullptr) return result;
  result.source = enum_in_range<ibev::HealthSource>(cause->source, IBEV_HEALTH_RECOVERY,
                                                    "cause->source");
  result.code = cause->code;
  result.wr_id = cause->wr_id;
  if (cause->what != nullptr) result.what = cause->what;
  return result;
}

ibev_health_change to_c(const ibev::HealthChange& change) noexcept {
  return {static_cast<ibev_connection_state>(change.from),
          static_cast<ibev_connection_state>(change.to), to_c(change.cause)};
}

ibev::HealthHandler health_handler(ibev_health_fn handler, void* context) {
  return [handler, context](const ibev::HealthChange& change) {
    const ibev_health_change c = to_c(change);
    handler(&c, context);
  };
}

ibev::ConnectionHealth::Options health_options(const ibev_health_attr& a) {
  ibev::ConnectionHealth::Options options;
  if (a.port != 0) options.port = a.port;
  options.initial = a.initial_down != 0 ? ibev::ConnectionState::kDown : ibev::ConnectionState::kUp;
  if (a.executor != nullptr) options.executor = a.executor->worker.executor();
  options.keepalive.interval = std::chrono::milliseconds(a.keepalive_interval_ms);
  options.keepalive.misses = a.keepalive_misses;
  options.deadline = std::chrono::milliseconds(a.deadline_ms);
  options.recovery.mode = enum_in_range<ibev::RecoveryLadder::Mode>(
      a.mode, IBEV_RECOVERY_RECONNECT, "attr->mode");
  ibev::RecoveryPolicy& policy = options.recovery.policy;
  policy.first_delay = std::chrono::milliseconds(a.policy.first_delay_ms);
  policy.max_delay = std::chrono::milliseconds(a.policy.max_delay_ms);
  policy.jitter = a.policy.jitter;
  policy.max_recoveries = a.policy.max_recoveries;
  policy.window = std::chrono::milliseconds(a.policy.window_ms);
  policy.give_up_after = std::chrono::milliseconds(a.policy.give_up_after_ms);
  options.recovery.connect = connect_options(&a.connect);
  if (a.reconnect != nullptr) {
    options.recovery.reconnect = [reconnect = a.reconnect,
                                  context = a.reconnect_context](const ibev::RecoveryAttempt& r) {
      const ibev_recovery_attempt lent{r};
      reconnect(&lent, context);
    };
  }
  return options;
}

}  // namespace capi
}  // namespace detail
}  // namespace ibev

using namespace ibev::detail::capi;

namespace {

// The C enums mirror the C++ ones value for value (ibev_c.cc's rule).
#define IBEV_C_MIRRORS(c_value, cpp_value) \
  static_assert(static_cast<int>(c_value) == static_cast<int>(cpp_value), #c_value)
IBEV_C_MIRRORS(IBEV_CONNECTION_UP, ibev::ConnectionState::kUp);
IBEV_C_MIRRORS(IBEV_CONNECTION_DOWN, ibev::ConnectionState::kDown);
IBEV_C_MIRRORS(IBEV_CONNECTION_RECOVERING, ibev::ConnectionState::kRecovering);
IBEV_C_MIRRORS(IBEV_CONNECTION_FAILED, ibev::ConnectionState::kFailed);
IBEV_C_MIRRORS(IBEV_HEALTH_COMPLETION, ibev::HealthSource::kCompletion);
IBEV_C_MIRRORS(IBEV_HEALTH_ASYNC_EVENT, ibev::HealthSource::kAsyncEvent);
IBEV_C_MIRRORS(IBEV_HEALTH_CM_EVENT, ibev::HealthSource::kCmEvent);
IBEV_C_MIRRORS(IBEV_HEALTH_KEEPALIVE, ibev::HealthSource::kKeepalive);
IBEV_C_MIRRORS(IBEV_HEALTH_DEADLINE, ibev::HealthSource::kDeadline);
IBEV_C_MIRRORS(IBEV_HEALTH_APPLICATION, ibev::HealthSource::kApplication);
IBEV_C_MIRRORS(IBEV_HEALTH_RECOVERY, ibev::HealthSource::kRecovery);
IBEV_C_MIRRORS(IBEV_RECOVERY_RESET_IN_PLACE, ibev::RecoveryLadder::Mode::kResetInPlace);
IBEV_C_MIRRORS(IBEV_RECOVERY_RECONNECT, ibev::RecoveryLadder::Mode::kReconnect);
#undef IBEV_C_MIRRORS

int to_ms(std::chrono::milliseconds value) { return static_cast<int>(value.count()); }

// The causes ibev_health_causes() last handed this thread: their `what`.
thread_local std::vector<ibev::HealthCause> causes_lent;

}  // namespace

extern "C" {

void ibev_health_attr_init(ibev_health_attr* attr) {
  if (attr == nullptr) return;
  const ibev::ConnectionHealth::Options d;
  *attr = ibev_health_attr{};
  attr->keepalive_interval_ms = to_ms(d.keepalive.interval);
  attr->keepalive_misses = d.keepalive.misses;
  attr->deadline_ms = to_ms(d.deadline);
  attr->mode = static_cast<ibev_recovery_mode>(d.recovery.mode);
  const ibev::RecoveryPolicy& p = d.recovery.policy;
  attr->policy = ibev_recovery_policy{to_ms(p.first_delay), to_ms(p.max_delay), p.jitter,
                                      p.max_recoveries,       to_ms(p.window),
                                      to_ms(p.give_up_after)};
  ibev_connect_attr_init(&attr->connect);
}

ibev_health* ibev_health_create(ibev_qp* qp, const ibev_health_attr* attr,
                                ibev_health_fn on_change, void* context) {
  return make_call("ibev_health_create", [&] {
    ibev_health_attr defaults;
    ibev_health_attr_init(&defaults);
    // The options first: what is wrong with them is said whatever the QP.
    ibev::ConnectionHealth::Options options =
        health_options(attr != nullptr ? *attr : defaults);
    ibev::ConnectionHealth::validate("ConnectionHealth::create", options);
    ibev::HealthHandler handler = health_handler(&require(on_change, "on_change"), context);
    std::shared_ptr<ibev::QueuePair> on = require(qp, "qp").ref;
    return hand_out<ibev_health>(
        ibev::ConnectionHealth::create(std::move(on), std::move(handler), std::move(options)));
  });
}

void ibev_health_destroy(ibev_health* health) {
  if (health == nullptr) return;
  health->ref->close();
  take_back(health);
}

ibev_connection_state ibev_health_state(const ibev_health* health) {
  return api_call(
      "ibev_health_state",
      [&] { return static_cast<ibev_connection_state>(require(health, "health").ref->state()); },
      [](int) { return IBEV_CONNECTION_FAILED; });
}

int ibev_health_causes(const ibev_health* health, ibev_health_cause* causes, size_t capacity,
                       size_t* count) {
  return status_call("ibev_health_causes", [&] {
    size_t& counted = require(count, "count");
    if (capacity > 0 && causes == nullptr) throw std::invalid_argument("causes is NULL");
    causes_lent = require(health, "health").ref->causes();
    counted = causes_lent.size();
    for (size_t i = 0; i < causes_lent.size() && i < capacity; ++i) {
      causes[i] = to_c(causes_lent[i]);
    }
  });
}

int ibev_health_keepalive_stats(const ibev_health* health, uint64_t* sent, uint64_t* answered) {
  return status_call("ibev_health_keepalive_stats", [&] {
    const ibev::KeepaliveStats stats = require(health, "health").ref->keepalive_stats();
    if (sent != nullptr) *sent = stats.sent;
    if (answered != nullptr) *answered = stats.answered;
  });
}

ibv_qp* ibev_health_qp(const ibev_health* health) {
  if (health == nullptr) return nullptr;
  const std::shared_ptr<ibev::QueuePair> qp = health->ref->queue_pair();
  return qp != nullptr ? qp->get() : nullptr;
}

int ibev_health_completion(ibev_health* health, const ibv_wc* wc) {
  return status_call("ibev_health_completion",
                     [&] { require(health, "health").ref->completion(require(wc, "wc")); });
}

int ibev_health_post_send(ibev_health* health, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  return status_call("ibev_health_post_send", [&] {
    require(health, "health").ref->post_send(require(wr, "wr"), bad_wr);
  });
}

int ibev_health_add_cause(ibev_health* health, const ibev_health_cause* cause) {
  return status_call("ibev_health_add_cause", [&] {
    require(health, "health").ref->cause(from_c(&require(cause, "cause")));
  });
}

int ibev_health_retry_now(ibev_health* health) {
  return status_call("ibev_health_retry_now", [&] { require(health, "health").ref->retry_now(); });
}

int ibev_health_recovering(ibev_health* health) {
  return status_call("ibev_health_recovering",
                     [&] { require(health, "health").ref->recovering(); });
}

int ibev_health_up(ibev_health* health) {
  return status_call("ibev_health_up", [&] { require(health, "health").ref->up(); });
}

int ibev_health_fail(ibev_health* health, const ibev_health_cause* cause) {
  return status_call("ibev_health_fail",
                     [&] { require(health, "health").ref->fail(from_c(cause)); });
}

// ------------------------------------------------------- recovery attempts

ibev_recovery_attempt* ibev_recovery_attempt_ref(const ibev_recovery_attempt* attempt) {
  return make_call("ibev_recovery_attempt_ref", [&] {
    return hand_out<ibev_recovery_attempt>(require(attempt, "attempt").attempt);
  });
}

void ibev_recovery_attempt_destroy(ibev_recovery_attempt* attempt) { take_back(attempt); }

unsigned ibev_recovery_attempt_number(const ibev_recovery_attempt* attempt) {
  return attempt != nullptr ? attempt->attempt.number() : 0;
}

int ibev_recovery_attempt_cause(const ibev_recovery_attempt* attempt, ibev_health_cause* cause) {
  return status_call("ibev_recovery_attempt_cause", [&] {
    require(cause, "cause") = to_c(require(attempt, "attempt").attempt.cause());
  });
}

int ibev_recovery_attempt_undelivered(const ibev_recovery_attempt* attempt,
                                      const uint64_t** wr_ids, size_t* count) {
  return status_call("ibev_recovery_attempt_undelivered", [&] {
    const std::vector<std::uint64_t>& undelivered =
        require(attempt, "attempt").attempt.undelivered();
    require(count, "count") = undelivered.size();
    require(wr_ids, "wr_ids") = undelivered.empty() ? nullptr : undelivered.data();
  });
}

int ibev_recovery_attempt_local(const ibev_recovery_attempt* attempt,
                                ibev_rc_endpoint* endpoint) {
  return status_call("ibev_recovery_attempt_local", [&] {
    ibev_rc_endpoint& into = require(endpoint, "endpoint");
    const ibev::RcEndpoint& local = require(attempt, "attempt").attempt.local();
    if (local.qp_num() == 0) {
      throw std::invalid_argument("an attempt that replaces its QP has no local endpoint");
    }
    into = to_c(local);
  });
}

ibv_qp* ibev_recovery_attempt_qp(const ibev_recovery_attempt* attempt) {
  if (attempt == nullptr) return nullptr;
  const std::shared_ptr<ibev::QueuePair>& qp = attempt->attempt.queue_pair();
  return qp != nullptr ? qp->get() : nullptr;
}

int ibev_recovery_attempt_current(const ibev_recovery_attempt* attempt) {
  return api_call(
      "ibev_recovery_attempt_current",
      [&] { return require(attempt, "attempt").attempt.current() ? 1 : 0; },
      [](int) { return 0; });
}

int ibev_recovery_attempt_connect(const ibev_recovery_attempt* attempt,
                                  const ibev_rc_endpoint* remote) {
  return status_call("ibev_recovery_attempt_connect", [&] {
    require(attempt, "attempt").attempt.connect(from_c(require(remote, "remote")));
  });
}

int ibev_recovery_attempt_replace(const ibev_recovery_attempt* attempt, ibev_qp* qp) {
  return status_call("ibev_recovery_attempt_replace", [&] {
    const ibev::RecoveryAttempt& settled = require(attempt, "attempt").attempt;
    settled.replace(require(qp, "qp").ref);
  });
}

int ibev_recovery_attempt_fail(const ibev_recovery_attempt* attempt, const char* why) {
  return status_call("ibev_recovery_attempt_fail", [&] {
    require(attempt, "attempt").attempt.fail(why != nullptr ? why : "");
  });
}

}  // extern "C"
