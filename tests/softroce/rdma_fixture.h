// Raw-verbs helpers for the soft-RoCE tests: RAII ownership of what a test
// opens, the device the harness made (IBEV_TEST_DEVICE), and shell commands
// that change its netdev. Failures throw std::system_error naming the verb.
#ifndef IBEV_TESTS_SOFTROCE_RDMA_FIXTURE_H_
#define IBEV_TESTS_SOFTROCE_RDMA_FIXTURE_H_

#include <infiniband/verbs.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <optional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/testing.h"

namespace ibev::testing {

// The variable's value, or `fallback` when it is unset.
std::string env_or(const char* name, const char* fallback);

// The device and netdev the harness created.
inline std::string test_device() { return env_or("IBEV_TEST_DEVICE", "rxe0"); }
inline std::string test_netdev() { return env_or("IBEV_TEST_NETDEV", "d0"); }
// The second device and its netdev (softroce_test with devices = 2).
inline std::string test_device2() { return env_or("IBEV_TEST_DEVICE2", "rxe1"); }
inline std::string test_netdev2() { return env_or("IBEV_TEST_NETDEV2", "v1"); }

// Runs `command` through /bin/sh; throws std::runtime_error with its exit
// status when it fails.
void run_command(const std::string& command);
// The test device added again over its netdev if it is gone (a test that
// deletes it puts it back for what runs after); throws as run_command does.
void add_test_device_if_gone();
// Runs `command` through /bin/sh and returns what it wrote to stdout;
// throws as run_command does.
std::string command_output(const std::string& command);
// The kernel's count of `device`'s objects, every process's and its own
// (`rdma resource show`: "rxe0: pd 1 cq 2 qp 1 cm_id 0 mr 0 ctx 0 srq 0",
// without the line's index); empty when the device is not there.
std::string rdma_objects_of(const std::string& device);

struct ContextDeleter {
  void operator()(ibv_context* c) const noexcept { ibv_close_device(c); }
};
struct PdDeleter {
  void operator()(ibv_pd* p) const noexcept { ibv_dealloc_pd(p); }
};
struct CqDeleter {
  void operator()(ibv_cq* c) const noexcept { ibv_destroy_cq(c); }
};
struct QpDeleter {
  void operator()(ibv_qp* q) const noexcept { ibv_destroy_qp(q); }
};
struct MrDeleter {
  void operator()(ibv_mr* m) const noexcept { ibv_dereg_mr(m); }
};
using ContextPtr = std::unique_ptr<ibv_context, ContextDeleter>;
using PdPtr = std::unique_ptr<ibv_pd, PdDeleter>;
using CqPtr = std::unique_ptr<ibv_cq, CqDeleter>;
using QpPtr = std::unique_ptr<ibv_qp, QpDeleter>;
using MrPtr = std::unique_ptr<ibv_mr, MrDeleter>;

// Opens the device called `name`; throws when there is none.
ContextPtr open_device(const std::string& name);

// GID index 0 of port 1.
ibv_gid query_gid0(ibv_context* context);

// Moves an RC QP, port 1, through INIT, RTR and RTS to the remote QP, with
// raw verbs only (a peer no ibev code touches): it expects `remote_psn` and
// sends from `own_psn`.
void connect_rc(ibv_qp* qp, std::uint32_t remote_qpn, const ibv_gid& remote_gid,
                std::uint32_t remote_psn, std::uint32_t own_psn);

// Moves two RC QPs of one device, port 1, through INIT, RTR and RTS, each
// connected to the other over GID index 0 (loopback through the device).
void connect_rc_pair(ibv_qp* a, ibv_qp* b);

// An async event as a test compares it: its code and port (-1 for none).
struct Seen {
  int code;
  int port;
  friend bool operator==(const Seen& a, const Seen& b) {
    return a.code == b.code && a.port == b.port;
  }
};
std::ostream& operator<<(std::ostream& out, const Seen& seen);

void make_async_fd_nonblocking(ibv_context* context);

// Reads (and acks) async events until `quiet` passes without one, or `limit`
// passes. The async fd must be non-blocking.
std::vector<Seen> read_events(ibv_context* context,
                              std::chrono::milliseconds quiet,
                              std::chrono::milliseconds limit);

// How many times `needle` occurs in `text` (overlapping ones too).
long count_of(const std::string& text, const std::string& needle);

// A shell command running in the background, its stdout and stderr going to
// `output`. Stopped with SIGTERM (and reaped) by stop() or the destructor.
class Spawned {
 public:
  Spawned(const std::string& command, std::string output);
  ~Spawned();
  Spawned(const Spawned&) = delete;
  Spawned& operator=(const Spawned&) = delete;

  // SIGTERM, then waits; returns the exit status (as waitpid gives it).
  int stop();
  std::string text() const;
  // Waits until the output contains `needle`; false after `limit`.
  bool wait_for_text(const std::string& needle, std::chrono::milliseconds limit) const;
  // Waits until the output contains `needle` `count` times, or `limit`
  // passed; returns how many times it does.
  long wait_for_count(const std::string& needle, long count, std::chrono::milliseconds limit) const;

 private:
  std::string output_;
  int pid_ = -1;
};

// A command the kernel may block (`rdma link delete` of a device some process
// holds), run on a thread of its own from construction.
class BlockingCommand {
 public:
  explicit BlockingCommand(const std::string& command);
  // How long it took, or nullopt when it has not returned within `limit`
  // (then ask again later: the thread goes on). Rethrows run_command's error.
  std::optional<std::chrono::milliseconds> wait(std::chrono::milliseconds limit);

 private:
  std::chrono::steady_clock::time_point started_;
  std::future<void> result_;
};

// Polls `cq` until `count` completions arrived or `timeout` passed; returns
// what arrived.
std::vector<ibv_wc> poll_completions(ibv_cq* cq, std::size_t count,
                                     std::chrono::milliseconds timeout);

}  // namespace ibev::testing

#endif  // IBEV_TESTS_SOFTROCE_RDMA_FIXTURE_H_
