// The C API of devices and what is made on them (what verbs/ is in C++):
// devices and their clients, protection domains and memory regions,
// completion queues, shared receive queues, and queue pairs with their RC
// endpoints. The boundary and the helpers are capi/ibev_c_internal.h's.
#include <ibev/ibev_c.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ibev/core/event.h>
#include <ibev/core/handle.h>
#include <ibev/verbs/completion_queue.h>
#include <ibev/verbs/device.h>
#include <ibev/verbs/device_clients.h>
#include <ibev/verbs/prometheus_counters.h>
#include <ibev/verbs/protection_domain.h>
#include <ibev/verbs/queue_pair.h>
#include <ibev/verbs/rc_endpoint.h>
#include <ibev/verbs/shared_receive_queue.h>
#include "ibev_c_internal.h"

using namespace ibev::detail::capi;

namespace ibev {
namespace detail {
namespace capi {

ibev_rc_endpoint to_c(const ibev::RcEndpoint& endpoint) noexcept {
  return {endpoint.qp_num(), endpoint.gid(), endpoint.psn(), endpoint.lid()};
}
ibev::RcEndpoint from_c(const ibev_rc_endpoint& endpoint) {
  return ibev::RcEndpoint(endpoint.qp_num, endpoint.gid, endpoint.psn, endpoint.lid);
}

ibev::ConnectOptions connect_options(const ibev_connect_attr* attr) {
  ibev::ConnectOptions options;
  if (attr == nullptr) return options;
  options.port = attr->port;
  options.gid_index = attr->gid_index;
  options.access_flags = attr->access_flags;
  if (bits_of(attr->path_mtu) != 0) {
    options.path_mtu = enum_in_range<ibv_mtu>(attr->path_mtu, IBV_MTU_4096, "attr->path_mtu");
  }
  options.timeout = attr->timeout;
  options.retry_cnt = attr->retry_cnt;
  options.rnr_retry = attr->rnr_retry;
  options.min_rnr_timer = attr->min_rnr_timer;
  options.max_rd_atomic = attr->max_rd_atomic;
  options.max_dest_rd_atomic = attr->max_dest_rd_atomic;
  options.service_level = attr->service_level;
  options.traffic_class = attr->traffic_class;
  options.hop_limit = attr->hop_limit;
  options.pkey_index = attr->pkey_index;
  return options;
}

}  // namespace capi
}  // namespace detail
}  // namespace ibev

extern "C" {

// ------------------------------------------------------------------ devices

ibev_device* ibev_device_open(ibev_dispatcher* dispatcher, const char* name) {
  return make_call("ibev_device_open", [&] {
    return hand_out<ibev_device>(ibev::Device::open(require(dispatcher, "dispatcher").dispatcher,
                                                    name != nullptr ? name : ""));
  });
}

ibev_device* ibev_device_ref(ibev_device* device) {
  return make_call("ibev_device_ref",
                   [&] { return hand_out<ibev_device>(require(device, "device").ref); });
}

void ibev_device_destroy(ibev_device* device) { take_back(device); }

ibv_context* ibev_device_context(const ibev_device* device) {
  return device != nullptr ? device->ref->context() : nullptr;
}

const char* ibev_device_name(const ibev_device* device) {
  return device != nullptr ? device->ref->name().c_str() : nullptr;
}

ibev_device_loss ibev_device_lost(const ibev_device* device) {
  return device != nullptr ? static_cast<ibev_device_loss>(device->ref->loss()) : IBEV_LOSS_NONE;
}

ibev_handle* ibev_device_listen(ibev_device* device, const ibev_filter* filter,
                                ibev_event_fn handler, void* context) {
  return make_call("ibev_device_listen", [&] {
    ibev::Handler call = event_handler(&require(handler, "handler"), context);
    return hand_out<ibev_handle>(
        require(device, "device").ref->on_event(to_filter(filter), std::move(call)));
  });
}

ibev_clients* ibev_clients_create(ibev_dispatcher* dispatcher) {
  return make_call("ibev_clients_create", [&] {
    return std::make_unique<ibev_clients>(require(dispatcher, "dispatcher").dispatcher).release();
  });
}

void ibev_clients_destroy(ibev_clients* clients) { take_back(clients); }

ibev_handle* ibev_clients_register(ibev_clients* clients, const ibev_client* client) {
  return make_call("ibev_clients_register", [&] {
    const ibev_client c = require(client, "client");
    if (c.add == nullptr || c.remove == nullptr) {
      throw std::invalid_argument("client's add and remove are required");
    }
    // The ibev_device each of this client's calls is handed, from its add to
    // the end of its remove. Only the dispatching thread touches it (add and
    // remove run there, one at a time).
    auto lent = std::make_shared<std::map<const ibev::Device*, std::unique_ptr<ibev_device>>>();
    ibev::DeviceClient registered;
    registered.name = c.name != nullptr ? c.name : "C client";
    registered.add = [c, lent](const std::shared_ptr<ibev::Device>& device) {
      auto& handed = (*lent)[device.get()];
      handed = std::make_unique<ibev_device>(ibev_device{device});
      c.add(handed.get(), c.context);
    };
    registered.remove = [c, lent](const std::shared_ptr<ibev::Device>& device,
                                  ibev::DeviceLoss loss) {
      const auto handed = lent->find(device.get());
      if (handed == lent->end()) return;
      const std::unique_ptr<ibev_device> ending = std::move(handed->second);
      lent->erase(handed);
      c.remove(ending.get(), static_cast<ibev_device_loss>(loss), c.context);
    };
    return hand_out<ibev_handle>(
        require(clients, "clients").clients.register_client(std::move(registered)));
  });
}

// ------------------------------------------------------ domains and regions

ibev_pd* ibev_pd_create(ibev_device* device) {
  return make_call("ibev_pd_create", [&] {
    return hand_out<ibev_pd>(ibev::ProtectionDomain::create(require(device, "device").ref));
  });
}

void ibev_pd_destroy(ibev_pd* pd) { take_back(pd); }

ibv_pd* ibev_pd_get(const ibev_pd* pd) { return pd != nullptr ? pd->ref->get() : nullptr; }

ibev_mr* ibev_mr_create(ibev_pd* pd, void* address, size_t length, int access) {
  return make_call("ibev_mr_create", [&] {
    return hand_out<ibev_mr>(
        ibev::MemoryRegion::create(require(pd, "pd").ref, address, length, access));
  });
}

void ibev_mr_destroy(ibev_mr* mr) { take_back(mr); }

ibv_mr* ibev_mr_get(const ibev_mr* mr) { return mr != nullptr ? mr->ref->get() : nullptr; }

// -------------------------------------------------------- completion queues

ibev_cq* ibev_cq_create(ibev_device* device, const ibev_cq_attr* attr,
                        ibev_completion_fn on_completion, ibev_event_fn on_event, void* context) {
  return make_call("ibev_cq_create", [&] {
    ibev::CompletionQueue::Options options;
    if (attr != nullptr) {
      if (attr->cqe != 0) options.cqe = attr->cqe;
      options.completion.mode =
          enum_in_range<ibev::CompletionMode>(attr->mode, IBEV_CQ_POLLED, "attr->mode");
      if (attr->ack_batch != 0) options.completion.ack_batch = attr->ack_batch;
      if (attr->poll_batch != 0) options.completion.poll_batch = attr->poll_batch;
      if (attr->budget != 0) options.completion.budget = attr->budget;
      options.completion.solicited_only = attr->solicited_only != 0;
      if (attr->dispatcher != nullptr) options.dispatcher = &attr->dispatcher->dispatcher;
      options.comp_vector = attr->comp_vector;
    }
    std::shared_ptr<ibev::Device> on = require(device, "device").ref;
    ibev::Handler events = event_handler(on_event, context);
    if (options.completion.mode == ibev::CompletionMode::kPolled) {
      if (on_completion != nullptr) {
        throw std::invalid_argument("a polled CQ takes no completion function");
      }
      return hand_out<ibev_cq>(
          ibev::CompletionQueue::create_polled(std::move(on), std::move(events), options));
    }
    if (on_completion == nullptr) throw std::invalid_argument("on_completion is NULL");
    auto completions = [on_completion, context](const ibev::CompletionBatch& batch) {
      on_completion(batch.cq, batch.data, batch.size, context);
    };
    return hand_out<ibev_cq>(ibev::CompletionQueue::create(std::move(on), std::move(completions),
                                                           std::move(events), options));
  });
}

void ibev_cq_destroy(ibev_cq* cq) { take_back(cq); }

ibv_cq* ibev_cq_get(const ibev_cq* cq) { return cq != nullptr ? cq->ref->get() : nullptr; }

// ---------------------------------------------------- shared receive queues

ibev_srq* ibev_srq_create(ibev_pd* pd, uint32_t max_wr, uint32_t max_sge, ibev_event_fn on_event,
                          void* context) {
  return make_call("ibev_srq_create", [&] {
    ibev::SharedReceiveQueue::Options options;
    if (max_wr != 0) options.max_wr = max_wr;
    if (max_sge != 0) options.max_sge = max_sge;
    return hand_out<ibev_srq>(ibev::SharedReceiveQueue::create(
        require(pd, "pd").ref, event_handler(on_event, context), options));
  });
}

void ibev_srq_destroy(ibev_srq* srq) { take_back(srq); }

ibv_srq* ibev_srq_get(const ibev_srq* srq) { return srq != nullptr ? srq->ref->get() : nullptr; }

int ibev_srq_arm_limit(ibev_srq* srq, uint32_t limit) {
  return status_call("ibev_srq_arm_limit", [&] { require(srq, "srq").ref->arm_limit(limit); });
}

// ------------------------------------------------------------- queue pairs

ibev_qp* ibev_qp_create(ibev_pd* pd, const ibev_qp_attr* attr, ibev_event_fn on_event,
                        void* context) {
  return make_call("ibev_qp_create", [&] {
    const ibev_qp_attr& a = require(attr, "attr");
    ibev::QueuePair::Options options;
    options.send_cq = require(a.send_cq, "attr->send_cq").ref;
    options.recv_cq = require(a.recv_cq, "attr->recv_cq").ref;
    if (a.srq != nullptr) options.srq = a.srq->ref;
    if (bits_of(a.qp_type) != 0) {
      options.type = enum_in_range<ibv_qp_type>(a.qp_type, IBV_QPT_DRIVER, "attr->qp_type");
    }
    if (a.cap.max_send_wr != 0) options.cap.max_send_wr = a.cap.max_send_wr;
    if (a.cap.max_recv_wr != 0) options.cap.max_recv_wr = a.cap.max_recv_wr;
    if (a.cap.max_send_sge != 0) options.cap.max_send_sge = a.cap.max_send_sge;
    if (a.cap.max_recv_sge != 0) options.cap.max_recv_sge = a.cap.max_recv_sge;
    options.cap.max_inline_data = a.cap.max_inline_data;
    options.signal_all = a.sq_sig_all != 0;
    if (a.fixed_psn != 0) options.psn = a.psn;
    options.drain_on_destroy = a.drain_on_destroy != 0;
    return hand_out<ibev_qp>(
        ibev::QueuePair::create(require(pd, "pd").ref, event_handler(on_event, context), options));
  });
}

void ibev_qp_destroy(ibev_qp* qp) { take_back(qp); }

ibv_qp* ibev_qp_get(const ibev_qp* qp) { return qp != nullptr ? qp->ref->get() : nullptr; }

int ibev_rc_endpoint_to_wire(const ibev_rc_endpoint* endpoint,
                             char wire[IBEV_RC_ENDPOINT_WIRE_SIZE]) {
  static_assert(IBEV_RC_ENDPOINT_WIRE_SIZE == ibev::RcEndpoint::kWireSize);
  return status_call("ibev_rc_endpoint_to_wire", [&] {
    const auto text = from_c(require(endpoint, "endpoint")).to_wire();
    std::copy(text.begin(), text.end(), &require(wire, "wire"));
  });
}

int ibev_rc_endpoint_from_wire(const char* wire, size_t length, ibev_rc_endpoint* endpoint) {
  return status_call("ibev_rc_endpoint_from_wire", [&] {
    require(endpoint, "endpoint") =
        to_c(ibev::RcEndpoint::from_wire(std::string_view(&require(wire, "wire"), length)));
  });
}

void ibev_connect_attr_init(ibev_connect_attr* attr) {
  if (attr == nullptr) return;
  const ibev::ConnectOptions d;
  *attr = ibev_connect_attr{};
  attr->port = d.port;
  attr->gid_index = d.gid_index;
  attr->access_flags = d.access_flags;
  attr->timeout = d.timeout;
  attr->retry_cnt = d.retry_cnt;
  attr->rnr_retry = d.rnr_retry;
  attr->min_rnr_timer = d.min_rnr_timer;
  attr->max_rd_atomic = d.max_rd_atomic;
  attr->max_dest_rd_atomic = d.max_dest_rd_atomic;
  attr->service_level = d.service_level;
  attr->traffic_class = d.traffic_class;
  attr->hop_limit = d.hop_limit;
  attr->pkey_index = d.pkey_index;
}

int ibev_qp_endpoint(const ibev_qp* qp, uint8_t port, int gid_index, ibev_rc_endpoint* endpoint) {
  return status_call("ibev_qp_endpoint", [&] {
    require(endpoint, "endpoint") = to_c(require(qp, "qp").ref->endpoint(port, gid_index));
  });
}

int ibev_qp_to_init(ibev_qp* qp, const ibev_connect_attr* attr) {
  return status_call("ibev_qp_to_init",
                     [&] { require(qp, "qp").ref->to_init(connect_options(attr)); });
}

int ibev_qp_reset(ibev_qp* qp) {
  return status_call("ibev_qp_reset", [&] { require(qp, "qp").ref->reset(); });
}

int ibev_qp_connect(ibev_qp* qp, const ibev_rc_endpoint* remote, const ibev_connect_attr* attr) {
  return status_call("ibev_qp_connect", [&] {
    require(qp, "qp").ref->connect(from_c(require(remote, "remote")), connect_options(attr));
  });
}

int ibev_qp_drain(ibev_qp* qp, int timeout_ms, ibev_drain_report* report) {
  return status_call("ibev_qp_drain", [&] {
    if (timeout_ms < 0) {
      throw std::invalid_argument("timeout_ms is " + std::to_string(timeout_ms) +
                                  "; it must be 0 (5000) or above");
    }
    ibev::DrainOptions options;
    if (timeout_ms != 0) options.timeout = std::chrono::milliseconds(timeout_ms);
    const ibev::DrainReport drained = require(qp, "qp").ref->drain(options);
    if (report == nullptr) return;
    report->send_drained = drained.send_drained ? 1 : 0;
    report->receive_drained = drained.receive_drained ? 1 : 0;
    report->last_wqe_reached =
        drained.last_wqe_reached.has_value() ? (*drained.last_wqe_reached ? 1 : 0) : -1;
  });
}

// ------------------------------------------------------------------ metrics

int ibev_write_metrics(const ibev_dispatcher* dispatcher, ibev_device* const* devices,
                       size_t count, char* buffer, size_t size, size_t* length) {
  return status_call("ibev_write_metrics", [&] {
    const ibev::Dispatcher& serving = require(dispatcher, "dispatcher").dispatcher;
    if (count > 0 && devices == nullptr) throw std::invalid_argument("devices is NULL");
    std::vector<std::shared_ptr<ibev::Device>> listed;
    listed.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      listed.push_back(require(devices[i], ("devices[" + std::to_string(i) + "]").c_str()).ref);
    }
    std::ostringstream text;
    ibev::write_metrics(text, serving, listed);
    write_text(std::move(text).str(), buffer, size, length);
  });
}

}  // extern "C"
