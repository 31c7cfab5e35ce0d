// RcEndpoint: read-only, so a PSN edited on it cannot part from the QP's
// (issue #27: porting ibv_rc_pingpong's `my_dest.psn = lrand48()` stalled
// silently); its wire form is ibv_rc_pingpong's, byte for byte; bad text and
// fields wider than 24 bits are refused with a clear error.
#define BOOST_TEST_MODULE ibev_verbs_rc_endpoint
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>
#include <cctype>
#include <cstring>
#include <ostream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include <ibev/verbs/rc_endpoint.h>

namespace bdata = boost::unit_test::data;
using ibev::RcEndpoint;

namespace {

// The only way to a different PSN is a new endpoint: no field, and no
// accessor, can be assigned through.
static_assert(!std::is_assignable_v<decltype(std::declval<RcEndpoint&>().psn()),
                                    std::uint32_t>);
static_assert(!std::is_aggregate_v<RcEndpoint>);  // no public fields
// Still a plain value (bench/harness.cc sends its bytes between processes).
static_assert(std::is_trivially_copyable_v<RcEndpoint>);

ibv_gid gid_of(const unsigned char (&bytes)[16]) {
  ibv_gid gid{};
  std::memcpy(gid.raw, bytes, sizeof gid.raw);
  return gid;
}

struct Known {
  const char* name;
  std::uint16_t lid;
  std::uint32_t qp_num;
  std::uint32_t psn;
  unsigned char gid[16];
  // What ibv_rc_pingpong sends for it: "%04x:%06x:%06x:" and, for each
  // 32-bit word of the GID, "%08x" of htobe32(word): the bytes in order.
  const char* wire;
};
std::ostream& operator<<(std::ostream& out, const Known& k) { return out << k.name; }

const Known kKnown[] = {
    {"roce link-local",
     0,
     0x11,
     0xabcdef,
     {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0x00, 0xff, 0xfe, 0x12, 0x34, 0x56},
     "0000:000011:abcdef:fe800000000000005054" "00fffe123456"},
    {"roce ipv4-mapped",
     0,
     0xffffff,
     0,
     {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 2, 15},
     "0000:ffffff:000000:00000000000000000000ffff0a00020f"},
    {"infiniband with a lid",
     0xbeef,
     0x1234,
     0xffffff,
     {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 2, 0xc9, 0x03, 0, 0x0a, 0x0b, 0x0c},
     "beef:001234:ffffff:fe8000000000000000" "02c903000a0b0c"},
};

}  // namespace

BOOST_DATA_TEST_CASE(the_wire_form_is_ibv_rc_pingpongs, bdata::make(kKnown), k) {
  const RcEndpoint endpoint(k.qp_num, gid_of(k.gid), k.psn, k.lid);
  const auto wire = endpoint.to_wire();
  BOOST_TEST(std::string(wire.data()) == k.wire);
  BOOST_TEST(wire.back() == '\0');
  BOOST_TEST(std::strlen(wire.data()) + 1 == RcEndpoint::kWireSize);

  const RcEndpoint back = RcEndpoint::from_wire(std::string_view(wire.data(), wire.size()));
  BOOST_TEST((back == endpoint));
  BOOST_TEST(back.lid() == k.lid);
  BOOST_TEST(back.qp_num() == k.qp_num);
  BOOST_TEST(back.psn() == k.psn);
  BOOST_TEST(std::memcmp(back.gid().raw, k.gid, 16) == 0);
  // Without the NUL, and upper-case hex (sscanf's %x, which ibv_rc_pingpong
  // parses with, takes both).
  std::string upper = k.wire;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  BOOST_TEST((RcEndpoint::from_wire(upper) == endpoint));
}

struct Bad {
  const char* name;
  std::string wire;
  const char* says;
};
std::ostream& operator<<(std::ostream& out, const Bad& b) { return out << b.name; }

const std::string kGood = "0000:000011:abcdef:fe80000000000000505400fffe123456";

const Bad kBad[] = {
    {"empty", "", "0 characters, not 51"},
    {"one short", kGood.substr(0, 50), "50 characters, not 51"},
    {"one long", kGood + "0", "52 characters, not 51"},
    {"a non-hex lid", "000g" + kGood.substr(4), "the LID is not 4 hex digits"},
    {"a short qp number", "0000:00011::abcdef:fe80000000000000505400fffe123456",
     "the QP number is not 6 hex digits"},
    {"a separator missing", "0000-000011:abcdef:fe80000000000000505400fffe123456",
     "no ':' after the LID"},
    {"a non-hex psn", "0000:000011:abcdeg:fe80000000000000505400fffe123456",
     "the PSN is not 6 hex digits"},
    {"a non-hex gid", kGood.substr(0, 50) + "x", "the GID is not 2 hex digits"},
    {"text after the NUL is ignored, not before", std::string("0000:000011") + '\0' + "x",
     "11 characters, not 51"},
    {"bytes off the network are quoted escaped", "\x01" + kGood.substr(1),
     "in \"\\x01000:000011:abcdef:"},
};

BOOST_DATA_TEST_CASE(bad_wire_text_is_refused_naming_what_is_wrong, bdata::make(kBad), b) {
  BOOST_CHECK_EXCEPTION(RcEndpoint::from_wire(b.wire), std::invalid_argument,
                        [&](const std::invalid_argument& e) {
                          const std::string what = e.what();
                          BOOST_TEST_MESSAGE(what);
                          return what.find("RcEndpoint::from_wire") == 0 &&
                                 what.find(b.says) != std::string::npos;
                        });
}

BOOST_AUTO_TEST_CASE(fields_wider_than_24_bits_are_refused) {
  BOOST_CHECK_EXCEPTION(RcEndpoint(1, ibv_gid{}, 0x1000000), std::invalid_argument,
                        [](const std::invalid_argument& e) {
                          return std::string(e.what()).find("a PSN has 24 bits") !=
                                 std::string::npos;
                        });
  BOOST_CHECK_EXCEPTION(RcEndpoint(0x1000000, ibv_gid{}, 1), std::invalid_argument,
                        [](const std::invalid_argument& e) {
                          return std::string(e.what()).find("a QP number has 24 bits") !=
                                 std::string::npos;
                        });
  BOOST_CHECK_NO_THROW(RcEndpoint(0xffffff, ibv_gid{}, 0xffffff, 0xffff));
}
