// What the recording fuzz targets hold a recording to: written back by the
// writer (formats/recording.h) and read again, every line is what it was,
// to the microsecond the format keeps. A broken promise aborts, so libFuzzer
// reports it as it reports a crash.
#ifndef IBEV_TESTS_FUZZ_RECORDING_CHECK_H_
#define IBEV_TESTS_FUZZ_RECORDING_CHECK_H_

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include <ibev/formats/recording.h>

namespace ibev::fuzz {

[[noreturn]] inline void broken(const std::string& what) {
  std::fprintf(stderr, "broken invariant: %s\n", what.c_str());
  std::abort();
}

// The event as the writer takes it, or nullopt for one it cannot write as
// read (an object event with neither address nor number, address 0, a loss
// on another event than DEVICE_FATAL): the reader is laxer than the writer,
// which is fine.
inline std::optional<Event> as_event(const RecordedEvent& recorded) {
  try {
    switch (recorded.kind) {
      case ElementKind::kPort:
        if (!recorded.port) return std::nullopt;
        return Event::synthesize(nullptr, recorded.code, Element(Port{*recorded.port}));
      case ElementKind::kDevice:
        if (recorded.loss == DeviceLoss::kNone) {
          return Event::synthesize(nullptr, recorded.code, Element(WholeDevice{}));
        }
        if (recorded.code != IBV_EVENT_DEVICE_FATAL) return std::nullopt;
        return Event::device_lost(nullptr, recorded.loss);
      default:
        break;
    }
    if (recorded.object) {
      const auto bits = static_cast<std::uintptr_t>(*recorded.object);
      switch (recorded.kind) {
        case ElementKind::kCq:
          return Event::synthesize(nullptr, recorded.code,
                                   Element(reinterpret_cast<ibv_cq*>(bits)));
        case ElementKind::kQp:
          return Event::synthesize(nullptr, recorded.code,
                                   Element(reinterpret_cast<ibv_qp*>(bits)));
        case ElementKind::kSrq:
          return Event::synthesize(nullptr, recorded.code,
                                   Element(reinterpret_cast<ibv_srq*>(bits)));
        default:
          return Event::synthesize(nullptr, recorded.code,
                                   Element(reinterpret_cast<ibv_wq*>(bits)));
      }
    }
    if (recorded.number) {
      return Event::synthesize(nullptr, recorded.code,
                               ObjectNumber{recorded.kind, *recorded.number});
    }
    return std::nullopt;
  } catch (const std::invalid_argument&) {
    return std::nullopt;  // synthesize's documented refusal: not an event it makes
  }
}

// What reading recording_line(event, ...) must give.
inline RecordedEvent expected_of(const Event& event, const RecordedEvent& recorded) {
  RecordedEvent want;
  want.time = std::chrono::floor<std::chrono::microseconds>(recorded.time);
  want.device = recorded.device;
  want.code = event.code();
  want.kind = event.element_kind();
  want.port = event.port();
  if (const void* object = event.object()) {
    want.object = reinterpret_cast<std::uintptr_t>(object);
  } else if (const auto number = event.object_number()) {
    want.number = number->number;
  }
  want.loss = event.loss();
  want.synthesized = event.synthesized();
  // What it was read as, it must still be.
  if (want.code != recorded.code || want.kind != recorded.kind ||
      (recorded.kind == ElementKind::kPort && want.port != recorded.port) ||
      (want.object && want.object != recorded.object) ||
      (want.number && want.number != recorded.number)) {
    broken("the event made of a recorded one is another");
  }
  return want;
}

inline RecordingClock::time_point micros(RecordingClock::time_point time) {
  return std::chrono::floor<std::chrono::microseconds>(time);
}

// Writes each line the writer can write, reads the text back, and aborts
// unless it reads without error and gives the same lines.
inline void check_round_trip(const std::vector<RecordedLine>& lines) {
  std::vector<RecordedLine> expected;
  std::string text = recording_header(RecordingClock::time_point{}) + "\n";
  for (const RecordedLine& line : lines) {
    if (const auto* change = std::get_if<RecordedChange>(&line)) {
      text +=
          recording_change_line(change->device, change->node, change->added,
                                change->added ? DeviceLoss::kNone : change->loss, change->time) +
          "\n";
      RecordedChange want = *change;
      want.time = micros(want.time);
      if (want.added) want.loss = DeviceLoss::kNone;
      expected.emplace_back(want);
    } else {
      const auto& recorded = std::get<RecordedEvent>(line);
      const std::optional<Event> event = as_event(recorded);
      if (!event) continue;
      text += recording_line(*event, recorded.device, recorded.time) + "\n";
      RecordedEvent want = expected_of(*event, recorded);
      expected.emplace_back(want);
    }
  }
  std::istringstream in(text);
  std::vector<RecordedLine> read;
  try {
    read = read_recording(in, "written");
  } catch (const std::invalid_argument& e) {
    broken(std::string("the writer's text does not read back: ") + e.what() + "\n" + text);
  }
  if (read.size() != expected.size()) broken("a line lost or gained in the round trip:\n" + text);
  for (std::size_t i = 0; i < read.size(); ++i) {
    const std::string where = "line " + std::to_string(i + 2) + " of\n" + text;
    if (read[i].index() != expected[i].index()) broken("an event read back as a change, " + where);
    if (const auto* change = std::get_if<RecordedChange>(&read[i])) {
      const auto& want = std::get<RecordedChange>(expected[i]);
      if (change->time != want.time || change->device != want.device || change->node != want.node ||
          change->added != want.added || change->loss != want.loss) {
        broken("a change read back otherwise, " + where);
      }
    } else {
      const auto& got = std::get<RecordedEvent>(read[i]);
      const auto& want = std::get<RecordedEvent>(expected[i]);
      if (got.time != want.time || got.device != want.device || got.code != want.code ||
          got.kind != want.kind || got.port != want.port || got.object != want.object ||
          got.number != want.number || got.loss != want.loss ||
          got.synthesized != want.synthesized) {
        broken("an event read back otherwise, " + where);
      }
    }
  }
}

}  // namespace ibev::fuzz

#endif  // IBEV_TESTS_FUZZ_RECORDING_CHECK_H_
