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
// Thread-safety: a value; one owner serializes its calls.
#ifndef IBEV_CORE_RECOVERY_H_
#define IBEV_CORE_RECOVERY_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <random>
#include <string>

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

}  // namespace ibev

#endif  // IBEV_CORE_RECOVERY_H_
