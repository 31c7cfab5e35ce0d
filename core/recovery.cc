#include <ibev/core/recovery.h>

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
  for (unsigned i = 0; i < outage_->attempts && base < cap; ++i) base = base > cap / 2 ? cap : base * 2;
  // A uniform share in [0, 1) from the engine's top 53 bits: the same on
  // every standard library, unlike std::uniform_real_distribution.
  const double share = static_cast<double>(random_() >> 11) * 0x1.0p-53;
  const auto cut = static_cast<std::chrono::milliseconds::rep>(
      static_cast<double>(base) * policy_.jitter * share);
  return std::chrono::milliseconds(base - cut);
}

}  // namespace ibev
