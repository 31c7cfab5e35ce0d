// Numbered messages over a CmSession, for the two-host tests: the client (in
// the test) and the peer (session_peer, another process) each run one. A
// message is "seq N", sent through the session's health (tracked, wr_id N);
// what an attempt lists undelivered is sent again once the session is up,
// as an application that wants its messages does. The receiving side keeps
// the numbers it got and how many came twice (a message delivered whose ack
// the outage lost is sent again: the application, not the transport, drops
// the copy). Each QP's receives (kRecvSlots, in slots all its QPs share)
// go back to it as they complete, whether or not the session runs on it
// yet: an accepted QP receives before its ESTABLISHED, or without one when
// the RTU is lost. Its verbs objects follow the session's device: an attempt on
// another device than the last (the old one removed and re-added, say)
// opens that device and makes its own protection domain, memory region and
// CQ there, as an application that survives a device's removal does.
#ifndef IBEV_TESTS_SOFTROCE_SESSION_FIXTURE_H_
#define IBEV_TESTS_SOFTROCE_SESSION_FIXTURE_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <ibev/cm/cm_session.h>

#include "tests/softroce/verbs_fixture.h"

namespace ibev::testing {

// A recovery that tries soon and backs off to at most 400 ms, giving up
// after `give_up_after`.
RecoveryPolicy quick_recovery(std::chrono::milliseconds give_up_after);

// "up", "down: CAUSE", "recovering": a change as the two-host tests log it.
std::string state_line(const HealthChange& change);

class Numbered {
 public:
  explicit Numbered(Env& env);
  ~Numbered();

  // Each attempt's QP on this side's CQ on the id's device, taken to INIT
  // through the id, its receives posted; the attempt's undelivered kept for
  // resend().
  MakeQp make_qp();
  // The session whose health hears this side's completions.
  void attach(std::shared_ptr<CmSession> session);
  void send(std::uint64_t seq);
  // What the last attempt listed undelivered, sent again (on the session's
  // up: the handler's thread).
  void resend();

  std::set<std::uint64_t> received();
  std::size_t duplicates();
  // The success completions of sends, with when they came.
  std::vector<std::chrono::steady_clock::time_point> sent_times();
  // The numbers whose send completed with success: the peer's NIC placed
  // them, which its application may not have read (a peer killed then).
  std::set<std::uint64_t> confirmed();
  // The devices its verbs objects were made on, the first (Env's) first.
  std::vector<std::shared_ptr<Device>> devices();

  // How long the destructor waits, after the session, for every QP made
  // to be let go of by whatever else held it; one still held then is
  // closed there, before its CQ (a test shortens it).
  std::chrono::milliseconds let_go_within{10000};
  // How many QPs every Numbered of this process had to close so, so far:
  // what held them past their session is a leak for the test to report.
  static std::size_t held_at_teardown();

  // "received N", "error STATUS", each also given to `echo` if set.
  Lines log;
  std::function<void(const std::string&)> echo;

 private:
  static constexpr std::size_t kSlot = 64;
  static constexpr std::size_t kSendSlots = 256;
  static constexpr std::size_t kRecvSlots = 32;
  // What the messages need on one device.
  struct OnDevice {
    std::shared_ptr<Device> device;
    std::shared_ptr<ProtectionDomain> pd;
    std::shared_ptr<MemoryRegion> mr;
    std::shared_ptr<CompletionQueue> cq;
  };
  std::shared_ptr<OnDevice> make_on(std::shared_ptr<Device> device,
                                    std::shared_ptr<ProtectionDomain> pd);
  // The current one if `name` is its device and that device is not lost,
  // else one made anew on the device `name` now is.
  std::shared_ptr<OnDevice> on_device(const std::string& name);
  void completed(const OnDevice* on, const ibv_wc& wc);
  void post_recv(QueuePair& qp, const MemoryRegion& mr, std::uint64_t slot);
  void say(const std::string& line);

  Env& env_;
  std::vector<char> memory_;
  std::mutex mutex_;
  std::shared_ptr<CmSession> session_;
  std::vector<std::uint64_t> undelivered_;
  std::set<std::uint64_t> received_;
  std::size_t duplicates_ = 0;
  std::vector<std::chrono::steady_clock::time_point> sent_;
  std::set<std::uint64_t> confirmed_;
  // Every QP made, with the verbs objects (the CQ) it was made on.
  struct Made {
    std::weak_ptr<QueuePair> qp;
    const OnDevice* on;
  };
  // The open QP made on `on` whose number is `qp_num`, if any (numbers are
  // per device: another device's QP may have the same).
  std::shared_ptr<QueuePair> made_on(const OnDevice* on, std::uint32_t qp_num);
  std::vector<Made> made_;
  // Every one made, the current last: their CQs' handlers use the above.
  std::vector<std::shared_ptr<OnDevice>> on_devices_;
};

// session_peer (`program`) in a process of its own on test_device2(),
// listening on cm_host2():`port` (0: any); its stdout lines in `lines`, each
// also given to `on_line` (on the reader's thread) as it comes. Throws
// std::runtime_error when it cannot be started or does not say "listening"
// within 20 s. The destructor ends it with SIGTERM and waits.
class PeerProcess {
 public:
  struct Options {
    std::chrono::milliseconds give_up_after{20000};
    std::chrono::milliseconds connect_timeout{5000};  // the acceptor's
    std::function<void(const std::string&)> on_line;
  };
  PeerProcess(const std::string& program, std::uint16_t port, Options options);
  PeerProcess(const std::string& program, std::uint16_t port)
      : PeerProcess(program, port, Options{}) {}
  ~PeerProcess();
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  std::uint16_t port() const { return port_; }
  // Ends it with `signal` and waits (10 s at most, then SIGKILL): its
  // output is all read after. Returns waitpid's status (0 if it had ended).
  int stop(int signal);
  // "up", "down: CAUSE", ...
  std::vector<std::string> states() { return lines.starting_with("state "); }

  Lines lines;

 private:
  pid_t pid_ = -1;
  std::uint16_t port_ = 0;
  std::thread reader_;
};

}  // namespace ibev::testing

#endif  // IBEV_TESTS_SOFTROCE_SESSION_FIXTURE_H_
