// Internal to core/registry: every object's handlers, keyed by the object's
// address and kind.
//
// An object's handlers are an immutable set (one Subscriber, or a list),
// copied out by find() and replaced whole by add() and remove(): a resolve
// holds what it copied however the set changes after it. Objects are spread
// over shards, each an ObjectTable under its own mutex, so that routing from
// many threads and attaching from many others rarely meet on one lock.
#ifndef IBEV_CORE_OBJECT_HANDLERS_H_
#define IBEV_CORE_OBJECT_HANDLERS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include <ibev/core/object_table.h>
#include <ibev/core/subscriber.h>

namespace ibev::detail {

// One Subscriber without a list (the common case: routing touches one
// allocation), or several.
struct HandlerSet {
  std::shared_ptr<Subscriber> only;
  std::shared_ptr<const SubscriberList> several;
};

class ObjectHandlers {
 public:
  void add(const ObjectKey& key, std::shared_ptr<Subscriber> subscriber);
  void remove(const ObjectKey& key, const Subscriber* subscriber);
  HandlerSet find(const ObjectKey& key);

 private:
  // An object with one handler has it in `objects` (24 bytes a slot, and a
  // table is at most 3/4 full: most of a Registry's bytes per object). An
  // object with several has a null there and its list in `several`, which
  // stays unallocated while nothing has two.
  struct Shard {
    std::mutex mutex;
    ObjectTable<std::shared_ptr<Subscriber>> objects;
    ObjectTable<std::shared_ptr<const SubscriberList>> several;
  };
  static constexpr std::size_t kShards = 64;
  static_assert(kShards == 64, "shard_for() takes the top 6 bits of the hash");

  Shard& shard_for(const ObjectKey& key) noexcept {
    const auto bits = reinterpret_cast<std::uintptr_t>(key.address()) >> 4;
    return shards_[(bits * 0x9E3779B97F4A7C15ull) >> 58];
  }

  std::array<Shard, kShards> shards_;
};

}  // namespace ibev::detail

#endif  // IBEV_CORE_OBJECT_HANDLERS_H_
