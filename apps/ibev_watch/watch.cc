// ibev-watch's device client, its printer and its counts (watch.h).
#include "apps/ibev_watch/watch.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

#include <ibev/formats/recording.h>

#include "apps/ibev_watch/format.h"
#include "apps/ibev_watch/journal.h"

namespace ibev::watch {

// --- Printer ---

void Printer::begin() {
  if (output_ == Output::kJson) print(recording_header(Clock::now()));
  if (output_ == Output::kJournal) {
    if (const int error = journal_reachable(); error != 0) journaled(error, std::string());
  }
}

void Printer::event(const Event& event, const std::string& device, Clock::time_point time) {
  switch (output_) {
    case Output::kHuman:
      return print(format_human(event, device, time));
    case Output::kJson:
      return print(recording_line(event, device, time));
    case Output::kJournal:
      return journaled(journal_event(event, device, time), format_human(event, device, time));
  }
}

void Printer::change(const Device& device, bool added, DeviceLoss loss, Clock::time_point time) {
  switch (output_) {
    case Output::kHuman:
      return print(format_change_human(device.name(), device.node(), added, loss, time));
    case Output::kJson:
      return print(recording_change_line(device.name(), device.node(), added, loss, time));
    case Output::kJournal:
      return journaled(journal_change(device.name(), device.node(), added, loss, time),
                       format_change_human(device.name(), device.node(), added, loss, time));
  }
}

void Printer::print(const std::string& line) {
  detail::MutexLock lock(mutex_);
  std::fprintf(stdout, "%s\n", line.c_str());
  std::fflush(stdout);  // a line per event, even into a pipe
}

// Not dropped: printed as without --journal (a container's runtime keeps
// stdout), and said once per stretch on stderr, not once per line.
void Printer::journaled(int error, const std::string& line) {
  detail::MutexLock lock(mutex_);
  if (error == 0) {
    if (journal_lost_) std::fputs("ibev-watch: the systemd journal takes entries again\n", stderr);
    journal_lost_ = false;
    return;
  }
  if (!journal_lost_) {
    std::fprintf(stderr,
                 "ibev-watch: cannot write to the systemd journal (%s: %s); "
                 "printing lines on stdout until it takes them\n",
                 kJournalSocket, std::strerror(error));
  }
  journal_lost_ = true;
  if (line.empty()) return;
  std::fprintf(stdout, "%s\n", line.c_str());
  std::fflush(stdout);
}

// --- Counts ---

namespace {

void add_counts(Counts& counts, Registry& registry, const Device& device) {
  const CounterSnapshot snapshot = registry.counters(device.context());
  for (int code = 0; code <= CounterSnapshot::kTrackedCodes; ++code) {
    const EventCounts c = snapshot.for_code(code);
    const std::uint64_t seen = c.delivered + c.unclaimed;
    if (seen == 0) continue;
    counts[device.name()][CounterSnapshot::bucket_name(code)] += seen;
  }
}

}  // namespace

void print_counts(const Counts& counts, bool json) {
  for (const auto& [device, events] : counts) {
    for (const auto& [event, seen] : events) {
      if (json) {
        std::printf("{\"count\":%llu,\"device\":%s,\"event\":%s}\n",
                    static_cast<unsigned long long>(seen), json_string(device).c_str(),
                    json_string(event).c_str());
      } else {
        std::printf("%s %s %llu\n", device.c_str(), event.c_str(),
                    static_cast<unsigned long long>(seen));
      }
    }
  }
}

// --- Watch ---

DeviceClient Watch::client() {
  return {"ibev-watch", [this](const std::shared_ptr<Device>& device) { add(device); },
          [this](const std::shared_ptr<Device>& device, DeviceLoss loss) { remove(device, loss); }};
}

bool Watch::wait_added(const std::vector<std::string>& names, std::chrono::milliseconds limit) {
  detail::UniqueLock lock(mutex_);
  return added_.wait_for(lock.native(), limit, [&]() IBEV_REQUIRES(mutex_) {
    return std::all_of(names.begin(), names.end(),
                       [&](const std::string& name) IBEV_REQUIRES(mutex_) {
                         return added_names_.count(name) != 0;
                       });
  });
}

std::vector<std::shared_ptr<Device>> Watch::watched(
    const std::vector<std::shared_ptr<Device>>& open) {
  detail::MutexLock lock(mutex_);
  std::vector<std::shared_ptr<Device>> ours;
  for (const auto& device : open) {
    if (listeners_.count(device.get()) != 0) ours.push_back(device);
  }
  return ours;
}

Counts Watch::counts(const std::vector<std::shared_ptr<Device>>& open) {
  detail::MutexLock lock(mutex_);
  Counts all = removed_counts_;
  for (const auto& device : open) {
    if (listeners_.count(device.get()) != 0) add_counts(all, registry_, *device);
  }
  return all;
}

bool Watch::wanted(const std::string& name) const {
  return only_.empty() || std::find(only_.begin(), only_.end(), name) != only_.end();
}

// Subscribed first: if that throws, nothing was said or counted (and no
// remove will come). No event is delivered before add() returns: both run
// on the dispatching thread.
void Watch::add(const std::shared_ptr<Device>& device) {
  IBEV_ASSERT_DISPATCHING(device->dispatcher());
  if (!wanted(device->name())) return;
  Handle listener = device->on_event({}, [this, name = device->name()](const Event& event) {
    const auto now = Clock::now();
    printer_.event(event, name, now);
    metrics_.event(event, name, now);
  });
  printer_.change(*device, true, DeviceLoss::kNone, Clock::now());
  metrics_.added(device->name());
  detail::MutexLock lock(mutex_);
  listeners_[device.get()] = std::move(listener);
  added_names_.insert(device->name());
  added_.notify_all();
}

void Watch::remove(const std::shared_ptr<Device>& device, DeviceLoss loss) {
  IBEV_ASSERT_DISPATCHING(device->dispatcher());
  {
    // One add() left out (not named with -d) is not watched, so not removed.
    detail::MutexLock lock(mutex_);
    if (listeners_.count(device.get()) == 0) return;
  }
  printer_.change(*device, false, loss, Clock::now());
  metrics_.removed(device->name(), loss);
  detail::MutexLock lock(mutex_);
  add_counts(removed_counts_, registry_, *device);  // before it closes and is forgotten
  listeners_.erase(device.get());
}

}  // namespace ibev::watch
