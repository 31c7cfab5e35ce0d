// The far end of the two-host session tests and of the fault campaign's
// killed peer: another process, on its own rxe device, as a server
// application is. It listens with a CmAcceptor on ADDRESS:PORT (0: any) and
// keeps every session it is given; it tells on stdout, one line each, what
// the test reads: "listening PORT", "session ID" (a session new to it, not
// up yet), "state STATE[: CAUSE]" (each of these two after a line
// "sessions STATE..." with every session's state of that moment, in the
// order they came, the two in one write, so that a SIGKILL leaves both or
// neither), "received N", "failure: ..." (as the Dispatcher reports it).
// It runs until SIGTERM (or SIGKILL: a peer that dies), and exits 0, or 3
// if a QP was still held 5 s after its session closed.
//
//   session_peer DEVICE ADDRESS PORT GIVE_UP_MS [CONNECT_TIMEOUT_MS]
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ibev/cm/cm_session.h>

#include "tests/softroce/session_fixture.h"
#include "tests/softroce/verbs_fixture.h"

using namespace ibev;
using namespace ibev::testing;

namespace {

std::mutex out_mutex;

void tell(const std::string& line) {
  std::lock_guard<std::mutex> lock(out_mutex);
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    std::fprintf(stderr, "usage: session_peer DEVICE ADDRESS PORT GIVE_UP_MS [CONNECT_TIMEOUT_MS]\n");
    return 2;
  }
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);  // before any thread: all inherit it

  {
    Env env(argv[1]);
    env.failures.echo_to([](const std::string& failure) { tell("failure: " + failure); });
    auto channel = CmEventChannel::create(env.dispatcher);
    Numbered side(env);
    side.echo = tell;
    side.let_go_within = std::chrono::milliseconds(5000);  // within its test's 10 s
    std::mutex mutex;
    std::vector<std::shared_ptr<CmSession>> sessions;
    // "sessions STATE...": every session's state now, in the order they came.
    const auto states = [&] {
      std::string line = "sessions";
      std::lock_guard<std::mutex> lock(mutex);
      for (const auto& session : sessions) {
        line += " " + std::string(to_string(session->health().state()));
      }
      return line;
    };

    CmAcceptor::Options options;
    options.make_qp = side.make_qp();
    options.health.recovery.policy =
        quick_recovery(std::chrono::milliseconds(std::atoi(argv[4])));
    if (argc == 6) options.connect_timeout = std::chrono::milliseconds(std::atoi(argv[5]));
    auto acceptor = CmAcceptor::listen(
        channel, CmAddress::parse(argv[2], static_cast<std::uint16_t>(std::atoi(argv[3]))),
        [&](const std::shared_ptr<CmSession>& session) {
          {
            std::lock_guard<std::mutex> lock(mutex);
            sessions.push_back(session);
          }
          side.attach(session);
          tell(states() + "\nsession " + std::to_string(session->id()));
        },
        [&](std::uint64_t, const HealthChange& change) {
          tell(states() + "\nstate " + state_line(change));
          if (change.to == ConnectionState::kUp) side.resend();
        },
        options);
    tell("listening " + std::to_string(acceptor->local_address().port()));

    int signal = 0;
    sigwait(&stop, &signal);
    acceptor->close();
    {
      std::lock_guard<std::mutex> lock(mutex);
      sessions.clear();
    }
  }  // the application's objects: its QPs and CQs (Numbered), the Env
  // A QP something still held 5 s after its session closed (Numbered closed
  // it before its CQ) is a leak its test reports.
  return Numbered::held_at_teardown() == 0 ? 0 : 3;
}
