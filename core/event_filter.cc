#include <ibev/core/event_filter.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace ibev {

static_assert(sizeof(EventFilter) <= 24, "a filter is kept in every subscription");

namespace {

void require_some(std::size_t count) {
  if (count == 0) {
    throw std::invalid_argument(
        "EventFilter: an empty set of event types would match nothing");
  }
}

}  // namespace

EventFilter::EventFilter(std::initializer_list<ibv_event_type> types)
    : all_types_(false) {
  require_some(types.size());
  for (ibv_event_type type : types) add(static_cast<int>(type));
}

EventFilter EventFilter::of_codes(std::initializer_list<int> codes) {
  return of_codes(codes.begin(), codes.size());
}

EventFilter EventFilter::of_codes(const int* codes, std::size_t count) {
  require_some(count);
  if (codes == nullptr) throw std::invalid_argument("EventFilter::of_codes: codes is null");
  EventFilter filter;
  filter.all_types_ = false;
  for (std::size_t i = 0; i < count; ++i) filter.add(codes[i]);
  return filter;
}

EventFilter::EventFilter(const EventFilter& other)
    : mask_(other.mask_),
      others_(other.others_ ? std::make_unique<const std::vector<int>>(*other.others_) : nullptr),
      port_(other.port_),
      all_types_(other.all_types_) {}

EventFilter& EventFilter::operator=(const EventFilter& other) {
  if (this != &other) *this = EventFilter(other);
  return *this;
}

void EventFilter::add(int code) {
  // ibv_event_type has no negative value and the kernel raises none: a
  // handler waiting for one would wait for ever.
  if (code < 0) {
    throw std::invalid_argument("EventFilter: event code " + std::to_string(code) +
                                " is negative; no event has one, so it would never match");
  }
  if (code < kMaskCodes) {
    mask_ |= std::uint64_t{1} << code;
    return;
  }
  auto others = others_ ? std::make_unique<std::vector<int>>(*others_)
                        : std::make_unique<std::vector<int>>();
  const auto at = std::lower_bound(others->begin(), others->end(), code);
  if (at == others->end() || *at != code) others->insert(at, code);
  others_ = std::move(others);
}

EventFilter& EventFilter::on_port(int port) {
  if (port < 1) {
    throw std::invalid_argument(
        "EventFilter::on_port: port numbers start at 1, got " +
        std::to_string(port));
  }
  port_ = port;
  return *this;
}

bool EventFilter::has_type(int code) const noexcept {
  if (all_types_) return true;
  if (code >= 0 && code < kMaskCodes) {
    return (mask_ & (std::uint64_t{1} << code)) != 0;
  }
  return others_ && std::binary_search(others_->begin(), others_->end(), code);
}

std::vector<int> EventFilter::types() const {
  // Every attach checks its filter's types: the default filter (all types)
  // costs nothing, a mask only its set bits.
  if (all_types_) return {};
  std::vector<int> codes;
  for (std::uint64_t bits = mask_; bits != 0; bits &= bits - 1) {
    codes.push_back(__builtin_ctzll(bits));
  }
  if (others_) codes.insert(codes.end(), others_->begin(), others_->end());
  return codes;
}

bool EventFilter::matches(const Event& event) const noexcept {
  if (!has_type(event.code())) return false;
  if (port_ == 0) return true;
  const std::optional<int> port = event.port();
  return !port || *port == port_;
}

}  // namespace ibev
