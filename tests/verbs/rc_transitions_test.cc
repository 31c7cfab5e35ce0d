// What QueuePair::connect() sets on the way to RTS, for the link layers rxe
// cannot show: RoCE addresses by GRH, InfiniBand by LID with a GRH only
// across subnets; every ConnectOptions field reaches its attribute.
#define BOOST_TEST_MODULE ibev_verbs_rc_transitions
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>
#include <ostream>
#include <stdexcept>
#include <string>

#include <ibev/verbs/queue_pair.h>

namespace bdata = boost::unit_test::data;
using ibev::ConnectOptions;
using ibev::RcEndpoint;
using ibev::detail::rc_transitions;

namespace {

ibv_gid gid(std::uint64_t subnet, std::uint64_t interface) {
  ibv_gid g{};
  g.global.subnet_prefix = subnet;
  g.global.interface_id = interface;
  return g;
}

ibv_port_attr port(ibv_mtu active, std::uint8_t link_layer) {
  ibv_port_attr attr{};
  attr.active_mtu = active;
  attr.link_layer = link_layer;
  return attr;
}

struct Addressing {
  const char* name;
  std::uint8_t link_layer;
  std::uint64_t remote_subnet;
  bool grh;
  std::uint16_t dlid;
};
std::ostream& operator<<(std::ostream& out, const Addressing& a) { return out << a.name; }

const Addressing kAddressing[] = {
    {"roce", IBV_LINK_LAYER_ETHERNET, 0xfe80, true, 0},
    {"infiniband, same subnet", IBV_LINK_LAYER_INFINIBAND, 0xfe80, false, 0x17},
    {"infiniband, other subnet", IBV_LINK_LAYER_INFINIBAND, 0xbeef, true, 0x17},
    {"unspecified link layer is infiniband", IBV_LINK_LAYER_UNSPECIFIED, 0xfe80, false, 0x17},
};

}  // namespace

BOOST_DATA_TEST_CASE(grh_only_where_the_link_needs_it, bdata::make(kAddressing), a) {
  const RcEndpoint remote{0x1234, gid(a.remote_subnet, 2), 0xabcdef, 0x17};
  const auto steps = rc_transitions(remote, 0x123456, port(IBV_MTU_1024, a.link_layer),
                                    gid(0xfe80, 1), ConnectOptions{});
  BOOST_TEST(int(steps.rtr.ah_attr.is_global) == int(a.grh));
  BOOST_TEST(steps.rtr.ah_attr.dlid == a.dlid);
  if (a.grh) {
    BOOST_TEST(steps.rtr.ah_attr.grh.dgid.global.subnet_prefix == a.remote_subnet);
    BOOST_TEST(steps.rtr.ah_attr.grh.dgid.global.interface_id == 2u);
    BOOST_TEST(int(steps.rtr.ah_attr.grh.hop_limit) == 1);
  }
  BOOST_TEST(steps.rtr.dest_qp_num == 0x1234u);
  BOOST_TEST(steps.rtr.rq_psn == 0xabcdefu);
  BOOST_TEST(steps.rts.sq_psn == 0x123456u);
  BOOST_TEST(steps.rtr.path_mtu == IBV_MTU_1024);
}

BOOST_AUTO_TEST_CASE(every_option_reaches_its_attribute) {
  ConnectOptions o;
  o.port = 2;
  o.gid_index = 3;
  o.access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
  o.path_mtu = IBV_MTU_512;
  o.timeout = 20;
  o.retry_cnt = 4;
  o.rnr_retry = 5;
  o.min_rnr_timer = 6;
  o.max_rd_atomic = 8;
  o.max_dest_rd_atomic = 16;
  o.service_level = 3;
  o.traffic_class = 106;
  o.hop_limit = 64;
  o.pkey_index = 2;
  const auto steps = rc_transitions(RcEndpoint{1, gid(0xfe80, 2), 5, 0}, 9,
                                    port(IBV_MTU_4096, IBV_LINK_LAYER_ETHERNET),
                                    gid(0xfe80, 1), o);
  BOOST_TEST(int(steps.init.port_num) == 2);
  BOOST_TEST(steps.init.pkey_index == 2);
  BOOST_TEST(steps.init.qp_access_flags == unsigned(o.access_flags));
  BOOST_TEST(steps.rtr.path_mtu == IBV_MTU_512);
  BOOST_TEST(int(steps.rtr.min_rnr_timer) == 6);
  BOOST_TEST(int(steps.rtr.max_dest_rd_atomic) == 16);
  BOOST_TEST(int(steps.rtr.ah_attr.port_num) == 2);
  BOOST_TEST(int(steps.rtr.ah_attr.sl) == 3);
  BOOST_TEST(int(steps.rtr.ah_attr.grh.sgid_index) == 3);
  BOOST_TEST(int(steps.rtr.ah_attr.grh.traffic_class) == 106);
  BOOST_TEST(int(steps.rtr.ah_attr.grh.hop_limit) == 64);
  BOOST_TEST(int(steps.rts.timeout) == 20);
  BOOST_TEST(int(steps.rts.retry_cnt) == 4);
  BOOST_TEST(int(steps.rts.rnr_retry) == 5);
  BOOST_TEST(int(steps.rts.max_rd_atomic) == 8);
}

BOOST_AUTO_TEST_CASE(bad_remotes_are_refused_before_any_verb) {
  const auto ib = port(IBV_MTU_2048, IBV_LINK_LAYER_INFINIBAND);
  BOOST_CHECK_EXCEPTION(
      rc_transitions(RcEndpoint{1, gid(0xfe80, 2), 5, 0}, 9, ib, gid(0xfe80, 1), {}),
      std::invalid_argument, [](const std::invalid_argument& e) {
        return std::string(e.what()).find("no LID") != std::string::npos;
      });
}
