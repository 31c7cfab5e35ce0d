// The fault campaign's schedules (schedule_gen.h).
#include "tests/campaign/schedule_gen.h"

#include <cmath>
#include <iterator>
#include <map>
#include <optional>
#include <stdexcept>
#include <sstream>
#include <utility>

namespace ibev::campaign {
namespace {

using std::chrono::milliseconds;

// What one episode is; the first shrinks best (RapidCheck shrinks a choice
// toward the first): a short flap is the quickest fault to replay.
enum class Kind { kShortFlap, kLongFlap, kGidChange, kQpFatal, kRemove, kNetem, kListener, kPeer };

struct Episode {
  Kind kind = Kind::kShortFlap;
  std::size_t target = 0;
  int gap_ms = 0;
  int outage_ms = 0;  // a flap's, a removal's, a netem burst's or a server outage's length
  NetemSpec netem;    // a netem burst's
};

// A server outage (a listener's or a peer process's) as `bounds` have it:
// on the server's device, which need not be a target, the fault that starts
// it and the one that ends it, and its length's bounds.
struct ServerOutage {
  const char* what;  // "listener", "peer": for messages
  Fault::Kind start, end;
  bool allowed;
  std::string device;
  milliseconds min, max;
};

// Of a kListener or kPeer episode; none for another kind.
std::optional<ServerOutage> server_outage(Kind kind, const Bounds& bounds) {
  switch (kind) {
    case Kind::kListener:
      return ServerOutage{"listener", Fault::Kind::kListenerClose, Fault::Kind::kListenerOpen,
                          bounds.listener, bounds.listener_device, bounds.listener_min,
                          bounds.listener_max};
    case Kind::kPeer:
      return ServerOutage{"peer", Fault::Kind::kPeerKill, Fault::Kind::kPeerStart, bounds.peer,
                          bounds.peer_device, bounds.peer_min, bounds.peer_max};
    default:
      return std::nullopt;
  }
}

// A number in [low, high] whatever the generation's size (RapidCheck scales
// ranges by it: early cases would all be the lowest), shrinking toward low.
rc::Gen<int> within(milliseconds low, milliseconds high) {
  return rc::gen::resize(100, rc::gen::inRange<int>(static_cast<int>(low.count()),
                                                    static_cast<int>(high.count()) + 1));
}

Fault fault(milliseconds at, Fault::Kind kind, const Target& target) {
  Fault made;
  made.at = at;
  made.kind = kind;
  made.device = target.device;
  if (kind == Fault::Kind::kAdd) made.netdev = target.netdev;
  if (kind == Fault::Kind::kPortDown || kind == Fault::Kind::kPortUp ||
      kind == Fault::Kind::kGidChange) {
    made.number = target.port;
  }
  return made;
}

std::vector<Fault> to_faults(const std::vector<Episode>& episodes,
                             const std::vector<Target>& targets, const Bounds& bounds) {
  std::vector<Fault> faults;
  milliseconds at{0};
  for (const Episode& episode : episodes) {
    at += milliseconds(episode.gap_ms);
    const Target& target = targets[episode.target];
    switch (episode.kind) {
      case Kind::kShortFlap:
      case Kind::kLongFlap:
        faults.push_back(fault(at, Fault::Kind::kPortDown, target));
        at += milliseconds(episode.outage_ms);
        faults.push_back(fault(at, Fault::Kind::kPortUp, target));
        break;
      case Kind::kRemove:
        faults.push_back(fault(at, Fault::Kind::kRemove, target));
        at += milliseconds(episode.outage_ms);
        faults.push_back(fault(at, Fault::Kind::kAdd, target));
        break;
      case Kind::kGidChange:
        faults.push_back(fault(at, Fault::Kind::kGidChange, target));
        break;
      case Kind::kQpFatal:
        faults.push_back(fault(at, Fault::Kind::kQpFatal, target));
        break;
      case Kind::kNetem:
        faults.push_back(fault(at, Fault::Kind::kNetem, target));
        faults.back().netem = episode.netem;
        at += milliseconds(episode.outage_ms);
        faults.push_back(fault(at, Fault::Kind::kNetemOff, target));
        break;
      case Kind::kListener:
      case Kind::kPeer: {
        // Not a target's: the server's device (its port and netdev unused).
        const ServerOutage outage = *server_outage(episode.kind, bounds);
        const Target server{outage.device, "", 0};
        faults.push_back(fault(at, outage.start, server));
        at += milliseconds(episode.outage_ms);
        faults.push_back(fault(at, outage.end, server));
        break;
      }
    }
  }
  return faults;
}

bool in(milliseconds value, milliseconds low, milliseconds high) {
  return value >= low && value <= high;
}

// A burst's netem: its loss, and a delay and reordering unless 0.
NetemSpec netem_of(int loss, int delay_ms, int reorder) {
  NetemSpec netem;
  netem.loss = loss;
  if (delay_ms > 0) netem.delay = milliseconds(delay_ms);
  if (delay_ms > 0 && reorder > 0) netem.reorder = reorder;
  return netem;
}

// Why `netem` is no burst's within `bounds`, or empty.
std::string netem_invalid(const NetemSpec& netem, const Bounds& bounds) {
  const auto whole_in = [](const std::optional<double>& value, int low, int high) {
    return value && *value >= low && *value <= high && *value == std::floor(*value);
  };
  if (!whole_in(netem.loss, bounds.netem_loss_min, bounds.netem_loss_max)) {
    return "its loss is not a whole % in bounds";
  }
  if (netem.delay && (netem.delay->count() % 1000 != 0 ||
                      !in(std::chrono::duration_cast<milliseconds>(*netem.delay), milliseconds(1),
                          bounds.netem_delay_max))) {
    return "its delay is not whole ms in bounds";
  }
  if (netem.reorder && !whole_in(netem.reorder, 1, bounds.netem_reorder_max)) {
    return "its reorder is not a whole % in bounds";
  }
  return {};
}

// Schedules over `targets` within `bounds` whose episodes are of `kinds`.
rc::Gen<std::vector<Fault>> of_kinds(std::vector<Kind> kinds, std::vector<Target> targets,
                                     Bounds bounds) {
  // The kind by its index, which shrinks toward 0 (a short flap): a long
  // flap that fails as a short one would shrinks to it.
  const auto episode = rc::gen::mapcat(
      rc::gen::resize(100, rc::gen::inRange<std::size_t>(0, kinds.size())),
      [kinds, targets, bounds](std::size_t index) -> rc::Gen<Episode> {
        const Kind kind = kinds[index];
        const bool lasts = kind == Kind::kShortFlap || kind == Kind::kRemove;
        const bool long_one = kind == Kind::kLongFlap;
        const std::optional<ServerOutage> server = server_outage(kind, bounds);
        const auto target = rc::gen::resize(100, rc::gen::inRange<std::size_t>(0, targets.size()));
        if (kind == Kind::kNetem) {
          return rc::gen::apply(
              [](std::size_t target, int gap, int length, int loss, int delay, int reorder) {
                return Episode{Kind::kNetem, target, gap, length, netem_of(loss, delay, reorder)};
              },
              target, within(bounds.min_gap, bounds.max_gap),
              within(bounds.netem_min, bounds.netem_max),
              rc::gen::resize(100, rc::gen::inRange(bounds.netem_loss_min,
                                                    bounds.netem_loss_max + 1)),
              within(milliseconds(0), bounds.netem_delay_max),
              rc::gen::resize(100, rc::gen::inRange(0, bounds.netem_reorder_max + 1)));
        }
        return rc::gen::apply(
            [kind](std::size_t target, int gap, int outage) {
              return Episode{kind, target, gap, outage, {}};
            },
            target, within(bounds.min_gap, bounds.max_gap),
            long_one ? within(bounds.long_outage_min, bounds.long_outage_max)
            : server ? within(server->min, server->max)
            : lasts  ? within(bounds.short_outage_min, bounds.short_outage_max)
                     : rc::gen::just(0));
      });
  // RapidCheck drops elements of a container when it shrinks: whole
  // episodes, so never a port-down without its port-up.
  return rc::gen::map(
      rc::gen::resize(static_cast<int>(bounds.max_episodes),
                      rc::gen::container<std::vector<Episode>>(episode)),
      [targets, bounds](std::vector<Episode> episodes) {
        if (episodes.size() > bounds.max_episodes) episodes.resize(bounds.max_episodes);
        return to_faults(episodes, targets, bounds);
      });
}

}  // namespace

rc::Gen<std::vector<Fault>> schedules(std::vector<Target> targets, Bounds bounds) {
  if (targets.empty()) throw std::invalid_argument("campaign::schedules: no target");
  if (bounds.listener && bounds.listener_device.empty()) {
    throw std::invalid_argument("campaign::schedules: listener outages with no listener_device");
  }
  if (bounds.peer && bounds.peer_device.empty()) {
    throw std::invalid_argument("campaign::schedules: peer outages with no peer_device");
  }
  std::vector<Kind> kinds{Kind::kShortFlap, Kind::kLongFlap};
  if (bounds.gid_change) kinds.push_back(Kind::kGidChange);
  if (bounds.qp_fatal) kinds.push_back(Kind::kQpFatal);
  if (bounds.remove) kinds.push_back(Kind::kRemove);
  if (bounds.netem) kinds.push_back(Kind::kNetem);
  // A listener outage and a peer outage are never in one schedule: the
  // runner's peer process cannot close its listener. With both in the
  // bounds, which of the two a schedule may hold is drawn first (shrinking
  // toward the listener's); its kind takes the same place in `kinds`
  // either way.
  if (bounds.listener && bounds.peer) {
    return rc::gen::mapcat(rc::gen::arbitrary<bool>(), [kinds, targets, bounds](bool peer) {
      std::vector<Kind> with = kinds;
      with.push_back(peer ? Kind::kPeer : Kind::kListener);
      return of_kinds(with, targets, bounds);
    });
  }
  if (bounds.listener) kinds.push_back(Kind::kListener);
  if (bounds.peer) kinds.push_back(Kind::kPeer);
  return of_kinds(kinds, targets, bounds);
}

std::string invalid(const std::vector<Fault>& faults, const std::vector<Target>& targets,
                    const Bounds& bounds) {
  milliseconds end{0};  // of the last episode
  std::size_t episodes = 0;
  std::optional<Kind> server_kind;  // of its server outages: one kind only
  // An episode's end: the fault after faults[i] (at `at`) must be its
  // `back` on the same device, a whole number of ms later; why not, or
  // empty with `length` set.
  const auto closed_by = [&faults](std::size_t i, Fault::Kind back, milliseconds at,
                                   milliseconds& length) -> std::string {
    if (i + 1 == faults.size() || faults[i + 1].kind != back ||
        faults[i + 1].device != faults[i].device) {
      return "not followed by its " + std::string(to_string(back));
    }
    length = std::chrono::duration_cast<milliseconds>(faults[i + 1].at) - at;
    if (milliseconds(length) + at != faults[i + 1].at) return "not a whole ms";
    return {};
  };
  for (std::size_t i = 0; i < faults.size(); ++i, ++episodes) {
    const Fault& first = faults[i];
    const std::string where = "fault " + std::to_string(i + 1) + ": ";
    if (first.kind == Fault::Kind::kListenerClose || first.kind == Fault::Kind::kPeerKill) {
      // The server's device, which need not be a target.
      const Kind kind = first.kind == Fault::Kind::kPeerKill ? Kind::kPeer : Kind::kListener;
      const ServerOutage outage = *server_outage(kind, bounds);
      if (!outage.allowed) return where + "no " + outage.what + " outage in these bounds";
      if (first.device != outage.device) {
        return where + first.device + " is not the " + outage.what + "'s device";
      }
      if (server_kind && *server_kind != kind) {
        return where + "a listener outage and a peer outage in one schedule";
      }
      server_kind = kind;
      const auto at = std::chrono::duration_cast<milliseconds>(first.at);
      if (milliseconds(at) != first.at) return where + "not a whole ms";
      if (!in(at - end, bounds.min_gap, bounds.max_gap)) return where + "its gap is out of bounds";
      milliseconds length{0};
      const std::string why = closed_by(i, outage.end, at, length);
      if (!why.empty()) return where + why;
      if (!in(length, outage.min, outage.max)) return where + "its outage is out of bounds";
      end = at + length;
      ++i;
      continue;
    }
    if (first.kind == Fault::Kind::kListenerOpen || first.kind == Fault::Kind::kPeerStart) {
      return where + "a " + std::string(to_string(first.kind)) + " with nothing before it";
    }
    const Target* target = nullptr;
    for (const Target& t : targets) {
      if (t.device == first.device) target = &t;
    }
    if (target == nullptr) return where + first.device + " is no target";
    const auto at = std::chrono::duration_cast<milliseconds>(first.at);
    if (milliseconds(at) != first.at) return where + "not a whole ms";
    if (!in(at - end, bounds.min_gap, bounds.max_gap)) return where + "its gap is out of bounds";
    end = at;
    switch (first.kind) {
      case Fault::Kind::kPortDown:
      case Fault::Kind::kRemove: {
        const bool flap = first.kind == Fault::Kind::kPortDown;
        const auto back = flap ? Fault::Kind::kPortUp : Fault::Kind::kAdd;
        if (flap ? first.number != target->port : false) return where + "not the target's port";
        // A flap's port-up names its port, a re-add the target's netdev.
        if (i + 1 < faults.size() && (flap ? faults[i + 1].number != first.number
                                           : faults[i + 1].netdev != target->netdev)) {
          return where + "not followed by its " + std::string(to_string(back));
        }
        milliseconds outage{0};
        const std::string why = closed_by(i, back, at, outage);
        if (!why.empty()) return where + why;
        const bool short_one = in(outage, bounds.short_outage_min, bounds.short_outage_max);
        const bool long_one = flap && in(outage, bounds.long_outage_min, bounds.long_outage_max);
        if (!short_one && !long_one) return where + "its outage is out of bounds";
        if (!flap && !bounds.remove) return where + "no removal in these bounds";
        end = at + outage;
        ++i;
        break;
      }
      case Fault::Kind::kGidChange:
        if (!bounds.gid_change) return where + "no gid-change in these bounds";
        if (first.number != target->port) return where + "not the target's port";
        break;
      case Fault::Kind::kQpFatal:
        if (!bounds.qp_fatal) return where + "no qp-fatal in these bounds";
        if (first.number != 0) return where + "a qp-fatal names the workload's QP: 0";
        break;
      case Fault::Kind::kNetem: {
        if (!bounds.netem) return where + "no netem in these bounds";
        const std::string why = netem_invalid(first.netem, bounds);
        if (!why.empty()) return where + why;
        milliseconds length{0};
        const std::string why_not_closed = closed_by(i, Fault::Kind::kNetemOff, at, length);
        if (!why_not_closed.empty()) return where + why_not_closed;
        if (!in(length, bounds.netem_min, bounds.netem_max)) {
          return where + "its burst's length is out of bounds";
        }
        end = at + length;
        ++i;
        break;
      }
      case Fault::Kind::kPortUp:
      case Fault::Kind::kAdd:
      case Fault::Kind::kNetemOff:
        return where + "a " + std::string(to_string(first.kind)) + " with nothing before it";
      case Fault::Kind::kListenerClose:
      case Fault::Kind::kListenerOpen:
      case Fault::Kind::kPeerKill:
      case Fault::Kind::kPeerStart:
        break;  // taken above
    }
  }
  if (episodes > bounds.max_episodes) return "more than " + std::to_string(bounds.max_episodes) + " episodes";
  return {};
}

std::string reproduce_string(const rc::detail::FailureResult& failure) {
  std::vector<std::uint8_t> bytes;
  rc::detail::serialize(failure.reproduce, std::back_inserter(bytes));
  static const char kDigits[] = "0123456789abcdef";
  std::string text;
  for (const std::uint8_t byte : bytes) {
    text += kDigits[byte >> 4];
    text += kDigits[byte & 15];
  }
  return text;
}

rc::detail::Reproduce parse_reproduce(const std::string& text) {
  const auto digit = [&text](char c) {
    const auto at = std::string("0123456789abcdef").find(c);
    if (at == std::string::npos) throw std::invalid_argument("not a reproduce string: " + text);
    return static_cast<std::uint8_t>(at);
  };
  if (text.empty() || text.size() % 2 != 0) {
    throw std::invalid_argument("not a reproduce string: " + text);
  }
  std::vector<std::uint8_t> bytes;
  for (std::size_t i = 0; i < text.size(); i += 2) {
    bytes.push_back(static_cast<std::uint8_t>(digit(text[i]) << 4 | digit(text[i + 1])));
  }
  rc::detail::Reproduce reproduce;
  try {
    if (rc::detail::deserialize(bytes.begin(), bytes.end(), reproduce) != bytes.end()) {
      throw std::invalid_argument("not a reproduce string: " + text);
    }
  } catch (const rc::detail::SerializationException&) {
    throw std::invalid_argument("not a reproduce string: " + text);
  }
  return reproduce;
}

void showValue(const Fault& fault, std::ostream& out) {
  std::ostringstream line;
  write_fault_schedule(line, {fault});
  std::string text = line.str();
  if (!text.empty() && text.back() == '\n') text.pop_back();
  out << text;
}

}  // namespace ibev::campaign
