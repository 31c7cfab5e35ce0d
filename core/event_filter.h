// ibev::EventFilter: which events a handler wants.
//
// A filter is a set of event types, optionally narrowed to one port. The
// default filter takes every event that can reach the handler it is given to:
// for a device listener, every port and device event including codes ibev does
// not know; for an object handler, every event of that object. A filter is a
// small value; Registry checks it against what it is attached to, so a QP
// handler cannot ask for CQ_ERR and a listener cannot ask for QP events (those
// go to the QP's own handlers only).
#ifndef IBEV_CORE_EVENT_FILTER_H_
#define IBEV_CORE_EVENT_FILTER_H_

#include <infiniband/verbs.h>

#include <cstdint>
#include <initializer_list>
#include <optional>

#include <ibev/core/event.h>

namespace ibev {

class EventFilter {
 public:
  // Every event that can reach the handler.
  EventFilter() noexcept = default;

  // Exactly these types. Throws std::invalid_argument when `types` is empty
  // or names a code outside rdma-core's ibv_event_type.
  EventFilter(std::initializer_list<ibv_event_type> types);

  // Narrows the filter to events of port `port` (throws std::invalid_argument
  // for a port below 1). Device events (DEVICE_FATAL, unknown codes) carry no
  // port and always pass a port narrowing: a dead device is every port's news.
  EventFilter& on_port(int port);

  bool matches(const Event& event) const noexcept;

  // True when the filter takes every type (the default).
  bool all_types() const noexcept { return all_types_; }
  // True when `code` is one of the filter's types (or all_types()).
  bool has_type(int code) const noexcept;
  std::optional<int> port() const noexcept { return port_; }

 private:
  std::uint32_t types_ = 0;  // bit i: event code i
  bool all_types_ = true;
  std::optional<int> port_;
};

}  // namespace ibev

#endif  // IBEV_CORE_EVENT_FILTER_H_
