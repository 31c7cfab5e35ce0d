#include "tests/softroce/rdma_fixture.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <system_error>
#include <memory>
#include <fstream>
#include <ostream>
#include <sstream>

#include <ibev/core/event.h>

extern "C" char** environ;

namespace ibev::testing {
namespace {

[[noreturn]] void throw_errno(const char* verb, int error) {
  throw std::system_error(error, std::generic_category(), verb);
}

void modify(ibv_qp* qp, ibv_qp_attr& attr, int mask, const char* step) {
  // ibv_modify_qp returns the errno value itself.
  if (int rc = ibv_modify_qp(qp, &attr, mask); rc != 0) {
    throw_errno(step, rc);
  }
}

}  // namespace

std::string env_or(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : fallback;
}

void run_command(const std::string& command) {
  const int status = std::system(command.c_str());
  if (status != 0) {
    throw std::runtime_error("command failed (status " +
                             std::to_string(status) + "): " + command);
  }
}

void add_test_device_if_gone() {
  run_command("rdma link show " + test_device() + "/1 >/dev/null 2>&1 || rdma link add " +
              test_device() + " type rxe netdev " + test_netdev());
}

std::string command_output(const std::string& command) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  if (!pipe) throw_errno("popen", errno);
  std::string output;
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe.get())) > 0;) {
    output.append(buffer, n);
  }
  const bool read_failed = std::ferror(pipe.get()) != 0;
  const int status = pclose(pipe.release());
  if (status == -1) throw_errno("pclose", errno);
  if (read_failed) throw std::runtime_error("reading the output failed: " + command);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw std::runtime_error(
        "command failed (" +
        (WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status))
                           : "signal " + std::to_string(WTERMSIG(status))) +
        "): " + command);
  }
  return output;
}

std::string rdma_objects_of(const std::string& device) {
  std::istringstream lines(command_output("rdma resource show"));
  for (std::string line; std::getline(lines, line);) {
    const auto name = line.find(": ");
    if (name == std::string::npos) continue;
    const std::string rest = line.substr(name + 2);
    if (rest.rfind(device + ":", 0) == 0) return rest;
  }
  return {};
}

ContextPtr open_device(const std::string& name) {
  int count = 0;
  std::unique_ptr<ibv_device*, void (*)(ibv_device**)> list(
      ibv_get_device_list(&count), ibv_free_device_list);
  if (!list) throw_errno("ibv_get_device_list", errno);
  for (int i = 0; i < count; ++i) {
    if (name == ibv_get_device_name(list.get()[i])) {
      ContextPtr context(ibv_open_device(list.get()[i]));
      if (!context) throw_errno("ibv_open_device", errno);
      return context;
    }
  }
  throw std::runtime_error("no RDMA device named " + name);
}

ibv_gid query_gid0(ibv_context* context) {
  ibv_gid gid{};
  if (ibv_query_gid(context, 1, 0, &gid) != 0) throw_errno("ibv_query_gid", errno);
  return gid;
}

void connect_rc(ibv_qp* qp, std::uint32_t remote_qpn, const ibv_gid& remote_gid,
                std::uint32_t remote_psn, std::uint32_t own_psn) {
  ibv_port_attr port{};
  if (int rc = ibv_query_port(qp->context, 1, &port); rc != 0) {
    throw_errno("ibv_query_port", rc);
  }
  ibv_qp_attr init{};
  init.qp_state = IBV_QPS_INIT;
  init.port_num = 1;
  init.pkey_index = 0;
  init.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  modify(qp, init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
         "ibv_modify_qp(INIT)");

  ibv_qp_attr rtr{};
  rtr.qp_state = IBV_QPS_RTR;
  rtr.path_mtu = port.active_mtu;
  rtr.dest_qp_num = remote_qpn;
  rtr.rq_psn = remote_psn;
  rtr.max_dest_rd_atomic = 1;
  rtr.min_rnr_timer = 12;
  rtr.ah_attr.is_global = 1;
  rtr.ah_attr.grh.dgid = remote_gid;
  rtr.ah_attr.grh.sgid_index = 0;
  rtr.ah_attr.grh.hop_limit = 1;
  rtr.ah_attr.port_num = 1;
  modify(qp, rtr,
         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
         "ibv_modify_qp(RTR)");

  ibv_qp_attr rts{};
  rts.qp_state = IBV_QPS_RTS;
  rts.timeout = 14;
  rts.retry_cnt = 7;
  rts.rnr_retry = 7;
  rts.sq_psn = own_psn;
  rts.max_rd_atomic = 1;
  modify(qp, rts,
         IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
             IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
         "ibv_modify_qp(RTS)");
}

void connect_rc_pair(ibv_qp* a, ibv_qp* b) {
  const ibv_gid gid = query_gid0(a->context);
  connect_rc(a, b->qp_num, gid, 0, 0);
  connect_rc(b, a->qp_num, gid, 0, 0);
}

std::ostream& operator<<(std::ostream& out, const Seen& seen) {
  return out << ibv_event_type_str(static_cast<ibv_event_type>(seen.code))
             << " on port " << seen.port;
}

void make_async_fd_nonblocking(ibv_context* context) {
  const int flags = ::fcntl(context->async_fd, F_GETFL);
  if (flags < 0 || ::fcntl(context->async_fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    throw_errno("fcntl(async_fd, O_NONBLOCK)", errno);
  }
}

std::vector<Seen> read_events(ibv_context* context,
                              std::chrono::milliseconds quiet,
                              std::chrono::milliseconds limit) {
  std::vector<Seen> seen;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd pfd{context->async_fd, POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(quiet.count())) <= 0) break;
    ibv_async_event raw;
    if (ibv_get_async_event(context, &raw) != 0) continue;  // EAGAIN
    const ibev::Event event = ibev::Event::from_async(context, raw);
    ibv_ack_async_event(&raw);
    seen.push_back({event.code(), event.port().value_or(-1)});
  }
  return seen;
}

Spawned::Spawned(const std::string& command, std::string output)
    : output_(std::move(output)) {
  const std::string shell = "exec " + command + " > " + output_ + " 2>&1";
  const char* argv[] = {"/bin/sh", "-c", shell.c_str(), nullptr};
  pid_t pid = -1;
  if (const int rc = posix_spawn(&pid, "/bin/sh", nullptr, nullptr,
                                 const_cast<char**>(argv), environ);
      rc != 0) {
    throw_errno("posix_spawn", rc);
  }
  pid_ = pid;
}

Spawned::~Spawned() { stop(); }

int Spawned::stop() {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  return status;
}

std::string Spawned::text() const {
  std::ifstream in(output_);
  std::stringstream all;
  all << in.rdbuf();
  return all.str();
}

bool Spawned::wait_for_text(const std::string& needle,
                            std::chrono::milliseconds limit) const {
  return wait_for_count(needle, 1, limit) >= 1;
}

long Spawned::wait_for_count(const std::string& needle, long count,
                             std::chrono::milliseconds limit) const {
  long seen = 0;
  static_cast<void>(eventually(
      [&] {
        seen = count_of(text(), needle);
        return seen >= count;
      },
      limit, std::chrono::milliseconds(20)));
  return seen;
}

long count_of(const std::string& text, const std::string& needle) {
  long n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

std::vector<ibv_wc> poll_completions(ibv_cq* cq, std::size_t count,
                                     std::chrono::milliseconds timeout) {
  std::vector<ibv_wc> got;
  static_cast<void>(eventually(
      [&] {
        // Polled dry before a pause: a pause only when the CQ is empty.
        for (int n = 1; n > 0 && got.size() < count;) {
          ibv_wc wc[8];
          n = ibv_poll_cq(cq, 8, wc);
          if (n < 0) throw std::runtime_error("ibv_poll_cq failed");
          got.insert(got.end(), wc, wc + n);
        }
        return got.size() >= count;
      },
      timeout, std::chrono::microseconds(100)));
  return got;
}

BlockingCommand::BlockingCommand(const std::string& command)
    : started_(std::chrono::steady_clock::now()),
      result_(std::async(std::launch::async, [command] { run_command(command); })) {}

std::optional<std::chrono::milliseconds> BlockingCommand::wait(std::chrono::milliseconds limit) {
  if (result_.wait_for(limit) != std::future_status::ready) return std::nullopt;
  result_.get();
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               started_);
}

}  // namespace ibev::testing
