#include <ibev/health/health.h>

#include <ostream>
#include <utility>

#include <ibev/core/event_type.h>

namespace ibev {

bool is_down_event(int event_code) noexcept {
  switch (event_code) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_DEVICE_FATAL:
      return true;
    default:
      return false;
  }
}

std::optional<HealthCause> HealthCause::of_event(int event_code) {
  if (!is_down_event(event_code)) return std::nullopt;
  return HealthCause{HealthSource::kAsyncEvent, event_code, 0, describe_event_code(event_code)};
}

std::optional<HealthCause> HealthCause::of_completion(const ibv_wc& wc) {
  if (wc.status == IBV_WC_SUCCESS || wc.status == IBV_WC_WR_FLUSH_ERR) return std::nullopt;
  return HealthCause{HealthSource::kCompletion, static_cast<int>(wc.status), wc.wr_id,
                     std::string(ibv_wc_status_str(wc.status)) + " (wr_id " +
                         std::to_string(wc.wr_id) + ")"};
}

std::string_view to_string(ConnectionState state) noexcept {
  switch (state) {
    case ConnectionState::kUp:
      return "up";
    case ConnectionState::kDown:
      return "down";
    case ConnectionState::kRecovering:
      return "recovering";
    case ConnectionState::kFailed:
      return "failed";
  }
  return "?";
}

std::string_view to_string(HealthSource source) noexcept {
  switch (source) {
    case HealthSource::kCompletion:
      return "completion";
    case HealthSource::kAsyncEvent:
      return "async event";
    case HealthSource::kCmEvent:
      return "CM event";
    case HealthSource::kKeepalive:
      return "keepalive";
    case HealthSource::kDeadline:
      return "deadline";
    case HealthSource::kApplication:
      return "application";
    case HealthSource::kRecovery:
      return "recovery";
  }
  return "?";
}

std::ostream& operator<<(std::ostream& out, ConnectionState state) {
  return out << to_string(state);
}

std::optional<HealthChange> HealthState::cause(HealthCause cause) {
  if (state_ == ConnectionState::kUp || state_ == ConnectionState::kRecovering) {
    return move(ConnectionState::kDown, std::move(cause));
  }
  if (causes_.size() < kMaxCauses) causes_.push_back(std::move(cause));
  return std::nullopt;
}

std::optional<HealthChange> HealthState::recovering() {
  if (state_ != ConnectionState::kDown) return std::nullopt;
  HealthChange change{state_, ConnectionState::kRecovering, first_cause()};
  state_ = ConnectionState::kRecovering;
  return change;
}

std::optional<HealthChange> HealthState::up() {
  if (state_ != ConnectionState::kDown && state_ != ConnectionState::kRecovering) {
    return std::nullopt;
  }
  HealthChange change{state_, ConnectionState::kUp, first_cause()};
  causes_.clear();
  state_ = ConnectionState::kUp;
  return change;
}

std::optional<HealthChange> HealthState::fail(HealthCause cause) {
  if (state_ == ConnectionState::kFailed) return std::nullopt;
  return move(ConnectionState::kFailed, std::move(cause));
}

HealthCause HealthState::first_cause() const {
  return causes_.empty() ? HealthCause{} : causes_.front();
}

// The cause is kept, and is the change's.
std::optional<HealthChange> HealthState::move(ConnectionState to, HealthCause cause) {
  HealthChange change{state_, to, cause};
  if (causes_.size() < kMaxCauses) causes_.push_back(std::move(cause));
  state_ = to;
  return change;
}

}  // namespace ibev
