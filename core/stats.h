// Internal: statistics declared once. A stats list is an X-macro naming each
// counter; the public struct of plain numbers and the internal struct of
// relaxed atomics are both generated from it, so they cannot drift apart (a
// reordered field cannot swap two counters). Envoy declares its stats the
// same way.
#ifndef IBEV_CORE_STATS_H_
#define IBEV_CORE_STATS_H_

#include <atomic>
#include <cstdint>

#define IBEV_STATS_PLAIN_FIELD(name) std::uint64_t name = 0;
#define IBEV_STATS_ATOMIC_FIELD(name) std::atomic<std::uint64_t> name{0};
#define IBEV_STATS_LOAD_FIELD(name) out.name = name.load(std::memory_order_relaxed);

// Declares `Plain` (public numbers) from LIST. The atomic mirror is declared
// where it is used, with IBEV_DECLARE_ATOMIC_STATS.
#define IBEV_DECLARE_STATS(Plain, LIST) \
  struct Plain {                        \
    LIST(IBEV_STATS_PLAIN_FIELD)        \
  }

#define IBEV_DECLARE_ATOMIC_STATS(Atomic, Plain, LIST)                  \
  struct Atomic {                                                       \
    LIST(IBEV_STATS_ATOMIC_FIELD)                                       \
    Plain load() const noexcept {                                       \
      Plain out;                                                        \
      LIST(IBEV_STATS_LOAD_FIELD)                                       \
      return out;                                                       \
    }                                                                   \
  }

namespace ibev::detail {
inline void bump(std::atomic<std::uint64_t>& counter, std::uint64_t by = 1) noexcept {
  counter.fetch_add(by, std::memory_order_relaxed);
}
}  // namespace ibev::detail

#endif  // IBEV_CORE_STATS_H_
