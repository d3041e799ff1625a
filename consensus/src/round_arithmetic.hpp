#pragma once
// Small helpers the round engine's files share.

#include <cstdint>
#include <limits>
#include <span>

namespace consensusd::consensus {

inline constexpr std::int64_t kMaxRound = std::numeric_limits<std::int64_t>::max();

// a + b for b >= 0, saturating: a round from the wire may be anything.
inline std::int64_t addSaturating(std::int64_t a, std::int64_t b) {
  return a > kMaxRound - b ? kMaxRound : a + b;
}

// An Eigen vector's values as a span.
template <class Vector>
auto valuesOf(Vector& vector) {
  return std::span(vector.data(), static_cast<std::size_t>(vector.size()));
}

}  // namespace consensusd::consensus
