// ibev::EventFilter: which events a handler wants.
//
// A filter is a set of event codes, optionally narrowed to one port. The
// default filter takes every event that can reach the handler it is given to:
// for a device listener, every port and device event including codes ibev does
// not know; for an object handler, every event of that object. Any code may be
// named, including codes after IBV_EVENT_WQ_FATAL that a newer kernel and
// rdma-core raise (IBV_EVENT_DEVICE_SPEED_CHANGE is 20 from rdma-core 62 on):
// like every code ibev does not classify, they are device-scope events, for
// listeners. A filter is a value, cheap to copy for the codes rdma-core
// defines; Registry checks it against what it is attached to, so a QP handler
// cannot ask for CQ_ERR and a listener cannot ask for QP events (those go to
// the QP's own handlers only).
#ifndef IBEV_CORE_EVENT_FILTER_H_
#define IBEV_CORE_EVENT_FILTER_H_

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <vector>

#include <ibev/core/event.h>

namespace ibev {

class EventFilter {
 public:
  // Every event that can reach the handler.
  EventFilter() noexcept = default;
  EventFilter(const EventFilter& other);
  EventFilter& operator=(const EventFilter& other);
  EventFilter(EventFilter&&) noexcept = default;
  EventFilter& operator=(EventFilter&&) noexcept = default;
  ~EventFilter() = default;

  // Exactly these types. Throws std::invalid_argument when `types` is empty
  // or names a negative code (no event has one: it would never match).
  EventFilter(std::initializer_list<ibv_event_type> types);

  // Exactly these codes, for codes the ibv_event_type of the rdma-core
  // headers in use does not name (EventFilter::of_codes({20})). Throws
  // std::invalid_argument when `codes` is empty or one is negative.
  static EventFilter of_codes(std::initializer_list<int> codes);
  // The same for `count` codes at `codes` (a set known at run time: the C
  // API's filter).
  static EventFilter of_codes(const int* codes, std::size_t count);

  // Narrows the filter to events of port `port` (throws std::invalid_argument
  // for a port below 1). Device events (DEVICE_FATAL, unknown codes) carry no
  // port and always pass a port narrowing: a dead device is every port's news.
  EventFilter& on_port(int port);

  bool matches(const Event& event) const noexcept;

  // True when the filter takes every type (the default).
  bool all_types() const noexcept { return all_types_; }
  // True when `code` is one of the filter's types (or all_types()).
  bool has_type(int code) const noexcept;
  // The codes named, ascending; empty when all_types().
  std::vector<int> types() const;
  std::optional<int> port() const noexcept {
    return port_ > 0 ? std::optional<int>(port_) : std::nullopt;
  }

 private:
  void add(int code);

  // 24 bytes: a filter is kept in every subscription, one per QP and CQ.
  static constexpr int kMaskCodes = 64;
  std::uint64_t mask_ = 0;  // bit i: code i, for 0 <= i < kMaskCodes
  // Any code from kMaskCodes on, sorted; null for rdma-core's (all below kMaskCodes),
  // so that copying a filter of rdma-core's codes allocates nothing.
  std::unique_ptr<const std::vector<int>> others_;
  std::int32_t port_ = 0;  // 0: every port
  bool all_types_ = true;
};

}  // namespace ibev

#endif  // IBEV_CORE_EVENT_FILTER_H_
