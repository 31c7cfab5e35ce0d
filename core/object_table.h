// Internal to core/: the map from an object's key (its address, or its number
// on its device) to its subscribers (core/subscriber_lists.h's KeyedLists).
//
// Open addressing with linear probing, entries stored inline. std::unordered_map
// keeps each key in its own node and reaches a bucket through the node before
// it (another key's), so with a million objects a lookup of a hot key still
// touches cold memory; here a lookup touches the probed entries only, and the
// routing cost with 1M registered objects stays that of 1k (bench/).
//
// Not thread-safe: the registry locks a shard around each table.
#ifndef IBEV_CORE_OBJECT_TABLE_H_
#define IBEV_CORE_OBJECT_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include <ibev/core/event_type.h>

namespace ibev::detail {

// An object's address and kind in one word. rdma-core's objects hold
// pointers, so their addresses are 8-aligned and the kind fits in the low
// three bits (Registry::attach refuses an address that is not): a table
// entry is then 40 bytes, not 48, and at a million objects the table holds
// about two entries an object (bench/registry_bench's memory figure).
class ObjectKey {
 public:
  static constexpr std::uintptr_t kKindBits = 7;

  // The empty key: no object.
  constexpr ObjectKey() noexcept = default;
  ObjectKey(const void* address, ElementKind kind) noexcept
      : bits_(reinterpret_cast<std::uintptr_t>(address) | static_cast<std::uintptr_t>(kind)) {}

  // Whether `address` can be a key's (it is 8-aligned and not null).
  static bool representable(const void* address) noexcept {
    const auto bits = reinterpret_cast<std::uintptr_t>(address);
    return bits != 0 && (bits & kKindBits) == 0;
  }

  const void* address() const noexcept {
    return reinterpret_cast<const void*>(bits_ & ~kKindBits);
  }
  ElementKind kind() const noexcept { return static_cast<ElementKind>(bits_ & kKindBits); }
  bool empty() const noexcept { return bits_ == 0; }
  std::uintptr_t bits() const noexcept { return bits_; }
  friend bool operator==(ObjectKey a, ObjectKey b) noexcept { return a.bits_ == b.bits_; }

 private:
  std::uintptr_t bits_ = 0;
};
static_assert(kElementKinds.size() - 1 <= ObjectKey::kKindBits,
              "every kind fits in an aligned address's low bits");

// An object named by its number on its device (a QP or SRQ number, a DevX
// object's id), for what has no ibv_* address: the device and (kind,
// number). Numbers are per device, so the device is part of the key; not by
// its address, which a device opened later may reuse with numbers starting
// over, but by a number the registry gives each device it sees, never twice
// (a forgotten device's keys then name nothing).
class NumberKey {
 public:
  // The empty key: no object.
  constexpr NumberKey() noexcept = default;
  // `device`: the registry's number for the device, never 0.
  NumberKey(std::uint64_t device, ElementKind kind, std::uint32_t number) noexcept
      : device_(device), id_((static_cast<std::uint64_t>(kind) << 32) | number) {}

  bool empty() const noexcept { return device_ == 0; }
  // What the tables hash: every bit of the number reaches the low bits.
  std::uint64_t bits() const noexcept { return (device_ << 40) ^ (id_ << 4); }
  friend bool operator==(const NumberKey& a, const NumberKey& b) noexcept {
    return a.device_ == b.device_ && a.id_ == b.id_;
  }

 private:
  std::uint64_t device_ = 0;
  std::uint64_t id_ = 0;
};

// `Key` has empty(), bits() to hash, and ==: ObjectKey, NumberKey, or a
// source's own (the CM's ids, cm/cm_state.h).
template <typename Value, typename Key = ObjectKey>
class ObjectTable {
 public:
  // nullptr when absent. Valid until the next insert or erase.
  Value* find(const Key& key) noexcept {
    if (entries_.empty()) return nullptr;
    for (std::size_t i = home(key);; i = next(i)) {
      Entry& e = entries_[i];
      if (e.key.empty()) return nullptr;
      if (e.key == key) return &e.value;
    }
  }

  // The value for `key`, default-constructed if absent. `key` must not be
  // empty (the empty key marks an empty entry).
  Value& operator[](const Key& key) {
    if ((size_ + 1) * 4 > entries_.size() * 3) grow();
    for (std::size_t i = home(key);; i = next(i)) {
      Entry& e = entries_[i];
      if (e.key == key) return e.value;
      if (e.key.empty()) {
        e.key = key;
        ++size_;
        return e.value;
      }
    }
  }

  void erase(const Key& key) noexcept {
    if (entries_.empty()) return;
    std::size_t hole = home(key);
    while (!(entries_[hole].key == key)) {
      if (entries_[hole].key.empty()) return;
      hole = next(hole);
    }
    // Backward-shift deletion: pull later entries of the probe run into the
    // hole when that does not move them before their home slot.
    for (std::size_t i = next(hole);; i = next(i)) {
      Entry& e = entries_[i];
      if (e.key.empty()) break;
      const std::size_t want = home(e.key);
      if (distance(want, i) >= distance(hole, i)) {
        entries_[hole] = std::move(e);
        hole = i;
      }
    }
    entries_[hole] = Entry{};
    --size_;
  }

  std::size_t size() const noexcept { return size_; }

 private:
  struct Entry {
    Key key;
    Value value{};
  };

  // MurmurHash3's finalizer. The registry picks a table by a different hash
  // of the same address, so this one must not correlate with it.
  std::size_t home(const Key& key) const noexcept {
    std::uint64_t h = key.bits();
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return static_cast<std::size_t>(h) & (entries_.size() - 1);
  }
  std::size_t next(std::size_t i) const noexcept {
    return (i + 1) & (entries_.size() - 1);
  }
  // Steps from `from` forward to `to`, wrapping around.
  std::size_t distance(std::size_t from, std::size_t to) const noexcept {
    return (to - from) & (entries_.size() - 1);
  }

  void grow() {
    std::vector<Entry> old = std::move(entries_);
    const std::size_t capacity = old.empty() ? 16 : old.size() * 2;
    entries_ = std::vector<Entry>(capacity);
    size_ = 0;
    for (Entry& e : old) {
      if (!e.key.empty()) (*this)[e.key] = std::move(e.value);
    }
  }

  std::vector<Entry> entries_;  // size 0 or a power of two
  std::size_t size_ = 0;
};

}  // namespace ibev::detail

#endif  // IBEV_CORE_OBJECT_TABLE_H_
