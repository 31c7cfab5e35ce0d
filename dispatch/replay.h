// ibev::Replay: plays a recording (formats/recording.h; what `ibev-watch --json`
// writes) into a Dispatcher through inject(), so that an application's own
// handlers hear, in its CI and without RDMA hardware, what a real fabric did:
//
//   std::ifstream file("flap.jsonl");
//   ibev::Replay::Options options;
//   options.device = [&](const std::string& recorded) { return device->context(); };
//   ibev::Replay(dispatcher, options).play(ibev::read_recording(file, "flap.jsonl"));
//
// Who hears what:
// - A port or device event reaches the listeners of the device `device`
//   maps the recorded name to (null: the event is skipped and counted).
// - An object event reaches the element `object` resolves it to: a live
//   ibv_cq/qp/srq/wq (an Element), or an ObjectNumber, which reaches the
//   handlers attached by number (a QueuePair's). By default the recorded
//   number; an event recorded with an address only is skipped, as an
//   address means nothing in another process.
// - A device added or removed goes to `change`: a replay does not add or
//   remove devices.
// Replayed events are synthesized, as inject() makes them: never acked to
// rdma-core, and a recorded device loss is a DEVICE_FATAL only (the live
// device stays open).
//
// Timing: events are injected at their recorded distance from `origin` (by
// default the first line's time; a schedule's to_recording() start, so that
// its "5s" waits 5 s), divided by `speed` (replay_delay, formats/recording.h);
// speed 0 injects them back to back. play() does not wait for delivery:
// handlers run on the dispatching thread, in order.
//
// Skipped and counted: an event with no live device or element, and one
// whose code this build does not know carrying an element inject() cannot
// check (a newer kernel's, recorded by a newer ibev). Exceptions thrown by
// the Options' functions leave play() as they are, after the events before.
//
// Threads: play() blocks its caller until the last event is injected; with
// a speed above 0 it must not be the dispatching thread (nothing would be
// delivered while it waits). stop() may be called from any thread: a play()
// in progress returns at once, and so does every later one.
#ifndef IBEV_DISPATCH_REPLAY_H_
#define IBEV_DISPATCH_REPLAY_H_

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <ibev/core/event.h>
#include <ibev/core/thread_annotations.h>
#include <ibev/dispatch/dispatcher.h>
#include <ibev/formats/recording.h>

namespace ibev {

struct ReplayStats {
  std::size_t injected = 0;  // events handed to inject()
  std::size_t skipped = 0;   // events with no live device or element
  std::size_t changes = 0;   // device changes handed to Options::change
  bool stopped = false;      // stop() ended it
};

class Replay {
 public:
  // What an object event is injected as: a live object, or a number.
  using Target = std::variant<Element, ObjectNumber>;

  struct Options {
    double speed = 1.0;  // 0: as fast as possible; else from 1e-6 to 1e6
    std::optional<RecordingClock::time_point> origin;  // what the start stands for
    std::function<ibv_context*(const std::string& device)> device;
    // Empty: the recorded number. nullopt: skipped.
    std::function<std::optional<Target>(const RecordedEvent& event)> object;
    std::function<void(const RecordedChange& change)> change;  // may be empty
  };

  // Throws std::invalid_argument: no `device`, a speed replay_delay refuses.
  Replay(Dispatcher& dispatcher, Options options);

  // Throws std::invalid_argument naming the event when what `object` gave
  // is not what the event's code carries (inject()'s own check), after
  // having injected the events before it.
  ReplayStats play(const std::vector<RecordedLine>& lines);
  void stop() IBEV_EXCLUDES(mutex_);

 private:
  // False once stopped; at once, without waiting, for a time passed.
  bool wait_until(std::chrono::steady_clock::time_point when) IBEV_EXCLUDES(mutex_);
  std::optional<Target> target_of(const RecordedEvent& event) const;

  Dispatcher& dispatcher_;
  const Options options_;
  detail::Mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ IBEV_GUARDED_BY(mutex_) = false;
};

}  // namespace ibev

#endif  // IBEV_DISPATCH_REPLAY_H_
