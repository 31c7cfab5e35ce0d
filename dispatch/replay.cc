// Playing a recording into a Dispatcher (dispatch/replay.h).
//
// Locking. `mutex_` guards `stopping_` alone, and is a leaf: stop() holds it
// to set the flag, and play()'s wait_until() holds it to read the flag and
// across the timed wait on `wake_` (which releases it while asleep). Nothing
// else runs under it: the Options' functions (device, object, change) and
// Dispatcher::inject() (which resolves through the Registry's locks and
// posts under the reactor's task lock) run with it released. So stop() may
// be called from anywhere, a handler on the dispatching thread or one of the
// Options' functions included, and it never waits for a delivery.
#include <ibev/dispatch/replay.h>

#include <stdexcept>
#include <utility>

namespace ibev {

Replay::Replay(Dispatcher& dispatcher, Options options)
    : dispatcher_(dispatcher), options_(std::move(options)) {
  if (!options_.device) {
    throw std::invalid_argument("Replay: no Options::device to map recorded devices to");
  }
  try {
    replay_delay(RecordingClock::duration::zero(), options_.speed);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("Replay: ") + e.what());
  }
}

void Replay::stop() {
  {
    detail::MutexLock lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
}

bool Replay::wait_until(std::chrono::steady_clock::time_point when) {
  detail::UniqueLock lock(mutex_);
  if (when <= std::chrono::steady_clock::now()) return !stopping_;
  return !wake_.wait_until(lock.native(), when, [this]() IBEV_REQUIRES(mutex_) { return stopping_; });
}

std::optional<Replay::Target> Replay::target_of(const RecordedEvent& event) const {
  if (event.kind == ElementKind::kPort) {
    if (!event.port) return std::nullopt;  // made by hand without one
    return Target(Element(Port{*event.port}));
  }
  if (event.kind == ElementKind::kDevice) return Target(Element(WholeDevice{}));
  if (options_.object) return options_.object(event);
  if (event.number) return Target(ObjectNumber{event.kind, *event.number});
  return std::nullopt;
}

ReplayStats Replay::play(const std::vector<RecordedLine>& lines) {
  ReplayStats stats;
  const auto started = std::chrono::steady_clock::now();
  std::optional<RecordingClock::time_point> origin = options_.origin;
  for (const RecordedLine& line : lines) {
    const auto time = time_of(line);
    if (!origin) origin = time;
    if (!wait_until(started + replay_delay(time - *origin, options_.speed))) {
      stats.stopped = true;
      return stats;
    }
    if (const auto* change = std::get_if<RecordedChange>(&line)) {
      if (options_.change) options_.change(*change);
      ++stats.changes;
      continue;
    }
    const auto& event = std::get<RecordedEvent>(line);
    ibv_context* device = options_.device(event.device);
    const std::optional<Target> target = device ? target_of(event) : std::nullopt;
    if (!target) {
      ++stats.skipped;
      continue;
    }
    try {
      if (const auto* element = std::get_if<Element>(&*target)) {
        dispatcher_.inject(device, event.code, *element);
      } else {
        dispatcher_.inject(device, event.code, std::get<ObjectNumber>(*target));
      }
    } catch (const std::invalid_argument& e) {
      if (find_event_type(event.code) == nullptr) {
        ++stats.skipped;  // a code this build cannot check the element of
        continue;
      }
      throw std::invalid_argument(
          "Replay::play: " + enumerator_name(event.code) + " of " + event.device + " (event " +
          std::to_string(stats.injected + stats.skipped + 1) + "): " + e.what());
    }
    ++stats.injected;
  }
  return stats;
}

}  // namespace ibev
