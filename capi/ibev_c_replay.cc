// The C API of a replay (dispatch/replay.h): a recording read with
// read_recording() (formats/recording.h) and played into a dispatcher. The
// boundary and the helpers are capi/ibev_c_internal.h's.
#include <ibev/ibev_c.h>

#include <cerrno>
#include <fstream>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ibev/core/failure.h>
#include <ibev/dispatch/dispatcher.h>
#include <ibev/dispatch/replay.h>
#include <ibev/formats/recording.h>
#include "ibev_c_internal.h"

using namespace ibev::detail::capi;

// Owned by C; Replay is neither copied nor moved (its stop() is shared
// between the playing thread and any other).
struct ibev_replay {
  ibev_replay(ibev::Dispatcher& dispatcher, ibev::Replay::Options options)
      : replay(dispatcher, std::move(options)) {}
  ibev::Replay replay;
};

namespace {

// The C device function as Options::device: C cannot throw, so what it
// returns is the whole answer.
std::function<ibv_context*(const std::string&)> device_function(ibev_replay_device_fn device,
                                                                void* context) {
  if (device == nullptr) throw std::invalid_argument("attr->device is NULL");
  return [device, context](const std::string& name) { return device(name.c_str(), context); };
}

std::vector<ibev::RecordedLine> read_file(const std::string& path) {
  errno = 0;
  std::ifstream file(path);
  if (!file) ibev::throw_system_error("open " + path, errno);
  return ibev::read_recording(file, path);
}

}  // namespace

extern "C" {

// ------------------------------------------------------------------ replay

void ibev_replay_attr_init(ibev_replay_attr* attr) {
  if (attr == nullptr) return;
  const ibev::Replay::Options d;
  *attr = ibev_replay_attr{};
  attr->speed = d.speed;
}

ibev_replay* ibev_replay_create(ibev_dispatcher* dispatcher, const ibev_replay_attr* attr) {
  return make_call("ibev_replay_create", [&] {
    const ibev_replay_attr& a = require(attr, "attr");
    ibev::Replay::Options options;
    options.speed = a.speed;
    options.device = device_function(a.device, a.context);
    // A device added or removed is counted only: C has no change function.
    return std::make_unique<ibev_replay>(require(dispatcher, "dispatcher").dispatcher,
                                         std::move(options))
        .release();
  });
}

void ibev_replay_destroy(ibev_replay* replay) { take_back(replay); }

int ibev_replay_play_file(ibev_replay* replay, const char* path, ibev_replay_stats* stats) {
  return status_call("ibev_replay_play_file", [&] {
    ibev::Replay& r = require(replay, "replay").replay;
    const std::vector<ibev::RecordedLine> lines = read_file(&require(path, "path"));
    const ibev::ReplayStats played = r.play(lines);
    if (stats != nullptr) {
      stats->injected = played.injected;
      stats->skipped = played.skipped;
      stats->changes = played.changes;
      stats->stopped = played.stopped ? 1 : 0;
    }
  });
}

void ibev_replay_stop(ibev_replay* replay) {
  if (replay != nullptr) replay->replay.stop();
}

}  // extern "C"
