// When a connection that went down tries again, and when it stops trying:
// the arithmetic of supervised recovery, with no threads, no timers and no
// clock of its own (each call is told `now`), so every decision can be
// replayed in a test. verbs/connection_health.h runs it.
//
// An outage begins when the connection goes down and ends when it is up
// again or failed. Within one, attempts are spaced by exponential backoff
// with jitter: the k-th waits min(max_delay, first_delay x 2^(k-1)), less a
// random share of up to `jitter` of it, so that the peers of a switch that
// rebooted do not all come back in the same millisecond. The outage fails
// when it has lasted `give_up_after` (NVMe-oF's ctrl_loss_tmo; the
// connection's port may never come back). Across outages, a damping window
// (as DPDK's mlx5 vDPA driver bounds its queue recovery): a connection that
// goes down again after `max_recoveries` recoveries within `window` is not
// recovered again but failed, so a fault that recurs on every reconnect
// ends in one failure instead of a reconnect storm.
//
// The ladder (RecoveryLadder) is the whole of recovery as one pure machine:
// what happened (went down, an attempt failed, a wait ended, a drain ended,
// the port came back, the way back came, the outage's time ran out) and the
// clock in, one action out (wait, drain, reset, reconnect, abort, fail, or
// nothing), stamped with the ladder's step. The step is the one staleness
// token: every change of the connection's state moves it, and a callback
// (a timer, a drain, the application's attempt) made for an earlier step
// does nothing. verbs/recovery_steps.cc only carries the actions out.
//
// Thread-safety: values; one owner serializes their calls.
#ifndef IBEV_HEALTH_RECOVERY_H_
#define IBEV_HEALTH_RECOVERY_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <random>
#include <string>
#include <string_view>

#include <ibev/health/health.h>

namespace ibev {

struct RecoveryPolicy {
  std::chrono::milliseconds first_delay{100};  // before an outage's first attempt; above 0
  std::chrono::milliseconds max_delay{5000};   // the backoff's cap
  double jitter = 0.5;                         // 0: none; up to 1: a delay may shrink to 0
  unsigned max_recoveries = 3;                 // within `window`, then damped
  std::chrono::milliseconds window{3000};
  std::chrono::milliseconds give_up_after{60000};  // one outage's longest

  // Throws std::invalid_argument naming the field: a first_delay not above 0, a
  // max_delay below first_delay, jitter outside [0, 1], no recoveries, a
  // window or give_up_after not above zero.
  void validate() const;
};

// What to do next: attempt after `delay`, or give up, `why`.
struct RecoveryDecision {
  std::optional<std::chrono::milliseconds> delay;  // none: give up
  std::string why;                                 // set when giving up
};

class RecoverySchedule {
 public:
  using Clock = std::chrono::steady_clock;

  // Throws what RecoveryPolicy::validate throws. `seed` draws the jitter.
  RecoverySchedule(RecoveryPolicy policy, std::uint64_t seed);

  // The connection went down: an outage begins (damped: give up).
  RecoveryDecision went_down(Clock::time_point now);
  // An attempt of the current outage failed: the next one, or give up once
  // the outage has lasted give_up_after.
  RecoveryDecision attempt_failed(Clock::time_point now);
  // The outage's time is up (give_up_after since it began): give up, or
  // nothing when no outage is on or it has time left.
  std::optional<std::string> overdue(Clock::time_point now) const;
  // The connection is up again: the outage ends, and counts in the window.
  void recovered(Clock::time_point now);
  // Any outage ends without counting (the connection failed, or was closed).
  void ended() noexcept { outage_.reset(); }

  // Attempts of the current outage that failed so far (the one being made,
  // or waited for, is attempts() + 1).
  unsigned attempts() const noexcept { return outage_ ? outage_->attempts : 0; }
  const RecoveryPolicy& policy() const noexcept { return policy_; }

 private:
  struct Outage {
    Clock::time_point began;
    unsigned attempts = 0;  // failed
  };
  std::chrono::milliseconds next_delay();

  RecoveryPolicy policy_;
  std::mt19937_64 random_;
  std::optional<Outage> outage_;
  std::deque<Clock::time_point> recoveries_;  // within the window, oldest first
};

// What the ladder is told. `step` is the step an answer was asked at (a
// wait, a drain, a supervision); a stale one is ignored.
struct RecoveryInput {
  enum class Kind : std::uint8_t {
    kWentDown,       // down from up, the port asked: an outage begins
    kAttemptFailed,  // down again during an outage, the port asked
    kWaited,         // the wait of `step` is over
    kDrained,        // the drain of `step` is over: nothing posted before is left
    kPortActive,     // the connection's port is active again
    kRetryNow,  // the way to the peer is back (retry_now(); with a QP replaced, PORT_ACTIVE too)
    kOverdue,   // the outage's give-up timer fired
  };
  Kind kind = Kind::kWentDown;
  std::uint64_t step = 0;
  bool port_active = true;  // kWentDown, kAttemptFailed: false waits for kPortActive
};

// What to do next, for `step`.
struct RecoveryAction {
  enum class Kind : std::uint8_t {
    kNothing,    // stale, or nothing to do now
    kWait,       // `delay`, then kWaited (none: wait for kPortActive); `outage_began`:
                 // and time the outage (kOverdue after give_up_after)
    kDrain,      // drain the QP, then kDrained
    kReset,      // in place: reset the QP, recovering, the application's reconnect
    kReconnect,  // the QP replaced: recovering, the application's reconnect
    kAbort,      // the attempt in progress is into a dead link: fail it (a cause)
    kFail,       // give up for good, `why`
  };
  Kind kind = Kind::kNothing;
  std::uint64_t step = 0;
  std::optional<std::chrono::milliseconds> delay;
  bool outage_began = false;
  std::string why;
};

std::string_view to_string(RecoveryAction::Kind kind) noexcept;

class RecoveryLadder {
 public:
  using Clock = RecoverySchedule::Clock;
  // kResetInPlace keeps the QP (kReset); kReconnect brings a new one
  // (kReconnect), and while its port is down goes on trying every
  // max_delay, for the peer may be reached another way.
  enum class Mode : int { kResetInPlace, kReconnect };  // int: Options holds it (0.9.0's ABI)

  // Throws what RecoveryPolicy::validate throws. `was_up`: the connection
  // starts up (its first up later is then a recovery).
  RecoveryLadder(RecoveryPolicy policy, std::uint64_t seed, Mode mode, bool was_up);

  // The connection's state changed to `to`, whoever moved it: whatever was
  // scheduled is stale. Returns the new step; to down, supervise at it
  // (kWentDown from up, else kAttemptFailed). An up `by_attempt` counts in
  // the damping window unless it is the connection's first.
  std::uint64_t changed(ConnectionState to, Clock::time_point now, bool by_attempt = false);
  // An attempt failed before it came to recovering (its drain, its reset):
  // the state stays down, but what was scheduled is stale. Supervise
  // (kAttemptFailed) at the returned step.
  std::uint64_t failed_early();
  // A connection made by its recovery: its first attempt, at once.
  // Supervise (kWentDown) at the returned step.
  std::uint64_t first_attempt();
  // The one rung: what happened, and what to do now.
  RecoveryAction next(const RecoveryInput& input, Clock::time_point now);
  // No recovery any more (closed): every step is stale.
  void close() noexcept;

  std::uint64_t step() const noexcept { return step_; }
  bool current(std::uint64_t at) const noexcept { return !closed_ && at == step_; }
  // The attempt being made or waited for: 1 for an outage's first.
  unsigned attempt_number() const noexcept { return schedule_.attempts() + 1; }
  const RecoveryPolicy& policy() const noexcept { return schedule_.policy(); }

 private:
  enum class Phase : std::uint8_t {
    kIdle,         // up, failed or closed: no outage
    kDown,         // down, to be supervised at `step_`
    kWaiting,      // a wait for the next attempt
    kWaitingPort,  // the port is down: PORT_ACTIVE starts `pending_`
    kDraining,     // the attempt's drain
    kHandingOver,  // drained: the QP being reset (or handed over), not yet recovering
    kConnecting,   // recovering: the application connects
  };
  RecoveryAction act(RecoveryAction::Kind kind) const;

  RecoverySchedule schedule_;
  const Mode mode_;
  Phase phase_ = Phase::kIdle;
  std::uint64_t step_ = 0;
  bool closed_ = false;
  bool ever_up_;
  bool soon_ = false;  // the next wait is none (the way back came while down)
  std::optional<std::chrono::milliseconds> pending_;  // the wait PORT_ACTIVE starts
};

}  // namespace ibev

#endif  // IBEV_HEALTH_RECOVERY_H_
