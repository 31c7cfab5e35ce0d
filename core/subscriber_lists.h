// Internal to ibev: the two lists that hold subscribers of the routing
// primitive (core/route.h) and give its one Snapshot.
//
// BroadcastList, for device-wide lists (a device's listeners, the unclaimed
// observers, device watchers and clients), is a Boost.Signals2 signal: slots
// are kept in registration order, and may be connected and disconnected
// while the signal is being called. Taking a snapshot calls the signal once,
// each live slot adding its subscriber; the handlers run later, from the
// snapshot, never inside Signals2.
//
// KeyedLists, for per-object lists (an event_handler per QP, a million of
// them), keeps one subscriber inline per key and allocates a list only for a
// key with several, under sharded mutexes: what matters there is bytes per
// object and one probe per event (bench/registry_bench).
//
// Both give the same Snapshot, so both keep the one rule: a snapshot is who
// was subscribed when it was taken, and a subscriber released since is
// skipped. Every member may be called from any thread; no lock is held while
// a subscriber runs. Both know the process that made them: a handle released
// in a forked child leaves the parent's list (its locks, its calls) alone.
#ifndef IBEV_CORE_SUBSCRIBER_LISTS_H_
#define IBEV_CORE_SUBSCRIBER_LISTS_H_

#include <array>
#include <boost/signals2/signal.hpp>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include <ibev/core/handle.h>
#include <ibev/core/object_table.h>
#include <ibev/core/process.h>
#include <ibev/core/route.h>
#include <ibev/core/thread_annotations.h>

namespace ibev::detail {

template <typename Sub>
class BroadcastList {
 public:
  using List = typename Snapshot<Sub>::List;

  // The slot holds its subscriber weakly: once the handle is released (and
  // no snapshot holds it), the callback and its captures are gone, although
  // Signals2 frees a disconnected slot only later. The handle's block is
  // made first: if that throws, nothing is connected (a slot connected for
  // a call that threw would stay in the signal for good).
  Handle add(std::shared_ptr<Sub> subscriber) {
    auto slot = std::make_shared<Slot>(std::move(subscriber), process_);
    slot->connection =
        signal_->connect([weak = std::weak_ptr<Sub>(slot->subscriber)](List& out) {
          auto live = weak.lock();
          if (live && !live->guard.closed()) out.push_back(std::move(live));
        });
    return Handle(std::shared_ptr<Registration>(std::move(slot)));
  }

  // Who is subscribed now, not released, in registration order.
  Snapshot<Sub> snapshot() const {
    List live;
    (*signal_)(live);
    if (live.empty()) return {};
    return Snapshot<Sub>(std::make_shared<const List>(std::move(live)));
  }

 private:
  using Signal = boost::signals2::signal<void(List&)>;
  // One subscription: its release is unsubscribe() (core/route.h), which
  // disconnects it.
  struct Slot final : Registration {
    Slot(std::shared_ptr<Sub> subscriber, OwningProcess process) noexcept
        : subscriber(std::move(subscriber)), process(std::move(process)) {}
    void release() noexcept override {
      unsubscribe(*subscriber, [this](const Sub*) {
        if (process.inherited()) return false;  // the signal's lock may be held
        connection.disconnect();
        return true;
      });
    }
    const std::shared_ptr<Sub> subscriber;
    const OwningProcess process;
    boost::signals2::connection connection;  // set once connected
  };
  // Held by pointer: a Signals2 signal cannot move, and the lists that hold
  // a BroadcastList (a device's state) are made once and shared.
  std::unique_ptr<Signal> signal_ = std::make_unique<Signal>();
  OwningProcess process_;
};

// Per-object lists, keyed as an ObjectTable is (core/object_table.h). A key's
// subscribers are an immutable set, replaced whole by a subscription and its
// release, so a snapshot keeps what it copied. Keys are spread over shards,
// each an ObjectTable under its own mutex, so that routing from many threads
// and subscribing from many others rarely meet on one lock.
template <typename Sub, typename Key = ObjectKey>
class KeyedLists {
 public:
  using List = typename Snapshot<Sub>::List;

  KeyedLists() : shards_(std::make_shared<Shards>()) {}

  // `key` must not be empty. The handle may outlive this KeyedLists.
  Handle add(const Key& key, std::shared_ptr<Sub> subscriber) {
    // The handle first: if making it throws, nothing is linked yet.
    Handle handle = subscription(subscriber, [weak = std::weak_ptr<Shards>(shards_),
                                              key](const Sub* subscriber) {
      auto shards = weak.lock();
      return !shards || unlink(*shards, key, subscriber);
    });
    link(key, std::move(subscriber));
    return handle;
  }

  // For a subscriber that is its own registration (core/handle.h) and
  // unlinks itself, from one list or several (the Registry's object
  // handlers): link() puts it under `key` (not empty); unlink() takes it out
  // in its release, and is false, touching nothing, in a forked child
  // (subscription()'s `unlink`).
  void link(const Key& key, std::shared_ptr<Sub> subscriber) {
    Shard& shard = shard_for(*shards_, key);
    MutexLock lock(shard.mutex);
    std::shared_ptr<const List>* several = shard.several.find(key);
    std::shared_ptr<Sub>& only = shard.objects[key];
    List next;
    if (only) {
      next.push_back(only);
    } else if (several != nullptr) {
      next = **several;
    } else {
      only = std::move(subscriber);
      return;
    }
    next.push_back(std::move(subscriber));
    shard.several[key] = std::make_shared<const List>(std::move(next));
    only.reset();  // another table: `only` still names its slot
  }
  bool unlink(const Key& key, const Sub* subscriber) { return unlink(*shards_, key, subscriber); }

  Snapshot<Sub> snapshot(const Key& key) const {
    Shard& shard = shard_for(*shards_, key);
    MutexLock lock(shard.mutex);
    const std::shared_ptr<Sub>* only = shard.objects.find(key);
    if (only == nullptr) return {};
    if (*only) return Snapshot<Sub>(*only);
    const std::shared_ptr<const List>* several = shard.several.find(key);
    return several != nullptr ? Snapshot<Sub>(*several) : Snapshot<Sub>();
  }

 private:
  // A key with one subscriber has it in `objects` (24 bytes a slot, and a
  // table is at most 3/4 full: most of a Registry's bytes per object). A
  // key with several has a null there and its list in `several`, which
  // stays unallocated while nothing has two.
  struct Shard {
    Mutex mutex;
    ObjectTable<std::shared_ptr<Sub>, Key> objects IBEV_GUARDED_BY(mutex);
    ObjectTable<std::shared_ptr<const List>, Key> several IBEV_GUARDED_BY(mutex);
  };
  static constexpr std::size_t kShards = 64;
  struct Shards {
    std::array<Shard, kShards> shard;
    const OwningProcess process;  // a forked child's copy: its locks may be held
  };

  static Shard& shard_for(Shards& shards, const Key& key) noexcept {
    // Another hash than the table's own (object_table.h), so the two do not
    // correlate; the low 4 bits are an address's alignment and kind.
    const std::uint64_t bits = key.bits() >> 4;
    return shards.shard[(bits * 0x9E3779B97F4A7C15ull) >> 58];  // the top 6 bits: 64 shards
  }

  static bool unlink(Shards& shards, const Key& key, const Sub* subscriber) {
    if (shards.process.inherited()) return false;  // the parent's locks may be held
    Shard& shard = shard_for(shards, key);
    MutexLock lock(shard.mutex);
    std::shared_ptr<Sub>* only = shard.objects.find(key);
    if (only == nullptr) return true;
    if (*only) {
      if (only->get() == subscriber) shard.objects.erase(key);
      return true;
    }
    std::shared_ptr<const List>* several = shard.several.find(key);
    if (several == nullptr) return true;
    List rest;
    for (const auto& s : **several) {
      if (s.get() != subscriber) rest.push_back(s);
    }
    if (rest.size() == 1) {
      *only = rest.front();
      shard.several.erase(key);
    } else {
      *several = std::make_shared<const List>(std::move(rest));
    }
    return true;
  }

  // Shared with the handles' unlink, which may run after this is gone.
  std::shared_ptr<Shards> shards_;
};

}  // namespace ibev::detail

#endif  // IBEV_CORE_SUBSCRIBER_LISTS_H_
