// The CM's steps of a QP, as librdmacm takes a QP of rdma_create_qp through
// them: each with the attributes the CM computes (rdma_init_qp_attr).
#include <rdma/rdma_cma.h>

#include <cerrno>
#include <string>

#include "cm_state.h"

namespace ibev::detail {
namespace {

const char* state_name(ibv_qp_state state) {
  switch (state) {
    case IBV_QPS_INIT:
      return "INIT";
    case IBV_QPS_RTR:
      return "RTR";
    case IBV_QPS_RTS:
      return "RTS";
    default:
      return "?";
  }
}

const char* modify_step(ibv_qp_state state) {
  switch (state) {
    case IBV_QPS_INIT:
      return "ibv_modify_qp(INIT)";
    case IBV_QPS_RTR:
      return "ibv_modify_qp(RTR)";
    case IBV_QPS_RTS:
      return "ibv_modify_qp(RTS)";
    default:
      return "ibv_modify_qp";
  }
}

}  // namespace

void move_qp(rdma_cm_id* id, QueuePair& qp, ibv_qp_state state,
             std::optional<std::uint8_t> rd_atomic) {
  ibv_qp_attr attr{};
  int mask = 0;
  attr.qp_state = state;
  if (rdma_init_qp_attr(id, &attr, &mask) != 0) {
    throw_system_error(std::string("rdma_init_qp_attr(") + state_name(state) + ")", errno);
  }
  if (rd_atomic && state == IBV_QPS_RTR) attr.max_dest_rd_atomic = *rd_atomic;
  if (rd_atomic && state == IBV_QPS_RTS) attr.max_rd_atomic = *rd_atomic;
  qp.modify(attr, mask, modify_step(state));
}

void move_to_error(QueuePair& qp) noexcept {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  if (ibv_qp* raw = qp.get()) ibv_modify_qp(raw, &attr, IBV_QP_STATE);
}

}  // namespace ibev::detail
