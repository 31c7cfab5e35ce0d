// The fault campaign's runner (issue #50): from a seed, fault schedules
// (tests/campaign/schedule_gen.h) done for real (apps/ibev_replay:real_faults,
// as `ibev-replay --schedule --real` does them) on rxe0's veth end while a
// CmSession from rxe0 and its CmAcceptor on rxe1 (softroce_run.sh --devices
// 2, each side with its own Dispatcher, as two hosts) carry numbered
// messages; qp-fatals, the listener's outages and the peer's deaths are the
// runner's own (a qp-fatal injected into the client's QP of the moment; a
// listener-close closes the server's CmAcceptor on rxe1, whose sessions go
// on, and its listener-open listens again with a new CmAcceptor on the same
// port, which knows none of the old one's sessions: a client reconnecting
// after it is a new server session, and an old one that was down fails
// after give_up_after; in a schedule with a peer-kill the server is
// session_peer, a process of its own on rxe1, SIGKILLed at the peer-kill
// and started again on the same port at the peer-start); after each
// schedule the invariants ibev's recovery promises:
//   (a) each side (the client, the server's latest session) is up or failed
//       within give_up_after + 1 s of the last fault;
//   (b) a failed side was told so exactly once, and the Dispatcher reported
//       one "connection failed" for it; an up one none (of a peer process,
//       the one that lives: a killed one's last words may be cut short);
//   (c) with the session up, every message posted through it arrived
//       (those an attempt listed undelivered sent again, as an application
//       does; a copy is allowed, a loss is not), but one a killed peer took
//       with it: confirmed before the next peer process started (its send
//       completed with success: the peer's NIC had it, its process may not
//       have);
//   (d) after teardown, this process's fds and threads, and the kernel's
//       count of each device's objects (QP, CQ, MR, PD, cm_id, context),
//       are back at what they were before the schedule's workload was made
//       (a peer process ended by then, its objects with it: at SIGTERM,
//       cleanly, exit 0 within 10 s, so no sanitizer report of its own);
//   (e) no side recovered more often within the damping window than its
//       policy's max_recoveries;
//   (f) a removal of the client's device (`rdma link delete`) returns
//       within 20 s: the process lets the device go.
// Every wait is bounded. A violation prints the seed and RapidCheck's
// reproduce string, is shrunk (fewer faults, shorter gaps) within a budget of
// runs, and the least schedule that still fails is written as a fault
// schedule file (into TEST_UNDECLARED_OUTPUTS_DIR when set) that this
// runner's --schedule mode and, without its qp-fatals, listener and peer
// faults, `ibev-replay --schedule --real` replay.
//
// Arguments (after --): --seed N (repeatable; default the suite's fixed
// seeds), --cases N per seed, --peer PROGRAM (session_peer: without it a
// schedule that kills the peer breaks the harness), --schedule FILE
// (replay one schedule),
// --regressions FILE... (kept schedules that failed, each replayed after
// the seeds: tests/campaign/regressions),
// --reproduce STRING with one --seed (one shrunk failure again),
// --shrink-budget N. Prints per seed: schedules, faults, invariant checks,
// violations and the time taken (tools/campaign.sh sums them).
#define BOOST_TEST_MODULE ibev_softroce_campaign
#include <dirent.h>
#include <malloc.h>
#include <signal.h>
#include <sys/wait.h>
#include <rdma/rdma_cma.h>
#include <unistd.h>

#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <ibev/cm/cm_devices.h>
#include <ibev/cm/cm_session.h>
#include <ibev/formats/fault_schedule.h>

#include "apps/ibev_replay/real_faults.h"
#include "tests/campaign/schedule_gen.h"
#include "tests/softroce/cm_fixture.h"
#include "tests/softroce/rdma_fixture.h"
#include "tests/softroce/session_fixture.h"
#include "tests/softroce/verbs_fixture.h"
#include "tests/support/testing.h"

using namespace ibev;
using namespace ibev::testing;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// The suite's fixed seeds: a few schedules that fit its time (README).
const std::vector<std::uint64_t> kSuiteSeeds{1, 2};
constexpr int kSuiteCases = 3;
constexpr auto kGiveUpAfter = 3000ms;
// Each step of an attempt (resolving, connecting): well inside
// kGiveUpAfter, so that a lost REQ or REP costs an attempt, not the
// session (the defaults, 2 and 5 s, are for a give_up_after of a minute).
constexpr auto kStepTimeout = 1000ms;
// How long `rdma link delete` of the client's device may block (the
// two-host test's bound: ibev lets the device go within it).
constexpr auto kDeleteBound = 20000ms;

// Both sides' recovery: soon, backing off to 400 ms, damped past 3
// recoveries within 3 s, given up after kGiveUpAfter.
RecoveryPolicy recovery_policy() { return quick_recovery(kGiveUpAfter); }

// Every Failure a Dispatcher of this process reports during a schedule
// (either side's: the server's in this process, the client's), kept for
// (d): a destroy verb refused at the teardown ("destroy failed", the object
// given up) is what leaves a device's objects behind, and it is reported
// to a sink the runner otherwise reads only for "connection failed".
class Reported {
 public:
  static Reported& all() {
    static Reported reported;
    return reported;
  }
  // An echo for FailureLog::echo_to, each line marked with its side.
  std::function<void(const std::string&)> from(const std::string& side) {
    return [this, side](const std::string& line) {
      std::lock_guard<std::mutex> lock(mutex_);
      lines_.push_back(side + ": " + line);
    };
  }
  // The lines starting with `kind` after the side's mark, joined by "; ",
  // and forgets all.
  std::string take(const std::string& kind) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string kept;
    for (const std::string& line : lines_) {
      const auto mark = line.find(": ");
      if (mark != std::string::npos && line.compare(mark + 2, kind.size(), kind) == 0) {
        kept += (kept.empty() ? "" : "; ") + line;
      }
    }
    lines_.clear();
    return kept;
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> lines_;
};

// One malloc arena, before any thread: librdmacm 44.0 (Debian 12) sorts its
// device list with a comparator that truncates the difference of two
// ibv_device pointers to an int, so devices libibverbs allocated on
// different threads, in arenas gigabytes apart, can sort wrong, and its
// sync after a removal and re-add drops devices still there, at worst all
// of them; its next rdma_get_cm_event then deadlocks in ucma_init (the long
// run's seed 606: docs/design.md, "The connection manager"). Every
// ibv_device in one heap is within 2 GiB of the others, where the
// comparator sorts right. Not ibev's to mend, and a broken harness judges
// nothing.
struct OneMallocArena {
  OneMallocArena() { mallopt(M_ARENA_MAX, 1); }
};
BOOST_TEST_GLOBAL_FIXTURE(OneMallocArena);

// The veth pair keeps its IPv6 addresses over a flap (rdma_cm finds each
// device by its address), as the two-host tests' does; put back as found.
struct KeepAddressOnDown {
  KeepAddressOnDown() {
    for (const std::string& netdev : netdevs()) {
      std::ifstream in("/proc/sys/net/ipv6/conf/" + netdev + "/keep_addr_on_down");
      std::string value = "0";
      in >> value;
      was.push_back(value);
      run_command("sysctl -qw net.ipv6.conf." + netdev + ".keep_addr_on_down=1");
    }
  }
  ~KeepAddressOnDown() {
    try {
      for (std::size_t i = 0; i < was.size(); ++i) {
        run_command("sysctl -qw net.ipv6.conf." + netdevs()[i] + ".keep_addr_on_down=" + was[i]);
      }
    } catch (const std::exception&) {
    }
  }
  static std::vector<std::string> netdevs() { return {test_netdev(), test_netdev2()}; }
  std::vector<std::string> was;
};
BOOST_TEST_GLOBAL_FIXTURE(KeepAddressOnDown);

struct Arguments {
  std::vector<std::uint64_t> seeds;
  int cases = kSuiteCases;
  std::string schedule;
  std::vector<std::string> regressions;
  std::string reproduce;
  int shrink_budget = 20;
  std::string peer;  // session_peer, for the schedules that kill the peer
};

Arguments arguments() {
  Arguments parsed;
  auto& suite = boost::unit_test::framework::master_test_suite();
  for (int i = 1; i < suite.argc; ++i) {
    const std::string word = suite.argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= suite.argc) throw std::invalid_argument(word + " takes a value");
      return suite.argv[++i];
    };
    if (word == "--seed") {
      parsed.seeds.push_back(std::stoull(value()));
    } else if (word == "--cases") {
      parsed.cases = std::stoi(value());
    } else if (word == "--schedule") {
      parsed.schedule = value();
    } else if (word == "--regressions") {
      while (i + 1 < suite.argc && std::string(suite.argv[i + 1]).rfind("--", 0) != 0) {
        parsed.regressions.push_back(suite.argv[++i]);
      }
      if (parsed.regressions.empty()) throw std::invalid_argument(word + " takes FILE...");
    } else if (word == "--reproduce") {
      parsed.reproduce = value();
    } else if (word == "--shrink-budget") {
      parsed.shrink_budget = std::stoi(value());
    } else if (word == "--peer") {
      parsed.peer = value();
    } else {
      throw std::invalid_argument("unknown argument " + word);
    }
  }
  if (parsed.seeds.empty()) parsed.seeds = kSuiteSeeds;
  return parsed;
}

const std::vector<campaign::Target>& targets() {
  static const std::vector<campaign::Target> kTargets{{test_device(), test_netdev(), 1}};
  return kTargets;
}

// The schedules this workload takes on rxe0, the client's device: flaps,
// gid-changes, qp-fatals, its removal and re-add, netem bursts on its
// netdev (the generator's default loss, delay and reordering); the server,
// on rxe1, keeps its device, and its listener closes for a while (the
// generator's default outage, 50 ms to 2 s).
campaign::Bounds bounds() {
  campaign::Bounds made;
  made.remove = true;
  made.max_episodes = 3;
  made.max_gap = 800ms;
  made.short_outage_max = 400ms;
  made.long_outage_min = 1000ms;
  made.long_outage_max = 2000ms;
  made.netem = true;
  made.listener = true;
  made.listener_device = test_device2();
  made.peer = true;
  made.peer_device = test_device2();
  return made;
}

// The self-test's: flaps alone, so each schedule it makes has the port-down
// its breakage needs, whatever mix bounds() comes to hold.
campaign::Bounds flaps_only() {
  campaign::Bounds made = bounds();
  made.gid_change = false;
  made.qp_fatal = false;
  made.remove = false;
  made.netem = false;
  made.listener = false;
  made.peer = false;
  return made;
}

std::size_t entries(const std::string& folder) {
  std::size_t n = 0;
  if (DIR* dir = opendir(folder.c_str())) {
    while (const dirent* entry = readdir(dir)) n += entry->d_name[0] == '.' ? 0 : 1;
    closedir(dir);
  }
  return n;
}

// This process's open fds and threads, and the kernel's count of each
// device's objects (`rdma resource show`: pd, cq, qp, cm_id, mr, ctx, srq).
struct Resources {
  std::size_t fds = 0;
  std::size_t threads = 0;
  std::string objects;
  static Resources now() {
    bind_once_on_each_device();
    return {entries("/proc/self/fd"), entries("/proc/self/task"), rdma_objects()};
  }
  // librdmacm opens its context on a device when an id first binds there
  // and keeps it for the process's life; a removed device's goes with it,
  // and the device added back gets one only when an id binds to it. An id
  // bound on each device and destroyed before each look makes the count
  // the schedule's, not librdmacm's (a session that never came back on the
  // new rxe0 had one context and two fds fewer than before).
  static void bind_once_on_each_device() {
    std::unique_ptr<rdma_event_channel, void (*)(rdma_event_channel*)> channel(
        rdma_create_event_channel(), rdma_destroy_event_channel);
    if (!channel) {
      throw std::system_error(errno, std::generic_category(), "rdma_create_event_channel");
    }
    for (const std::string& host : {cm_host(), cm_host2()}) {
      rdma_cm_id* id = nullptr;
      if (rdma_create_id(channel.get(), &id, nullptr, RDMA_PS_TCP) != 0) {
        throw std::system_error(errno, std::generic_category(), "rdma_create_id");
      }
      const CmAddress address = CmAddress::parse(host, 0);
      const int bound = rdma_bind_addr(id, const_cast<sockaddr*>(address.get()));
      const int error = errno;
      detail::destroy_id(id);  // never within ibev's look at the devices
      if (bound != 0) {
        throw std::system_error(error, std::generic_category(), "rdma_bind_addr " + host);
      }
    }
  }
  bool operator==(const Resources& other) const {
    return fds == other.fds && threads == other.threads && objects == other.objects;
  }
  std::string text() const {
    return std::to_string(fds) + " fds, " + std::to_string(threads) + " threads, " + objects;
  }
  // "rxe0: pd 1 cq 2 ...; rxe1: ...", in this order whatever the kernel's
  // (a device added again comes last).
  static std::string rdma_objects() {
    return rdma_objects_of(test_device()) + "; " + rdma_objects_of(test_device2());
  }
};

// What a campaign did, for its summary line.
struct Tally {
  std::size_t schedules = 0;
  std::size_t faults = 0;
  std::size_t checks = 0;
  // The last schedule's sides, as they went: what a kept schedule shows of
  // what its faults did.
  std::string sides;
};

// How a test makes the runner's bookkeeping wrong on purpose, so that a
// violation is seen, shrunk and written (item 6 of the issue).
enum class Breakage { kNone, kForgetAMessageAtAPortDown };

// One side's changes: its states in order, when each came, why for a
// down or a failure, and whose: the server's sessions of each acceptor are
// told apart (`acceptor`, 0 the first), as an acceptor listening again
// after a listener-close, or in a peer process started again, knows none of
// the last one's, and its session for the same client is one of its own.
class Side {
 public:
  void heard(ConnectionState to, const std::string& cause, std::size_t acceptor = 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    states_.push_back(to);
    times_.push_back(Clock::now());
    acceptors_.push_back(acceptor);
    // A down or a failure says why: a violation's report needs it.
    const bool why = to == ConnectionState::kDown || to == ConnectionState::kFailed;
    causes_.push_back(why ? cause : std::string());
  }
  std::size_t count(ConnectionState state) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::size_t n = 0;
    for (const auto s : states_) n += s == state ? 1 : 0;
    return n;
  }
  // The most recoveries (an up after an up of the same session) within any
  // `window`, less `slack`: the times are the handlers', which may come
  // later than the recovery's own clock counted them. A failure ends a
  // session (the server's next is a session of its own), and so does a new
  // acceptor: its session's first up is no recovery, though the last
  // acceptor's session, down, has not failed yet.
  std::size_t most_recoveries_within(std::chrono::milliseconds window,
                                     std::chrono::milliseconds slack) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<Clock::time_point> ups;
    std::map<std::size_t, bool> was_up;  // by acceptor
    for (std::size_t i = 0; i < states_.size(); ++i) {
      if (states_[i] == ConnectionState::kFailed) was_up[acceptors_[i]] = false;
      if (states_[i] != ConnectionState::kUp) continue;
      if (was_up[acceptors_[i]]) ups.push_back(times_[i]);
      was_up[acceptors_[i]] = true;
    }
    std::size_t most = 0;
    for (std::size_t first = 0, last = 0; last < ups.size(); ++last) {
      while (ups[last] - ups[first] >= window - slack) ++first;
      most = std::max(most, last - first + 1);
    }
    return most;
  }
  std::string text() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string line;
    for (std::size_t i = 0; i < states_.size(); ++i) {
      line += line.empty() ? "" : " ";
      // "[acceptor 2] up": where the acceptor of the change is not the last one's.
      if (acceptors_[i] != (i == 0 ? 0 : acceptors_[i - 1])) {
        line += "[acceptor " + std::to_string(acceptors_[i] + 1) + "] ";
      }
      line += std::string(to_string(states_[i]));
      if (!causes_[i].empty()) line += " (" + causes_[i] + ")";
    }
    return line;
  }

 private:
  std::mutex mutex_;
  std::vector<ConnectionState> states_;
  std::vector<Clock::time_point> times_;
  std::vector<std::string> causes_;
  std::vector<std::size_t> acceptors_;
};

std::size_t lines_starting(Env& env, const std::string& kind) {
  std::size_t n = 0;
  for (const std::string& line : env.errors()) n += line.rfind(kind, 0) == 0 ? 1 : 0;
  return n;
}

// The server of the workload, on rxe1 (cm_host2()), as the invariants see
// it: the faults that are its own (listener-close/-open, peer-kill/-start),
// its sessions' states and what it was told and reported of them, and the
// numbers it received. Two kinds: in this process, with a Dispatcher of its
// own (every schedule but those that kill the peer), and session_peer in a
// process of its own (a schedule with a peer-kill). What either cannot do
// throws std::logic_error: a schedule the generator would not make.
class Server {
 public:
  virtual ~Server() = default;
  virtual std::uint16_t port() const = 0;
  virtual void close_listener() = 0;
  virtual void open_listener() = 0;
  virtual void kill() = 0;
  virtual void start() = 0;
  // The sessions' states, in the order they came, of the server that lives
  // now: a killed peer's sessions went with its process.
  virtual std::vector<ConnectionState> states() = 0;
  // Its failures told (the handlers') and reported ("connection failed"),
  // with what it reported, for a violation's message.
  virtual std::size_t told_failed() = 0;
  virtual std::size_t reported_failed() = 0;
  virtual std::string reports() = 0;
  // Every number it received, whichever process did.
  virtual std::set<std::uint64_t> received() = 0;
  // The teardown's two steps, around the client's close (cm_session.h's
  // order: the acceptor, the client, then the server's sessions).
  virtual void close_acceptor() = 0;
  virtual void close_sessions() = 0;

  Side side;
};

// The server in this process: an acceptor, closed at a listener-close, and
// a new one on the same port at a listener-open, which knows none of the
// last one's sessions.
class LocalServer : public Server {
 public:
  LocalServer()
      : env_(test_device2()), channel_(CmEventChannel::create(env_.dispatcher)), numbers_(env_) {
    env_.failures.echo_to(Reported::all().from("server"));
    acceptor_ = listen(0);
    port_ = acceptor_->local_address().port();
  }
  std::uint16_t port() const override { return port_; }
  void close_listener() override { acceptor_->close(); }
  void open_listener() override { acceptor_ = listen(port_); }
  void kill() override { throw std::logic_error("peer-kill: the server runs in this process"); }
  void start() override { throw std::logic_error("peer-start: the server runs in this process"); }
  std::vector<ConnectionState> states() override {
    std::vector<ConnectionState> now;
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& session : sessions_) now.push_back(session->health().state());
    return now;
  }
  std::size_t told_failed() override { return side.count(ConnectionState::kFailed); }
  std::size_t reported_failed() override { return lines_starting(env_, "connection failed"); }
  std::string reports() override { return env_.failures.summary(); }
  std::set<std::uint64_t> received() override { return numbers_.received(); }
  void close_acceptor() override { acceptor_->close(); }
  void close_sessions() override {
    std::vector<std::shared_ptr<CmSession>> sessions;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      sessions.swap(sessions_);
    }
    for (const auto& session : sessions) session->close();
  }

 private:
  // An acceptor at `port` (0: any), its sessions kept with every other
  // acceptor's, the latest last.
  std::shared_ptr<CmAcceptor> listen(std::uint16_t port) {
    CmAcceptor::Options accepting;
    accepting.make_qp = numbers_.make_qp();
    accepting.health.recovery.policy = recovery_policy();
    accepting.connect_timeout = kStepTimeout;
    const std::size_t which = acceptors_++;
    return CmAcceptor::listen(
        channel_, CmAddress::parse(cm_host2(), port),
        [this](const std::shared_ptr<CmSession>& session) {
          std::lock_guard<std::mutex> lock(mutex_);
          sessions_.push_back(session);
          numbers_.attach(session);
        },
        [this, which](std::uint64_t, const HealthChange& change) {
          side.heard(change.to, change.cause.what, which);
        },
        accepting);
  }

  Env env_;
  std::shared_ptr<CmEventChannel> channel_;
  Numbered numbers_;
  std::uint16_t port_ = 0;
  std::size_t acceptors_ = 0;  // made so far
  std::mutex mutex_;
  std::vector<std::shared_ptr<CmSession>> sessions_;
  // After what its callbacks use, so that it goes first.
  std::shared_ptr<CmAcceptor> acceptor_;  // the current one
};

// The server as session_peer (tests/softroce/session_fixture.h), killed
// with SIGKILL at a peer-kill and started again on the same port at a
// peer-start: each process an acceptor of its own to Side. What it tells
// on stdout is all the runner knows of it; (b) judges the process that
// lives (a killed one's last words may be cut between a failure told and
// reported), received() is every process's. Its end, at the teardown, is
// a SIGTERM that must end it cleanly (exit 0: no sanitizer report, no
// hang) within 10 s; what else it did is left in `unclean`, which the
// runner's (d) reads once the workload is gone.
class PeerServer : public Server {
 public:
  PeerServer(std::string program, std::string& unclean)
      : program_(std::move(program)), unclean_(unclean) {
    start();
    port_ = peer_->port();
  }
  std::uint16_t port() const override { return port_; }
  void close_listener() override {
    throw std::logic_error("listener-close: the peer process cannot close its listener");
  }
  void open_listener() override {
    throw std::logic_error("listener-open: the peer process cannot close its listener");
  }
  void kill() override {
    if (!peer_) throw std::logic_error("peer-kill: no peer process is running");
    peer_->stop(SIGKILL);  // its output all read
    peer_.reset();
    std::lock_guard<std::mutex> lock(mutex_);
    now_ = Heard{};  // none lives now
  }
  void start() override {
    if (peer_) throw std::logic_error("peer-start: the peer process is running");
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++process_;
    }
    PeerProcess::Options options;
    options.give_up_after = kGiveUpAfter;
    options.connect_timeout = kStepTimeout;
    options.on_line = [this, process = process_](const std::string& line) { heard(process, line); };
    peer_ = std::make_unique<PeerProcess>(program_, port_, options);
  }
  std::vector<ConnectionState> states() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return now_.states;
  }
  std::size_t told_failed() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return now_.told_failed;
  }
  std::size_t reported_failed() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return now_.reported_failed;
  }
  std::string reports() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return now_.reports;
  }
  std::set<std::uint64_t> received() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return received_;
  }
  void close_acceptor() override {}
  void close_sessions() override {
    if (!peer_) return;
    const int status = peer_->stop(SIGTERM);
    peer_.reset();
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      unclean_ = "the peer process did not end cleanly at SIGTERM (" +
                 (!WIFEXITED(status)            ? "signal " + std::to_string(WTERMSIG(status))
                  : WEXITSTATUS(status) == 3 ? std::string("exit 3: a QP still held 5 s after "
                                                           "its session closed")
                                                : "exit " + std::to_string(WEXITSTATUS(status))) +
                 ")";
    }
  }

 private:
  // What the process that lives now told.
  struct Heard {
    std::vector<ConnectionState> states;
    std::size_t told_failed = 0;
    std::size_t reported_failed = 0;
    std::string reports;
  };
  static std::optional<ConnectionState> state_named(const std::string& name) {
    for (const auto state : {ConnectionState::kUp, ConnectionState::kDown,
                             ConnectionState::kRecovering, ConnectionState::kFailed}) {
      if (name == to_string(state)) return state;
    }
    return std::nullopt;
  }
  // On the reader's thread of process `process` (1 the first).
  void heard(std::size_t process, const std::string& line) {
    std::istringstream words(line);
    std::string kind;
    words >> kind;
    if (kind == "state") {
      std::string name;
      words >> name;
      const bool why = !name.empty() && name.back() == ':';
      if (why) name.pop_back();
      const auto state = state_named(name);
      std::string cause;
      std::getline(words >> std::ws, cause);
      if (state) side.heard(*state, why ? cause : std::string(), process - 1);
      std::lock_guard<std::mutex> lock(mutex_);
      if (state == ConnectionState::kFailed) ++now_.told_failed;
    } else if (kind == "sessions") {
      std::vector<ConnectionState> states;
      for (std::string name; words >> name;) {
        if (const auto state = state_named(name)) states.push_back(*state);
      }
      std::lock_guard<std::mutex> lock(mutex_);
      now_.states = std::move(states);
    } else if (kind == "received") {
      std::uint64_t seq = 0;
      if (words >> seq) {
        std::lock_guard<std::mutex> lock(mutex_);
        received_.insert(seq);
      }
    } else if (kind == "failure:") {
      std::string failure;
      std::getline(words >> std::ws, failure);
      std::lock_guard<std::mutex> lock(mutex_);
      now_.reported_failed += failure.rfind("connection failed", 0) == 0 ? 1 : 0;
      now_.reports += (now_.reports.empty() ? "" : "; ") + failure;
    }
  }

  const std::string program_;
  std::string& unclean_;
  std::uint16_t port_ = 0;  // 0 until the first process listens
  std::mutex mutex_;
  std::size_t process_ = 0;  // started so far
  Heard now_;
  std::set<std::uint64_t> received_;
  // Last: ended (its reader, which calls heard(), joined) before the above.
  std::unique_ptr<PeerProcess> peer_;
};

// The workload, as two hosts would have it: the server (above) and a client
// session from rxe0 (cm_host()) to it, with its own Dispatcher, sending
// numbered messages every 10 ms while up, from a thread of its own; what it
// posted is kept. The runner's thread does the server's faults
// and the teardown.
class SessionWorkload {
 public:
  explicit SessionWorkload(std::unique_ptr<Server> made)
      : server(std::move(made)),
        client_env(test_device()),
        client_channel(CmEventChannel::create(client_env.dispatcher)),
        client_numbers(client_env) {
    client_env.failures.echo_to(Reported::all().from("client"));
    CmSession::Options options;
    options.id = 42;
    options.source = CmAddress::parse(cm_host(), 0);
    options.make_qp = client_numbers.make_qp();
    options.health.recovery.policy = recovery_policy();
    options.resolve_timeout = kStepTimeout;
    options.connect_timeout = kStepTimeout;
    session = CmSession::connect(
        client_channel, CmAddress::parse(cm_host2(), server->port()),
        [this](const HealthChange& change) {
          client.heard(change.to, change.cause.what);
          if (change.to == ConnectionState::kUp) client_numbers.resend();
        },
        options);
    client_numbers.attach(session);
  }

  ~SessionWorkload() {
    stop_sending();
    server->close_acceptor();
    session->close();
    server->close_sessions();
  }

  void start_sending() {
    sender_ = std::thread([this] {
      std::uint64_t next = 1;
      while (sending_) {
        if (session->health().state() == ConnectionState::kUp) {
          try {
            client_numbers.send(next);
            std::lock_guard<std::mutex> lock(mutex_);
            posted_.insert(next);
            ++next;
          } catch (const std::exception&) {
            // Refused (the QP in ERR before the health looked): not posted.
          }
        }
        std::this_thread::sleep_for(10ms);  // a pace, not a wait
      }
    });
  }
  void stop_sending() {
    sending_ = false;
    if (sender_.joinable()) sender_.join();
  }
  // A message the bookkeeping says was posted, though it never was.
  void forget_one() {
    std::lock_guard<std::mutex> lock(mutex_);
    posted_.insert(1000000 + posted_.size());
  }
  std::set<std::uint64_t> posted() {
    std::lock_guard<std::mutex> lock(mutex_);
    return posted_;
  }

  std::unique_ptr<Server> server;
  Env client_env;
  std::shared_ptr<CmEventChannel> client_channel;
  Side client;
  Numbered client_numbers;
  std::shared_ptr<CmSession> session;

 private:
  std::mutex mutex_;
  std::set<std::uint64_t> posted_;
  std::atomic<bool> sending_{true};
  std::thread sender_;
};

bool settled(ConnectionState state) {
  return state == ConnectionState::kUp || state == ConnectionState::kFailed;
}

// The devices and the veth pair put back as the harness made them however a
// schedule's block ends (a violation, or a fault that could not be done
// throws): a removal the process held waited for (it completes once the
// workload is gone), rxe0 added back if it is gone, then what the faults
// left taken away (a gid-change's address, a netem, which would make every
// later schedule lossy: clean_up finds the netdev through the device), both
// veth ends up, the policy routes and rxe0's address back. Declared before
// the workload, so it runs after the workload's teardown; what it could not
// do is left in `error`, as a destructor does not throw.
struct Restore {
  const std::vector<Fault>& faults;
  std::string& error;
  std::future<real_faults::Outcome> held_delete;
  ~Restore() {
    if (held_delete.valid() && held_delete.wait_for(60s) != std::future_status::ready) {
      error = "rdma link delete " + test_device() +
              " still blocked a minute after the workload was gone";
      return;
    }
    try {
      add_test_device_if_gone();
      real_faults::clean_up(faults);
      run_command("ip link set " + test_netdev() + " up && ip link set " + test_netdev2() +
                  " up");
      put_back_policy_routes();
      give_netdev_its_address();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
};

// The server a schedule needs: session_peer (--peer PROGRAM) when it kills
// the peer, else one in this process.
std::unique_ptr<Server> server_for(const std::vector<Fault>& faults, std::string& unclean) {
  const bool kills = std::any_of(faults.begin(), faults.end(), [](const Fault& fault) {
    return fault.kind == Fault::Kind::kPeerKill;
  });
  if (!kills) return std::make_unique<LocalServer>();
  const std::string program = arguments().peer;
  if (program.empty()) {
    throw std::runtime_error("a schedule with a peer-kill needs --peer PROGRAM (session_peer)");
  }
  return std::make_unique<PeerServer>(program, unclean);
}

// Runs `faults` against a fresh workload and checks the invariants: empty,
// or the first violation. Throws std::runtime_error for what is no
// violation but a broken harness (a fault that could not be done).
std::string run_schedule(const std::vector<Fault>& faults, Breakage breakage, Tally& tally) {
  // The runner's own faults left out: the rest are the host's.
  std::vector<Fault> real;
  for (const Fault& fault : faults) {
    if (real_faults::not_real(fault).empty()) real.push_back(fault);
  }
  const auto checked = real_faults::check(real, "schedule");
  if (checked.status != 0) throw std::runtime_error(checked.message);
  ++tally.schedules;
  tally.faults += faults.size();
  // The first workload of the process leaves what librdmacm and libibverbs
  // keep for the process's life (rdma_cm's fd, the netlink socket): made
  // once before the baseline, so (d) sees only what a schedule leaves.
  static const bool warmed = [] {
    SessionWorkload warm_up(std::make_unique<LocalServer>());
    return eventually(
        [&] { return warm_up.session->health().state() == ConnectionState::kUp; }, 20s);
  }();
  if (!warmed) return "the warm-up session never came up";
  const Resources before = Resources::now();
  static_cast<void>(Reported::all().take(""));  // the warm-up's, or the last schedule's
  std::string violation;
  std::string not_restored;
  std::string peer_unclean;
  const std::size_t held_before = Numbered::held_at_teardown();
  {
    Restore restore{real, not_restored, {}};  // declared first: after the workload's teardown
    SessionWorkload workload(server_for(faults, peer_unclean));
    Side& server = workload.server->side;
    if (!eventually([&] { return workload.session->health().state() == ConnectionState::kUp; },
                    20s)) {
      return "the session never came up: client " + workload.client.text() + "; server " +
             server.text();
    }
    workload.start_sending();
    const auto start = Clock::now();
    bool forgotten = false;
    bool killed = false;
    // What the client's sends had confirmed when each peer-start came: all
    // a killed process can have taken with it (after it, a confirmation may
    // be the new process's, which must report what it got).
    std::set<std::uint64_t> confirmed_before_a_start;
    for (const Fault& fault : faults) {
      std::this_thread::sleep_until(start + fault.at);
      if (fault.kind == Fault::Kind::kQpFatal) {
        // The workload's QP of the moment: a schedule cannot know its number.
        // Its device, not the Env's: after a removal and re-add the
        // session's QP lives on the device added.
        // One closed by then (its device removed, a recovery's reset) takes
        // no event: the fault lands on nothing, as on a QP destroyed. It
        // may close between the look and the injection, which then refuses
        // the null QP or context (std::invalid_argument): the same.
        if (const auto qp = workload.session->queue_pair(); qp && qp->get() != nullptr) {
          try {
            workload.client_env.dispatcher.inject(qp->device()->context(), IBV_EVENT_QP_FATAL,
                                                  qp->get());
          } catch (const std::invalid_argument&) {
          }
        }
        continue;
      }
      // The server's own (the schedule names its device, rxe1: the
      // acceptor, or the peer process, is there).
      if (fault.kind == Fault::Kind::kListenerClose) {
        workload.server->close_listener();
        continue;
      }
      if (fault.kind == Fault::Kind::kListenerOpen) {
        workload.server->open_listener();
        continue;
      }
      if (fault.kind == Fault::Kind::kPeerKill) {
        workload.server->kill();
        killed = true;
        continue;
      }
      if (fault.kind == Fault::Kind::kPeerStart) {
        const auto confirmed = workload.client_numbers.confirmed();
        confirmed_before_a_start.insert(confirmed.begin(), confirmed.end());
        workload.server->start();
        continue;
      }
      if (breakage == Breakage::kForgetAMessageAtAPortDown && !forgotten &&
          fault.kind == Fault::Kind::kPortDown) {
        workload.forget_one();
        forgotten = true;
      }
      if (fault.kind == Fault::Kind::kRemove) {
        // `rdma link delete` returns once every context on the device is
        // closed: ibev lets a removed device go (its Device and everything
        // on it closed, the CM's id closed, so librdmacm's context too).
        // Waited for within a bound: a delete still blocked after it is a
        // device held, and it completes only once the workload is gone.
        // A thread of its own, let go: a future from std::async would wait
        // for it when destroyed, without a bound.
        ++tally.checks;
        auto deleted = std::make_shared<std::promise<real_faults::Outcome>>();
        auto deleting = deleted->get_future();
        std::thread([fault, deleted] {
          deleted->set_value(real_faults::apply(fault, "schedule"));
        }).detach();
        if (deleting.wait_for(kDeleteBound) != std::future_status::ready) {
          violation = "(f) rdma link delete " + fault.device + " still blocked " +
                      std::to_string(kDeleteBound.count()) +
                      " ms later: the process holds the device (client " +
                      workload.client.text() + ")";
          restore.held_delete = std::move(deleting);
          break;
        }
        const auto done = deleting.get();
        if (done.status != 0) throw std::runtime_error(done.message);
        continue;
      }
      const auto done = real_faults::apply(fault, "schedule");
      if (done.status != 0) throw std::runtime_error(done.message);
      if (fault.kind == Fault::Kind::kPortUp) put_back_policy_routes();
    }
    const auto last_fault = Clock::now();
    // (a) up or failed within give_up_after + 1 s of the last fault. A
    // peer started again after its client failed has no session to judge.
    ++tally.checks;
    const auto server_settled = [&] {
      const auto states = workload.server->states();
      return states.empty() || settled(states.back());
    };
    if (violation.empty() &&
        !eventually(
            [&] { return settled(workload.session->health().state()) && server_settled(); },
            std::chrono::duration_cast<std::chrono::milliseconds>(
                kGiveUpAfter + 1s - (Clock::now() - last_fault)))) {
      violation = "(a) not up or failed " + std::to_string(kGiveUpAfter.count() + 1000) +
                  " ms after the last fault: client " + workload.client.text() + "; server " +
                  server.text();
    }
    // The server's earlier sessions too (one its client left, or the
    // session of an acceptor closed since): such a one goes down when its
    // client comes back elsewhere, which the wait above bounds, and fails
    // give_up_after later, so each is up or failed within twice
    // give_up_after + 1 s of the last fault, and (b) counts it.
    const auto every_server_session_settled = [&] {
      const auto states = workload.server->states();
      return std::all_of(states.begin(), states.end(), settled);
    };
    if (violation.empty() &&
        !eventually(every_server_session_settled,
                    std::chrono::duration_cast<std::chrono::milliseconds>(
                        2 * kGiveUpAfter + 1s - (Clock::now() - last_fault)))) {
      violation = "(a) a server session not up or failed " +
                  std::to_string(2 * kGiveUpAfter.count() + 1000) +
                  " ms after the last fault: server " + server.text();
    }
    workload.stop_sending();
    const bool client_failed = workload.session->health().state() == ConnectionState::kFailed;
    // (b) each failed session told so once, and reported once.
    ++tally.checks;
    if (violation.empty()) {
      // Counted again at each look, after what was told and reported: a
      // session up may still fail meanwhile, so a count of the failed taken
      // once, before, would make its failure, told, look told twice. The
      // handlers hear a failure after state() shows it (on the Dispatchers'
      // threads): waited for until the counts agree; a failure told or
      // reported twice, or never, keeps them apart (the sums could pair one
      // session told twice with another not told yet: two faults of one
      // session in this window, which (a)'s waits make rare).
      const auto failed_now = [&] {
        std::size_t n = workload.session->health().state() == ConnectionState::kFailed ? 1 : 0;
        for (const auto state : workload.server->states()) {
          n += state == ConnectionState::kFailed ? 1 : 0;
        }
        return n;
      };
      std::size_t told = 0, reported = 0, failed = 0;
      const auto look = [&] {
        told = workload.client.count(ConnectionState::kFailed) + workload.server->told_failed();
        reported = lines_starting(workload.client_env, "connection failed") +
                   workload.server->reported_failed();
        failed = failed_now();
      };
      const auto all_told = [&] {
        look();
        return told == failed;
      };
      const auto all_reported = [&] {
        look();
        return reported == failed;
      };
      if (!eventually(all_told, 5s)) {
        violation = "(b) " + std::to_string(failed) + " sessions failed, told " +
                    std::to_string(told) + " times: client " + workload.client.text() +
                    "; server " + server.text();
      } else if (!eventually(all_reported, 5s)) {
        violation = "(b) " + std::to_string(failed) + " sessions failed, " +
                    std::to_string(reported) + " 'connection failed' reports: client " +
                    workload.client_env.failures.summary() + "; server " +
                    workload.server->reports();
      }
    }
    // (c) nothing posted is lost while the session is up, but what a
    // killed peer took with it: a message its NIC placed (the send
    // completed with success, which is all RC promises) before its process
    // read it. So a message missing after a peer-kill is allowed if its
    // send had completed with success before the next process started; one
    // not confirmed by then was flushed, listed undelivered and sent again,
    // and must have arrived.
    ++tally.checks;
    if (violation.empty() && !client_failed) {
      const auto posted = workload.posted();
      std::size_t taken_by_the_kill = 0;
      std::string which;  // the first few missing, and whether confirmed
      const auto missing = [&] {
        const auto received = workload.server->received();
        const auto confirmed = workload.client_numbers.confirmed();
        std::size_t n = 0;
        taken_by_the_kill = 0;
        which.clear();
        for (const auto seq : posted) {
          if (received.count(seq) != 0) continue;
          if (confirmed_before_a_start.count(seq) != 0) {
            ++taken_by_the_kill;
          } else if (++n <= 5) {
            which += (which.empty() ? "" : ", ") + std::to_string(seq) +
                     (confirmed.count(seq) != 0 ? " confirmed" : " not confirmed");
          }
        }
        return n;
      };
      // A message made up by the breakage never arrives: waited for are
      // the real ones, so the self-test does not wait out the bound.
      const std::size_t made_up = forgotten ? 1 : 0;
      eventually([&] { return missing() <= made_up; }, 10s);
      if (const std::size_t lost = missing(); lost != 0) {
        violation = "(c) " + std::to_string(lost) + " of " + std::to_string(posted.size()) +
                    " messages posted never arrived (" + which + "; " +
                    (killed ? std::to_string(taken_by_the_kill) +
                                  " more confirmed before a new peer process started; "
                            : std::string()) +
                    "client " + workload.client.text() + ")";
      }
    }
    // (e) never more recoveries within the damping window than the policy
    // allows (past them an outage is damped: given up).
    ++tally.checks;
    const RecoveryPolicy policy = recovery_policy();
    for (Side* side : {&workload.client, &server}) {
      const std::size_t most = side->most_recoveries_within(policy.window, 100ms);
      if (violation.empty() && most > policy.max_recoveries) {
        violation = "(e) " + std::to_string(most) + " recoveries within " +
                    std::to_string(policy.window.count()) + " ms (at most " +
                    std::to_string(policy.max_recoveries) + "): " + side->text();
      }
    }
    tally.sides = "client " + workload.client.text() + "; server " + server.text();
  }
  if (!not_restored.empty()) {
    throw std::runtime_error((violation.empty() ? "" : violation + "; then ") + not_restored);
  }
  // (d) fds, threads and the devices' objects back at their baseline once
  // the workload is gone (each look runs `rdma resource show`: not often).
  ++tally.checks;
  if (violation.empty() &&
      !eventually([&] { return Resources::now() == before; }, 10s, 100ms)) {
    // Whose objects they are (a process's, by pid, or the kernel's, by
    // module): what a report of a leak needs first.
    // A CQ whose destroy was refused (a QP still on it) keeps its
    // completion channel's fd open, and rxe's provider its ring mapped on
    // the device's uverbs file, so that context and CQ outlive
    // ibv_close_device: the destroys refused are named first.
    const std::string refused = Reported::all().take("destroy failed");
    violation = "(d) after teardown " + Resources::now().text() + ", before " + before.text() +
                "; destroys refused: " + (refused.empty() ? "none" : refused) +
                "; now: " + command_output(
                    "{ rdma resource show pd; rdma resource show cq; rdma resource show ctx; "
                    "rdma resource show cm_id; ls -l /proc/" + std::to_string(getpid()) +
                    "/fd; } 2>&1 || true");
  }
  if (violation.empty() && !peer_unclean.empty()) violation = "(d) " + peer_unclean;
  // A QP still held 10 s after its session closed: what held it is a leak,
  // though the application's teardown closed it (before its CQ, so the
  // counts above come back).
  if (const std::size_t held = Numbered::held_at_teardown() - held_before;
      violation.empty() && held != 0) {
    violation = "(d) " + std::to_string(held) +
                " QPs still held 10 s after their session closed (closed by the "
                "application's teardown)";
  }
  return violation;
}

std::string schedule_text(const std::vector<Fault>& faults) {
  std::ostringstream out;
  write_fault_schedule(out, faults);
  return out.str();
}

// Where a shrunk schedule goes.
std::string output_path(const std::string& name) {
  const char* dir = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  const std::string folder = dir != nullptr && access(dir, W_OK) == 0 ? dir : "/tmp";
  return folder + "/" + name;
}

struct Outcome {
  bool passed = true;
  std::vector<Fault> shrunk;  // the least failing schedule
  std::string violation;
  std::string file;
  std::string reproduce;
  Tally tally;
};

// One seed's campaign: `cases` schedules within `within`, a violation
// shrunk within `budget` runs of the workload and written.
Outcome campaign_of(std::uint64_t seed, int cases, const campaign::Bounds& within,
                    Breakage breakage, int budget, const std::string& reproduce = "") {
  Outcome outcome;
  int runs_after_failure = -1;  // -1: nothing failed yet
  // A broken harness (a fault that could not be done, the devices not put
  // back): no violation, and nothing after it can be judged, so every
  // later run passes without running and the campaign stops with it.
  std::string broken;
  const auto started = Clock::now();
  campaign::Counting listener;
  const auto result = campaign::check(
      [&] {
        const auto faults = *campaign::schedules(targets(), within);
        // Past the budget a shrink is not tried: it "passes", so the
        // shrinking ends at the last schedule that failed.
        if (runs_after_failure >= budget || !broken.empty()) return;
        if (runs_after_failure >= 0) ++runs_after_failure;
        const auto began = Clock::now();
        std::string violation;
        try {
          violation = run_schedule(faults, breakage, outcome.tally);
        } catch (const std::exception& e) {
          broken = e.what();
          return;
        }
        BOOST_TEST_MESSAGE("schedule (" << faults.size() << " faults, "
                                        << std::chrono::duration_cast<std::chrono::milliseconds>(
                                               Clock::now() - began)
                                               .count()
                                        << " ms): "
                                        << (violation.empty() ? "kept (" + outcome.tally.sides + ")"
                                                              : violation)
                                        << "\n" << schedule_text(faults));
        if (!violation.empty()) {
          if (runs_after_failure < 0) runs_after_failure = 0;
          outcome.shrunk = faults;
          outcome.violation = violation;
          RC_FAIL(violation);
        }
      },
      seed, cases, listener, reproduce);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
  if (!broken.empty()) {
    throw std::runtime_error("campaign seed " + std::to_string(seed) + ": the harness broke: " +
                             broken);
  }
  if (result.is<rc::detail::FailureResult>()) {
    outcome.passed = false;
    outcome.reproduce = campaign::reproduce_string(result.get<rc::detail::FailureResult>());
    outcome.file = output_path("campaign-seed-" + std::to_string(seed) + ".schedule");
    // The bounds hold peer outages: a replay needs the peer program too.
    const std::string again = "--seed " + std::to_string(seed) + " --reproduce " +
                              outcome.reproduce + " --peer PROGRAM";
    std::ofstream file(outcome.file);
    file << "# ibev fault campaign, seed " << seed << ": " << outcome.violation << "\n"
         << "# reproduce: " << again << "\n";
    write_fault_schedule(file, outcome.shrunk);
    BOOST_TEST_MESSAGE("campaign seed " << seed << ": VIOLATION " << outcome.violation
                                        << "\n  reproduce: " << again << "\n  shrunk in "
                                        << listener.shrinks_taken << " steps ("
                                        << listener.shrinks_tried << " offered, " << budget
                                        << " run at most) to "
                                        << outcome.file << ":\n"
                                        << schedule_text(outcome.shrunk));
  } else if (!result.is<rc::detail::SuccessResult>()) {
    std::ostringstream why;
    rc::detail::printResultMessage(result, why);
    throw std::runtime_error("campaign seed " + std::to_string(seed) + ": " + why.str());
  }
  BOOST_TEST_MESSAGE("campaign seed " << seed << ": " << outcome.tally.schedules << " schedules, "
                                      << outcome.tally.faults << " faults, "
                                      << outcome.tally.checks << " invariant checks, "
                                      << (outcome.passed ? 0 : 1) << " violations, " << ms.count()
                                      << " ms");
  return outcome;
}

std::vector<Fault> read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  return read_fault_schedule(in, path);
}

}  // namespace

// The campaign: each seed's schedules keep every invariant (or, with
// --schedule FILE, that one schedule does).
BOOST_AUTO_TEST_CASE(every_schedule_keeps_the_invariants) {
  const Arguments args = arguments();
  if (!args.schedule.empty()) {
    const auto faults = read_file(args.schedule);
    const std::string why = campaign::invalid(faults, targets(), bounds());
    BOOST_TEST_MESSAGE("replaying " << args.schedule << (why.empty() ? "" : " (" + why + ")"));
    Tally tally;
    const std::string violation = run_schedule(faults, Breakage::kNone, tally);
    BOOST_TEST_MESSAGE("replayed: " << (violation.empty() ? "kept" : violation) << " ("
                                    << tally.sides << ")");
    BOOST_TEST(violation.empty(), violation);
    return;
  }
  for (const std::uint64_t seed : args.seeds) {
    const Outcome outcome =
        campaign_of(seed, args.cases, bounds(), Breakage::kNone, args.shrink_budget,
                    args.reproduce);
    BOOST_TEST(outcome.passed, "seed " << seed << ": " << outcome.violation << "; schedule in "
                                       << outcome.file);
  }
  for (const std::string& file : args.regressions) {
    const auto faults = read_file(file);
    BOOST_TEST_REQUIRE(campaign::invalid(faults, targets(), bounds()) == "", file);
    Tally tally;
    const std::string violation = run_schedule(faults, Breakage::kNone, tally);
    BOOST_TEST_MESSAGE("regression " << file << ": " << (violation.empty() ? "kept" : violation));
    BOOST_TEST(violation.empty(), file << ": " << violation);
  }
}

// The runner can fail: with one message the bookkeeping says was posted
// and never was (made up at the first port-down), a schedule with a flap
// the session survives violates (c); it is shrunk and written, and the file
// reads back as a schedule the generator could have made, with a flap, that
// fails again when replayed.
BOOST_AUTO_TEST_CASE(a_violation_is_found_shrunk_and_written_replayable) {
  if (!arguments().schedule.empty() || !arguments().reproduce.empty()) return;
  const Outcome outcome =
      campaign_of(3, 3, flaps_only(), Breakage::kForgetAMessageAtAPortDown, 2);
  BOOST_REQUIRE(!outcome.passed);
  BOOST_TEST(outcome.violation.rfind("(c) 1 of ", 0) == 0u, outcome.violation);
  const auto written = read_file(outcome.file);
  BOOST_TEST(schedule_text(written) == schedule_text(outcome.shrunk));
  BOOST_TEST(campaign::invalid(written, targets(), flaps_only()) == "");
  bool flap = false;
  for (const Fault& fault : written) flap |= fault.kind == Fault::Kind::kPortDown;
  BOOST_TEST(flap);
  Tally tally;
  BOOST_TEST(run_schedule(written, Breakage::kForgetAMessageAtAPortDown, tally).rfind("(c)", 0) ==
             0u);
}

// A QP still held when the workload is torn down (by whatever the
// teardown does not know of: here the test) is closed by its Numbered
// before the CQ it completes on, and counted (a schedule's (d) reports it),
// so the CQ's destroy is not refused and nothing of the device stays (#50,
// seed 508's (d): ctx, cq and one fd more after the teardown). A CQ closed under an open QP is refused (EBUSY) and
// given up; its completion channel then cannot be destroyed (an fd left),
// and rxe's provider keeps the CQ's ring mapped on the context's uverbs
// file, so the context and the CQ outlive ibv_close_device.
BOOST_AUTO_TEST_CASE(a_qp_held_past_the_teardown_leaves_nothing_of_the_device) {
  if (!arguments().schedule.empty() || !arguments().reproduce.empty()) return;
  Tally tally;
  // The warm-up (run_schedule's, before its baseline), and a check that
  // the harness is sound.
  BOOST_TEST_REQUIRE(run_schedule({}, Breakage::kNone, tally) == "");
  const Resources before = Resources::now();
  static_cast<void>(Reported::all().take(""));
  const std::size_t held_before = Numbered::held_at_teardown();
  std::shared_ptr<QueuePair> held;
  {
    SessionWorkload workload(std::make_unique<LocalServer>());
    workload.client_numbers.let_go_within = 200ms;
    BOOST_TEST_REQUIRE(eventually(
        [&] { return workload.session->health().state() == ConnectionState::kUp; }, 20s));
    held = workload.session->queue_pair();
    BOOST_TEST_REQUIRE(held != nullptr);
  }
  const std::string refused = Reported::all().take("destroy failed");
  BOOST_TEST(refused.empty(), "destroys refused at the teardown: " << refused);
  BOOST_TEST(held->get() == nullptr, "the held QP was left open");
  // And counted, as run_schedule's (d) reads it.
  BOOST_TEST(Numbered::held_at_teardown() == held_before + 1);
  held.reset();  // the last of the client's device: its context closes here
  BOOST_TEST(eventually([&] { return Resources::now() == before; }, 10s, 100ms),
             "after teardown " << Resources::now().text() << ", before " << before.text());
}

// The peer process killed, and started again on its port: within
// give_up_after, the client comes back as the new process's session, up;
// past it, the client fails, told and reported once, and the new process
// has no session. Every invariant is kept either way (what the killed
// process had read is all that may be lost).
BOOST_DATA_TEST_CASE(a_peer_killed_and_started_again_keeps_the_invariants,
                     boost::unit_test::data::make({900, 5000}), start_ms) {
  if (!arguments().schedule.empty() || !arguments().reproduce.empty()) return;
  BOOST_TEST_REQUIRE(!arguments().peer.empty(), "needs --peer PROGRAM (session_peer)");
  std::vector<Fault> faults(2);
  faults[0].at = 300ms;
  faults[0].kind = Fault::Kind::kPeerKill;
  faults[1].at = std::chrono::milliseconds(start_ms);
  faults[1].kind = Fault::Kind::kPeerStart;
  for (Fault& fault : faults) fault.device = test_device2();
  Tally tally;
  const std::string violation = run_schedule(faults, Breakage::kNone, tally);
  BOOST_TEST(violation.empty(), violation);
  const std::string client = tally.sides.substr(0, tally.sides.find("; server "));
  const std::string server = tally.sides.substr(tally.sides.find("; server "));
  const auto up_at_last = [](const std::string& side) {
    return side.size() >= 3u && side.compare(side.size() - 3, 3, " up") == 0;
  };
  const bool back = std::chrono::milliseconds(start_ms) - faults[0].at < kGiveUpAfter;
  if (back) {
    // As the second process's session.
    BOOST_TEST(up_at_last(client), tally.sides);
    BOOST_TEST(server.find("[acceptor 2]") != std::string::npos, tally.sides);
    BOOST_TEST(up_at_last(server), tally.sides);
  } else {
    BOOST_TEST(client.find(" failed (") != std::string::npos, tally.sides);
    BOOST_TEST(server.find("[acceptor 2]") == std::string::npos, tally.sides);
  }
}
