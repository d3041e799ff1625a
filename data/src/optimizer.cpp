#include "consensusd/data/optimizer.hpp"

#include <cmath>
#include <numbers>
#include <numeric>
#include <random>

#include "consensusd/data/random.hpp"

namespace consensusd::data {

double Schedule::at(std::int64_t round) const {
  const auto k = static_cast<double>(round);
  switch (kind) {
    case ScheduleKind::Constant:
      return learningRate;
    case ScheduleKind::Step:
      return learningRate * std::pow(factor, std::floor(k / static_cast<double>(period)));
    case ScheduleKind::InverseSqrt:
      return learningRate / std::sqrt(1.0 + k / static_cast<double>(period));
    case ScheduleKind::Cosine:
      if (totalRounds <= 0) return learningRate;
      return learningRate * 0.5 *
             (1.0 +
              std::cos(std::numbers::pi * std::min(1.0, k / static_cast<double>(totalRounds))));
  }
  return learningRate;
}

MinibatchSampler::MinibatchSampler(std::size_t samples, std::size_t batchSize, std::uint64_t seed)
    : order_(samples), batch_(std::min(batchSize, samples)), position_(samples), seed_(seed) {
  std::iota(order_.begin(), order_.end(), 0);
}

const std::vector<std::size_t>& MinibatchSampler::next() {
  if (position_ + batch_.size() > order_.size()) {
    std::mt19937_64 rng(seed_ + 0x9e3779b97f4a7c15ULL * (epoch_ + 1));
    shuffle(order_, rng);
    position_ = 0;
    ++epoch_;
  }
  std::copy_n(order_.begin() + static_cast<std::ptrdiff_t>(position_), batch_.size(),
              batch_.begin());
  position_ += batch_.size();
  return batch_;
}

}  // namespace consensusd::data
