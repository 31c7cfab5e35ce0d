#include "tests/softroce/cm_fixture.h"

#include <arpa/inet.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <system_error>

#include "tests/softroce/rdma_fixture.h"
#include "tests/support/testing.h"

namespace ibev::testing {

using namespace std::chrono_literals;

std::string cm_host() { return env_or("IBEV_TEST_ADDRESS", "fd00::1"); }
std::string cm_host2() { return env_or("IBEV_TEST_ADDRESS2", "fd00::2"); }

void put_back_policy_routes() {
  // Tables 10 and 11: softroce_run.sh's write_device_setup.
  run_command("ip -6 route replace " + cm_host2() + "/128 dev " + test_netdev() +
              " table 10 && ip -6 route replace " + cm_host() + "/128 dev " + test_netdev2() +
              " table 11");
}

void give_netdev_its_address() {
  run_command("ip -6 addr replace " + cm_host() + "/64 dev " + test_netdev() + " nodad");
  // The GID table lists the address fully written out: fd00:0000:...:0001.
  in6_addr address{};
  if (inet_pton(AF_INET6, cm_host().c_str(), &address) != 1) {
    throw std::runtime_error("not an IPv6 address: " + cm_host());
  }
  char expected[40];
  std::snprintf(expected, sizeof expected,
                "%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x",
                address.s6_addr[0], address.s6_addr[1], address.s6_addr[2], address.s6_addr[3],
                address.s6_addr[4], address.s6_addr[5], address.s6_addr[6], address.s6_addr[7],
                address.s6_addr[8], address.s6_addr[9], address.s6_addr[10], address.s6_addr[11],
                address.s6_addr[12], address.s6_addr[13], address.s6_addr[14], address.s6_addr[15]);
  const std::string gids = "/sys/class/infiniband/" + test_device() + "/ports/1/gids/";
  const auto listed = [&] {
    for (int index = 0; index < 16; ++index) {
      std::ifstream gid(gids + std::to_string(index));
      std::string text;
      if (std::getline(gid, text) && text == expected) return true;
    }
    return false;
  };
  if (eventually(listed, 5s, 10ms)) return;
  throw std::runtime_error("no GID " + std::string(expected) + " on " + test_device() + " in 5 s");
}

std::string said(const CmEvent& event) {
  std::string name = event.name();
  const std::string prefix = "RDMA_CM_EVENT_";
  if (name.rfind(prefix, 0) == 0) name = name.substr(prefix.size());
  return event.status == 0 ? name : name + " " + std::to_string(event.status);
}

std::string joined(const std::vector<std::string>& lines) {
  std::string all;
  for (const auto& line : lines) all += (all.empty() ? "" : ", ") + line;
  return all;
}

Endpoint::Endpoint(Env& env, std::size_t bytes)
    : memory(bytes),
      mr(MemoryRegion::create(
          env.pd, memory.data(), memory.size(),
          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)),
      cq(CompletionQueue::create(
          env.device,
          [this](const CompletionBatch& batch) {
            for (const ibv_wc& wc : batch) on_completion(wc);
          },
          nullptr)),
      qp(make_qp(env)) {}

std::shared_ptr<QueuePair> Endpoint::make_qp(Env& env) {
  QueuePairOptions options;
  options.send_cq = cq;
  options.recv_cq = cq;
  return QueuePair::create(
      env.pd, [this](const Event& event) { qp_events.add(describe_event_code(event.code())); },
      options);
}

std::uint64_t Endpoint::address(std::size_t offset) {
  return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(at(offset)));
}

void Endpoint::post_recv(std::size_t offset, std::uint32_t length, std::uint64_t wr_id) {
  ibv_sge sge{address(offset), length, mr->lkey()};
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  qp->post_recv(wr);
}

void Endpoint::post(ibv_wr_opcode opcode, std::size_t offset, std::uint32_t length,
                    std::uint64_t wr_id, std::uint64_t remote, std::uint32_t rkey) {
  ibv_sge sge{address(offset), length, mr->lkey()};
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = opcode;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = remote;
  wr.wr.rdma.rkey = rkey;
  qp->post_send(wr);
}

Messenger::Messenger(Env& env) : endpoint(env) {
  endpoint.on_completion = [this](const ibv_wc& wc) {
    if (wc.status == IBV_WC_WR_FLUSH_ERR) {
      log.add("flushed");
    } else if (wc.status != IBV_WC_SUCCESS) {
      log.add(std::string("error ") + ibv_wc_status_str(wc.status));
    } else if (wc.opcode == IBV_WC_RECV) {
      // Reposted before it is told: a test that goes on once it reads the
      // line may close the QP.
      const std::string text = endpoint.at(wc.wr_id * kSlot);
      endpoint.post_recv(wc.wr_id * kSlot, kSlot, wc.wr_id);
      log.add("received " + text);
    }
  };
}

void Messenger::start(CmId& id) {
  id.init_qp(*endpoint.qp);
  for (std::uint64_t slot = 1; slot <= 4; ++slot) endpoint.post_recv(slot * kSlot, kSlot, slot);
}

void Messenger::send(const std::string& text) {
  std::snprintf(endpoint.at(0), kSlot, "%s", text.c_str());
  endpoint.post(IBV_WR_SEND, 0, static_cast<std::uint32_t>(text.size() + 1), 0);
}

Server::Server(Env& env, std::shared_ptr<CmEventChannel> channel, Lines& log, Policy policy,
               const std::string& host)
    : env_(env), log_(log), policy_(policy) {
  listener_ = CmId::create(std::move(channel), [this](const CmEvent& event) { heard(event); });
  listener_->listen(CmAddress::parse(host, 0), 64);
}

Server::~Server() {
  std::vector<Child> children;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    children.swap(children_);
  }
  for (auto& child : children) child.id->close();
  listener_->close();
}

Messenger* Server::messenger(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& child : children_) {
    if (child.name == name) return child.messenger.get();
  }
  return nullptr;
}

CmId* Server::child(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& child : children_) {
    if (child.name == name) return child.id.get();
  }
  return nullptr;
}

void Server::heard(const CmEvent& event) {
  if (event.id == listener_.get()) {
    log_.add("listener: " + said(event));
    if (event.code == RDMA_CM_EVENT_CONNECT_REQUEST) request(event);
    if (event.code == RDMA_CM_EVENT_DEVICE_REMOVAL) event.id->close();
    return;
  }
  std::string name = "unknown";
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& child : children_) {
      if (child.id.get() == event.id) name = child.name;
    }
  }
  log_.add(name + ": " + said(event));
  // The peer's DREQ waits for this side's DREP: rdma_disconnect sends it.
  if (event.code == RDMA_CM_EVENT_DISCONNECTED) event.id->disconnect();
  // The device is going: let it go (its QP goes with the device).
  if (event.code == RDMA_CM_EVENT_DEVICE_REMOVAL) event.id->close();
}

void Server::request(const CmEvent& event) {
  if (event.new_id == nullptr) {
    log_.add("listener: CONNECT_REQUEST without a new id");
    return;
  }
  if (policy_ == Policy::kReject) {
    event.new_id->reject({'b', 'u', 's', 'y'});
    return;  // dropping the new id here destroys it inside the handler
  }
  Child child;
  child.name = "child" + (event.private_data.empty()
                              ? std::to_string(arrivals_)
                              : std::to_string(static_cast<int>(event.private_data[0])));
  ++arrivals_;
  child.id = event.new_id;
  if (child.id->device_name() != env_.device->name()) {
    log_.add(child.name + ": on the wrong device, " + child.id->device_name());
  }
  child.messenger = std::make_unique<Messenger>(env_);
  try {
    child.messenger->start(*child.id);
    child.id->accept(child.messenger->endpoint.qp);
  } catch (const std::system_error& e) {
    // The client may be gone already (it closed its id mid-connect): the CM
    // refuses the QP's attributes then (6.12: EINVAL at RTS).
    log_.add(child.name + ": accept failed: " + e.what());
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  children_.push_back(std::move(child));
}

Client::Client(Env& env, const std::shared_ptr<CmEventChannel>& channel, Lines& log,
               std::string client_name, std::uint16_t port, std::vector<std::uint8_t> private_data,
               const std::string& host, const std::string& source)
    : name(std::move(client_name)), messenger(env) {
  CmConnectOptions options;
  options.private_data = std::move(private_data);
  id = CmId::create(channel, [this, &log, &env, options](const CmEvent& event) {
    if (event.code == RDMA_CM_EVENT_REJECTED) {
      rejection.assign(event.private_data.begin(), event.private_data.end());
    }
    log.add(name + ": " + said(event));
    if (event.code == RDMA_CM_EVENT_ADDR_RESOLVED) {
      if (event.id->device_name() != env.device->name()) {
        log.add(name + ": on the wrong device, " + event.id->device_name());
      }
      event.id->resolve_route(2000ms);
    } else if (event.code == RDMA_CM_EVENT_ROUTE_RESOLVED) {
      messenger.start(*event.id);
      event.id->connect(messenger.endpoint.qp, options);
    } else if (event.code == RDMA_CM_EVENT_DISCONNECTED) {
      event.id->disconnect();  // the DREP, if the server disconnected
    } else if (event.code == RDMA_CM_EVENT_DEVICE_REMOVAL) {
      event.id->close();
    }
  });
  const CmAddress from = source.empty() ? CmAddress{} : CmAddress::parse(source, 0);
  id->resolve_addr(source.empty() ? nullptr : &from, CmAddress::parse(host, port), 2000ms);
}

}  // namespace ibev::testing
