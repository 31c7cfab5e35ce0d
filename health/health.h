// A connection's one health signal (an RC QP with its peer): its states,
// the causes that take it down, and the state machine that turns any number
// of causes into one transition per change. No threads and no fds here:
// verbs/connection_health.h hears the causes and calls the application.
//
// A connection is up, down, recovering or failed. Everything that means
// "this connection is not carrying traffic" is a cause: a non-flush error
// completion, a QP's fatal or error event, path migration failing, its port
// going down, its device dying, and (from those who feed them) CM events, a
// keepalive timeout, a work request past its deadline. The first cause takes
// an up (or recovering) connection down and is the transition's cause; the
// causes that follow while it is down are kept beside it but change nothing,
// so the application hears one transition per change, not one per cause. A
// flush (IBV_WC_WR_FLUSH_ERR) is never a cause: flushes follow the QP's move
// to ERR, they are its consequence.
//
// The transitions (as NVMe-oF's host moves a controller: LIVE, RESETTING,
// CONNECTING, DEAD):
//   up --cause--> down --recovering()--> recovering --up()--> up
//   down --up()--> up;  recovering --cause--> down (the attempt failed)
//   any state but failed --fail()--> failed, for good
//
// Thread-safety: HealthState is a value; one owner serializes its calls
// (ConnectionHealth does, under its lock).
#ifndef IBEV_HEALTH_HEALTH_H_
#define IBEV_HEALTH_HEALTH_H_

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ibev {

enum class ConnectionState : std::uint8_t { kUp, kDown, kRecovering, kFailed };

// Where a cause was heard; `HealthCause::code` is read by it.
enum class HealthSource : std::uint8_t {
  kCompletion,   // an error completion: its ibv_wc_status; wr_id names its request
  kAsyncEvent,   // a QP's, its port's or its device's event: its ibv_event_type
  kCmEvent,      // a CM event: its rdma_cm_event_type
  kKeepalive,    // no keepalive answer within interval x misses
  kDeadline,     // a work request outstanding past its deadline: wr_id names it
  kApplication,  // the application's own reason, in `what`
  kRecovery,     // a recovery attempt failed, or recovery gave up: `what` says why
};

struct HealthCause {
  HealthSource source = HealthSource::kApplication;
  int code = 0;
  std::uint64_t wr_id = 0;
  std::string what;  // for people: "IBV_EVENT_QP_FATAL", "IBV_WC_RETRY_EXC_ERR (wr_id 7)"

  // The causes the connection hears itself. An event code or status that is
  // no cause (COMM_EST, PORT_ACTIVE; a success or a flush) gives nothing.
  static std::optional<HealthCause> of_event(int event_code);
  static std::optional<HealthCause> of_completion(const ibv_wc& wc);
};

struct HealthChange {
  ConnectionState from = ConnectionState::kUp;
  ConnectionState to = ConnectionState::kUp;
  // What made the change: to down or failed, the cause that did; to
  // recovering or up, the first cause of the outage (a default HealthCause
  // when there was none).
  HealthCause cause;
};

// Whether a QP event, port event or device event means the connection does
// not carry traffic: QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR, PATH_MIG_ERR,
// PORT_ERR, DEVICE_FATAL. Codes ibev does not know are not causes.
bool is_down_event(int event_code) noexcept;

std::string_view to_string(ConnectionState state) noexcept;
std::string_view to_string(HealthSource source) noexcept;
std::ostream& operator<<(std::ostream& out, ConnectionState state);

class HealthState {
 public:
  explicit HealthState(ConnectionState initial = ConnectionState::kUp) : state_(initial) {}

  ConnectionState state() const noexcept { return state_; }
  // The causes heard since the connection was last up, first first: the
  // first kMaxCauses of them (a storm while down grows nothing).
  static constexpr std::size_t kMaxCauses = 64;
  const std::vector<HealthCause>& causes() const noexcept { return causes_; }

  // A cause: up or recovering go down (the change is returned); down and
  // failed keep it and stay (nothing is returned).
  std::optional<HealthChange> cause(HealthCause cause);
  // down -> recovering; from any other state nothing.
  std::optional<HealthChange> recovering();
  // down or recovering -> up, the causes cleared; from up or failed nothing.
  std::optional<HealthChange> up();
  // Any state but failed -> failed, for good; `cause` says why (kept last).
  std::optional<HealthChange> fail(HealthCause cause);

 private:
  std::optional<HealthChange> move(ConnectionState to, HealthCause cause);
  HealthCause first_cause() const;

  ConnectionState state_;
  std::vector<HealthCause> causes_;
};

}  // namespace ibev

#endif  // IBEV_HEALTH_HEALTH_H_
