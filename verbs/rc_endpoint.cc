#include <ibev/verbs/rc_endpoint.h>

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

namespace ibev {

namespace {

// The fields' widths in hex digits, each but the last followed by ':'.
constexpr std::size_t kLidDigits = 4, kQpnDigits = 6, kPsnDigits = 6, kGidDigits = 32;
constexpr std::size_t kTextSize = kLidDigits + kQpnDigits + kPsnDigits + kGidDigits + 3;
static_assert(kTextSize + 1 == RcEndpoint::kWireSize);

int hex_digit(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Bytes from the network, quoted printable: anything else as \xHH.
std::string quoted(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out += c;
    } else {
      char escaped[5];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", static_cast<unsigned char>(c));
      out += escaped;
    }
  }
  return out + '"';
}

[[noreturn]] void bad_wire(std::string_view wire, const std::string& why) {
  throw std::invalid_argument("RcEndpoint::from_wire: " + why + ", in " + quoted(wire) +
                              " (expected LLLL:QQQQQQ:PPPPPP:" + std::string(kGidDigits, 'G') +
                              ", in hex)");
}

// The hex number of `digits` digits at `at`, then the separator `then`
// (none at the end).
std::uint32_t read_field(std::string_view text, std::size_t& at, std::size_t digits,
                         const char* name, bool last) {
  std::uint32_t value = 0;
  for (std::size_t i = 0; i < digits; ++i, ++at) {
    const int digit = hex_digit(text[at]);
    if (digit < 0) bad_wire(text, std::string("the ") + name + " is not " +
                                      std::to_string(digits) + " hex digits");
    value = value << 4 | static_cast<std::uint32_t>(digit);
  }
  if (!last && text[at++] != ':') bad_wire(text, std::string("no ':' after the ") + name);
  return value;
}

}  // namespace

namespace detail {
void require_psn(const char* what, std::uint32_t psn) {
  if (psn > kMax24Bits) {
    throw std::invalid_argument(std::string(what) + ": a PSN has 24 bits, got " +
                                std::to_string(psn));
  }
}
}  // namespace detail

RcEndpoint::RcEndpoint(std::uint32_t qp_num, const ibv_gid& gid, std::uint32_t psn,
                       std::uint16_t lid)
    : qp_num_(qp_num), gid_(gid), psn_(psn), lid_(lid) {
  if (qp_num > detail::kMax24Bits) {
    throw std::invalid_argument("RcEndpoint: a QP number has 24 bits, got " +
                                std::to_string(qp_num));
  }
  detail::require_psn("RcEndpoint", psn);
}

std::array<char, RcEndpoint::kWireSize> RcEndpoint::to_wire() const noexcept {
  std::array<char, kWireSize> wire{};
  int at = std::snprintf(wire.data(), wire.size(), "%04x:%06x:%06x:", lid_, qp_num_, psn_);
  for (const std::uint8_t byte : gid_.raw) {
    at += std::snprintf(wire.data() + at, wire.size() - static_cast<std::size_t>(at), "%02x",
                        byte);
  }
  return wire;
}

RcEndpoint RcEndpoint::from_wire(std::string_view wire) {
  const std::string_view text = wire.substr(0, wire.find('\0'));
  if (text.size() != kTextSize) {
    bad_wire(text, std::to_string(text.size()) + " characters, not " + std::to_string(kTextSize));
  }
  std::size_t at = 0;
  RcEndpoint endpoint;
  endpoint.lid_ = static_cast<std::uint16_t>(read_field(text, at, kLidDigits, "LID", false));
  endpoint.qp_num_ = read_field(text, at, kQpnDigits, "QP number", false);
  endpoint.psn_ = read_field(text, at, kPsnDigits, "PSN", false);
  for (std::uint8_t& byte : endpoint.gid_.raw) {
    byte = static_cast<std::uint8_t>(read_field(text, at, 2, "GID", true));
  }
  return endpoint;
}

bool operator==(const RcEndpoint& a, const RcEndpoint& b) noexcept {
  return a.qp_num_ == b.qp_num_ && a.psn_ == b.psn_ && a.lid_ == b.lid_ &&
         std::memcmp(a.gid_.raw, b.gid_.raw, sizeof a.gid_.raw) == 0;
}

}  // namespace ibev
