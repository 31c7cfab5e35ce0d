// Internal to core/registry: the map from an object's address to its handler
// list.
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

struct ObjectKey {
  const void* address;
  ElementKind kind;
  friend bool operator==(const ObjectKey& a, const ObjectKey& b) {
    return a.address == b.address && a.kind == b.kind;
  }
};

template <typename Value>
class ObjectTable {
 public:
  // nullptr when absent. Valid until the next insert or erase.
  Value* find(const ObjectKey& key) noexcept {
    if (entries_.empty()) return nullptr;
    for (std::size_t i = home(key);; i = next(i)) {
      Entry& e = entries_[i];
      if (e.key.address == nullptr) return nullptr;
      if (e.key == key) return &e.value;
    }
  }

  // The value for `key`, default-constructed if absent. `key.address` must
  // not be null (null marks an empty entry).
  Value& operator[](const ObjectKey& key) {
    if ((size_ + 1) * 4 > entries_.size() * 3) grow();
    for (std::size_t i = home(key);; i = next(i)) {
      Entry& e = entries_[i];
      if (e.key == key) return e.value;
      if (e.key.address == nullptr) {
        e.key = key;
        ++size_;
        return e.value;
      }
    }
  }

  void erase(const ObjectKey& key) noexcept {
    if (entries_.empty()) return;
    std::size_t hole = home(key);
    while (!(entries_[hole].key == key)) {
      if (entries_[hole].key.address == nullptr) return;
      hole = next(hole);
    }
    // Backward-shift deletion: pull later entries of the probe run into the
    // hole when that does not move them before their home slot.
    for (std::size_t i = next(hole);; i = next(i)) {
      Entry& e = entries_[i];
      if (e.key.address == nullptr) break;
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
    ObjectKey key{nullptr, ElementKind::kDevice};
    Value value{};
  };

  // MurmurHash3's finalizer. The registry picks a table by a different hash
  // of the same address, so this one must not correlate with it.
  std::size_t home(const ObjectKey& key) const noexcept {
    std::uint64_t h = reinterpret_cast<std::uintptr_t>(key.address) ^
                      static_cast<std::uint64_t>(key.kind);
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
      if (e.key.address != nullptr) (*this)[e.key] = std::move(e.value);
    }
  }

  std::vector<Entry> entries_;  // size 0 or a power of two
  std::size_t size_ = 0;
};

}  // namespace ibev::detail

#endif  // IBEV_CORE_OBJECT_TABLE_H_
