// ibev::RcEndpoint: what a peer needs to reach an RC QP (its number, a GID,
// the PSN it sends from, its LID on InfiniBand): what ibv_rc_pingpong
// exchanges, in ibv_rc_pingpong's own text form (to_wire/from_wire), so an
// ibev process and ibv_rc_pingpong can connect to each other.
//
// Read-only: a QP's own endpoint comes from QueuePair::endpoint() and says
// what connect() will do, and a peer's comes from the wire. ibv_rc_pingpong
// picks its PSN by editing its endpoint (`my_dest.psn = lrand48()`); ported
// onto an editable endpoint, that edit would reach the peer but never the QP,
// and the connection would stall with no error. Choose the PSN where the QP
// sends from it: QueuePairOptions::psn. Building an endpoint for your own QP
// by hand (RcEndpoint(qp->qp_num(), gid, some_psn)) is the same mistake:
// advertise qp->endpoint().
//
// A value type: copy it freely, from any thread.
#ifndef IBEV_VERBS_RC_ENDPOINT_H_
#define IBEV_VERBS_RC_ENDPOINT_H_

#include <infiniband/verbs.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ibev {

class RcEndpoint {
 public:
  // "LLLL:QQQQQQ:PPPPPP:" and the GID's 16 bytes as 32 hex digits, then a
  // NUL: the 52 bytes ibv_rc_pingpong sends (rdma-core's pingpong.c).
  static constexpr std::size_t kWireSize = 52;

  RcEndpoint() = default;
  // Throws std::invalid_argument for a QP number or PSN wider than 24 bits.
  RcEndpoint(std::uint32_t qp_num, const ibv_gid& gid, std::uint32_t psn,
             std::uint16_t lid = 0);

  std::uint32_t qp_num() const noexcept { return qp_num_; }
  const ibv_gid& gid() const noexcept { return gid_; }
  // The first PSN the QP sends with (24 bits): the peer's rq_psn.
  std::uint32_t psn() const noexcept { return psn_; }
  // The port's LID on InfiniBand, used when no GRH is needed; 0 on RoCE.
  std::uint16_t lid() const noexcept { return lid_; }

  // ibv_rc_pingpong's form, NUL-terminated: send all kWireSize bytes.
  std::array<char, kWireSize> to_wire() const noexcept;
  // Parses to_wire()'s form (the NUL and anything after it ignored; without
  // a NUL, `wire` must end with the GID). Throws std::invalid_argument naming
  // what is wrong and quoting the text.
  static RcEndpoint from_wire(std::string_view wire);

  friend bool operator==(const RcEndpoint& a, const RcEndpoint& b) noexcept;
  friend bool operator!=(const RcEndpoint& a, const RcEndpoint& b) noexcept {
    return !(a == b);
  }

 private:
  std::uint32_t qp_num_ = 0;
  ibv_gid gid_{};
  std::uint32_t psn_ = 0;
  std::uint16_t lid_ = 0;
};

namespace detail {
inline constexpr std::uint32_t kMax24Bits = 0xffffff;  // PSNs and QP numbers
// Throws std::invalid_argument, naming `what`, for a PSN wider than 24 bits.
void require_psn(const char* what, std::uint32_t psn);
}  // namespace detail

}  // namespace ibev

#endif  // IBEV_VERBS_RC_ENDPOINT_H_
