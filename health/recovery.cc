#include <ibev/health/recovery.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace ibev {

namespace {

std::string ms(std::chrono::milliseconds duration) {
  return std::to_string(duration.count()) + " ms";
}

}  // namespace

void RecoveryPolicy::validate() const {
  const auto refuse = [](const std::string& what) {
    throw std::invalid_argument("RecoveryPolicy: " + what);
  };
  if (first_delay.count() <= 0) refuse("first_delay is not above 0: retries would spin");
  if (max_delay < first_delay) refuse("max_delay is below first_delay");
  if (!(jitter >= 0.0 && jitter <= 1.0)) refuse("jitter is outside [0, 1]");
  if (max_recoveries == 0) refuse("max_recoveries is 0: nothing would ever recover");
  if (window.count() <= 0) refuse("window is not above 0");
  if (give_up_after.count() <= 0) refuse("give_up_after is not above 0");
}

RecoverySchedule::RecoverySchedule(RecoveryPolicy policy, std::uint64_t seed)
    : policy_(std::move(policy)), random_(seed) {
  policy_.validate();
}

RecoveryDecision RecoverySchedule::went_down(Clock::time_point now) {
  while (!recoveries_.empty() && now - recoveries_.front() >= policy_.window) {
    recoveries_.pop_front();
  }
  if (recoveries_.size() >= policy_.max_recoveries) {
    outage_.reset();
    return {std::nullopt, "down again after " + std::to_string(recoveries_.size()) +
                              " recoveries in " + ms(policy_.window) + " (damped)"};
  }
  outage_ = Outage{now, 0};
  return {next_delay(), {}};
}

RecoveryDecision RecoverySchedule::attempt_failed(Clock::time_point now) {
  if (!outage_) outage_ = Outage{now, 0};
  ++outage_->attempts;
  if (auto why = overdue(now)) {
    outage_.reset();
    return {std::nullopt, std::move(*why)};
  }
  return {next_delay(), {}};
}

std::optional<std::string> RecoverySchedule::overdue(Clock::time_point now) const {
  if (!outage_ || now - outage_->began < policy_.give_up_after) return std::nullopt;
  return "not recovered in " + ms(policy_.give_up_after) + " (" +
         std::to_string(outage_->attempts) + " attempts failed)";
}

void RecoverySchedule::recovered(Clock::time_point now) {
  outage_.reset();
  recoveries_.push_back(now);
  if (recoveries_.size() > policy_.max_recoveries) recoveries_.pop_front();
}

std::chrono::milliseconds RecoverySchedule::next_delay() {
  // Doubled once per attempt failed, until it reaches the cap (never past
  // it: no overflow however many attempts).
  auto base = policy_.first_delay.count();
  const auto cap = policy_.max_delay.count();
  for (unsigned i = 0; i < outage_->attempts && base < cap; ++i)
    base = base > cap / 2 ? cap : base * 2;
  // A uniform share in [0, 1) from the engine's top 53 bits: the same on
  // every standard library, unlike std::uniform_real_distribution.
  const double share = static_cast<double>(random_() >> 11) * 0x1.0p-53;
  const auto cut = static_cast<std::chrono::milliseconds::rep>(static_cast<double>(base) *
                                                               policy_.jitter * share);
  return std::chrono::milliseconds(base - cut);
}

std::string_view to_string(RecoveryAction::Kind kind) noexcept {
  using Kind = RecoveryAction::Kind;
  switch (kind) {
    case Kind::kNothing:
      return "nothing";
    case Kind::kWait:
      return "wait";
    case Kind::kDrain:
      return "drain";
    case Kind::kReset:
      return "reset";
    case Kind::kReconnect:
      return "reconnect";
    case Kind::kAbort:
      return "abort";
    case Kind::kFail:
      return "fail";
  }
  return "unknown";
}

RecoveryLadder::RecoveryLadder(RecoveryPolicy policy, std::uint64_t seed, Mode mode, bool was_up)
    : schedule_(std::move(policy), seed), mode_(mode), ever_up_(was_up) {}

std::uint64_t RecoveryLadder::changed(ConnectionState to, Clock::time_point now, bool by_attempt) {
  ++step_;
  switch (to) {
    case ConnectionState::kUp:
      if (by_attempt && ever_up_) schedule_.recovered(now);
      schedule_.ended();  // an up the application made ends the outage uncounted
      ever_up_ = true;
      phase_ = Phase::kIdle;
      break;
    case ConnectionState::kFailed:
      schedule_.ended();
      phase_ = Phase::kIdle;
      break;
    case ConnectionState::kDown:
      phase_ = Phase::kDown;
      break;
    case ConnectionState::kRecovering:
      phase_ = Phase::kConnecting;
      break;
  }
  if (phase_ == Phase::kIdle) {
    soon_ = false;
    pending_.reset();
  }
  return step_;
}

std::uint64_t RecoveryLadder::failed_early() {
  phase_ = Phase::kDown;
  return ++step_;
}

std::uint64_t RecoveryLadder::first_attempt() {
  phase_ = Phase::kDown;
  soon_ = true;
  return ++step_;
}

void RecoveryLadder::close() noexcept {
  closed_ = true;
  ++step_;
  phase_ = Phase::kIdle;
  schedule_.ended();
}

RecoveryAction RecoveryLadder::act(RecoveryAction::Kind kind) const {
  RecoveryAction action;
  action.kind = kind;
  action.step = step_;
  return action;
}

RecoveryAction RecoveryLadder::next(const RecoveryInput& input, Clock::time_point now) {
  using In = RecoveryInput::Kind;
  using Do = RecoveryAction::Kind;
  if (closed_) return {};
  switch (input.kind) {
    // Down: wait for the next attempt (for the port first, if it is down),
    // or give up (damped, or the outage has lasted give_up_after).
    case In::kWentDown:
    case In::kAttemptFailed: {
      if (!current(input.step) || phase_ != Phase::kDown) return {};
      const bool began = input.kind == In::kWentDown;
      const RecoveryDecision decision =
          began ? schedule_.went_down(now) : schedule_.attempt_failed(now);
      const bool at_once = soon_;
      soon_ = false;
      if (!decision.delay) {
        phase_ = Phase::kIdle;
        RecoveryAction fail = act(Do::kFail);
        fail.why = decision.why;
        return fail;
      }
      RecoveryAction wait = act(Do::kWait);
      wait.outage_began = began;
      // The way back came (retry_now()) before this was supervised: it
      // outranks what the port says now, as the wait for it would.
      if (!input.port_active && !at_once) {
        phase_ = Phase::kWaitingPort;
        pending_ = decision.delay;
        // A QP to be replaced may be replaced on another port or device.
        if (mode_ == Mode::kReconnect) wait.delay = schedule_.policy().max_delay;
        return wait;
      }
      phase_ = Phase::kWaiting;
      wait.delay = at_once ? std::chrono::milliseconds(0) : *decision.delay;
      return wait;
    }
    // The wait is over: the attempt begins with the drain.
    case In::kWaited:
      if (!current(input.step) || (phase_ != Phase::kWaiting && phase_ != Phase::kWaitingPort)) {
        return {};
      }
      phase_ = Phase::kDraining;
      pending_.reset();
      return act(Do::kDrain);
    // Drained: the QP reset (in place) or handed over, and the application's turn.
    case In::kDrained:
      if (!current(input.step) || phase_ != Phase::kDraining) return {};
      phase_ = Phase::kHandingOver;
      return act(mode_ == Mode::kResetInPlace ? Do::kReset : Do::kReconnect);
    // In place, a wait held for the port starts; a QP to be replaced: the
    // way back is there now.
    case In::kPortActive:
      if (mode_ == Mode::kReconnect) return next({In::kRetryNow, 0, true}, now);
      if (phase_ != Phase::kWaitingPort || !pending_) return {};
      {
        RecoveryAction wait = act(Do::kWait);
        wait.delay = pending_;
        pending_.reset();
        phase_ = Phase::kWaiting;
        return wait;
      }
    // The way back came: a wait ends now; an attempt under way since before
    // is into a dead link (it fails, and the next starts at once).
    case In::kRetryNow:
      switch (phase_) {
        case Phase::kDown:
        case Phase::kDraining:
        case Phase::kHandingOver:
          // Supervision to come (this attempt's, should it fail) waits for
          // nothing; an attempt not yet recovering has nothing into the
          // dead link to abort.
          soon_ = true;
          return {};
        case Phase::kWaiting:
        case Phase::kWaitingPort: {
          pending_.reset();
          phase_ = Phase::kWaiting;
          soon_ = true;  // and the next, should this one fail
          RecoveryAction wait = act(Do::kWait);
          wait.delay = std::chrono::milliseconds(0);
          return wait;
        }
        case Phase::kConnecting:
          soon_ = true;
          return act(Do::kAbort);
        case Phase::kIdle:
          return {};
      }
      return {};
    // The outage's time is up, if it still goes on.
    case In::kOverdue:
      if (phase_ == Phase::kIdle) return {};
      if (auto why = schedule_.overdue(now)) {
        phase_ = Phase::kIdle;
        RecoveryAction fail = act(Do::kFail);
        fail.why = std::move(*why);
        return fail;
      }
      return {};
  }
  return {};
}

}  // namespace ibev
