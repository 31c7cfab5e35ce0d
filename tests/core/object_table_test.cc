// The registry's open-addressing table against std::unordered_map, through
// random inserts and erases dense enough to wrap probe runs around the end.
#define BOOST_TEST_MODULE ibev_core_object_table
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>
#include <random>
#include <unordered_map>
#include <vector>

#include <ibev/core/object_table.h>

namespace bdata = boost::unit_test::data;
using ibev::ElementKind;
using ibev::detail::ObjectKey;
using ibev::detail::ObjectTable;

namespace {

ObjectKey key(std::size_t i) {
  return {reinterpret_cast<const void*>(std::uintptr_t{0x1000} + i * 16),
          i % 3 == 0 ? ElementKind::kCq : ElementKind::kQp};
}

// Address keys, and number keys: the same small numbers on a few devices
// (QP numbers start near 17 on every device), the densest collisions.
ibev::detail::NumberKey number_key(std::size_t i) {
  return {1 + i % 4, i % 3 == 0 ? ElementKind::kSrq : ElementKind::kQp,
          static_cast<std::uint32_t>(17 + i / 4)};
}

template <typename Key>
void matches_a_reference_map(unsigned seed, Key (*key)(std::size_t)) {
  ObjectTable<int, Key> table;
  std::unordered_map<std::size_t, int> reference;
  std::mt19937 rng(seed);
  const std::size_t universe = 64u << seed;  // small: many collisions
  for (int step = 0; step < 200'000; ++step) {
    const std::size_t k = rng() % universe;
    if (rng() % 3 == 0) {
      table.erase(key(k));
      reference.erase(k);
    } else {
      table[key(k)] = step;
      reference[k] = step;
    }
    if (step % 997 == 0) {
      BOOST_REQUIRE_EQUAL(table.size(), reference.size());
      for (std::size_t i = 0; i < universe; ++i) {
        const int* found = table.find(key(i));
        const auto it = reference.find(i);
        BOOST_REQUIRE_EQUAL(found != nullptr, it != reference.end());
        if (found != nullptr) BOOST_REQUIRE_EQUAL(*found, it->second);
      }
    }
  }
}

}  // namespace

BOOST_DATA_TEST_CASE(matches_a_reference_map_keyed_by_address, bdata::make({1u, 2u, 3u, 4u}),
                     seed) {
  matches_a_reference_map<ObjectKey>(seed, key);
}

BOOST_DATA_TEST_CASE(matches_a_reference_map_keyed_by_number, bdata::make({1u, 2u, 3u, 4u}),
                     seed) {
  matches_a_reference_map<ibev::detail::NumberKey>(seed, number_key);
}

BOOST_AUTO_TEST_CASE(kind_is_part_of_the_key) {
  ObjectTable<int> table;
  const void* address = reinterpret_cast<const void*>(std::uintptr_t{0x4000});
  table[{address, ElementKind::kCq}] = 1;
  table[{address, ElementKind::kQp}] = 2;
  BOOST_TEST(*table.find({address, ElementKind::kCq}) == 1);
  BOOST_TEST(*table.find({address, ElementKind::kQp}) == 2);
  table.erase({address, ElementKind::kCq});
  BOOST_TEST(table.find({address, ElementKind::kCq}) == nullptr);
  BOOST_TEST(*table.find({address, ElementKind::kQp}) == 2);
}
