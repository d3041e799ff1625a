#pragma once
// Seeded randomness that does not depend on the standard library's
// distribution algorithms (partitions and samples must be the same on every
// node and every machine).

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace consensusd::data {

// Uniform integer in [0, bound), by rejection on the raw 64-bit engine.
inline std::size_t uniformBelow(std::mt19937_64& rng, std::size_t bound) {
  const std::uint64_t range = bound;
  const std::uint64_t limit = UINT64_MAX - UINT64_MAX % range;
  std::uint64_t value = rng();
  while (value >= limit) value = rng();
  return static_cast<std::size_t>(value % range);
}

// Uniform double in [0, 1).
inline double uniformUnit(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

// Fisher-Yates with uniformBelow.
template <class T>
void shuffle(std::vector<T>& items, std::mt19937_64& rng) {
  for (std::size_t i = items.size(); i > 1; --i)
    std::swap(items[i - 1], items[uniformBelow(rng, i)]);
}

}  // namespace consensusd::data
