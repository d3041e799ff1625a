#include "consensusd/consensus/mixing.hpp"

#include <algorithm>
#include <cmath>

#include "cpu_features.hpp"

namespace consensusd::consensus {
namespace {

constexpr std::size_t kBlock = 2048;  // elements per block: inputs stay in L1/L2

}  // namespace

double absorbSelfWeight(const std::vector<MixInput>& inputs) {
  double sum = 0;
  for (const MixInput& input : inputs) sum += input.weight;
  return std::max(0.0, 1.0 - sum);
}

void renormalizeWeights(std::vector<MixInput>& inputs, double selfWeight) {
  double present = 0;
  for (const MixInput& input : inputs) present += input.weight;
  const double scale = renormalizeScale(selfWeight, present);
  for (MixInput& input : inputs) input.weight *= scale;
}

double renormalizeScale(double selfWeight, double present) {
  return present <= 0 || selfWeight + present <= 0 ? 1.0 : 1.0 / (selfWeight + present);
}

namespace {

// The pass itself, in plain loops the compiler vectorises at the width of
// the function it is inlined into (the elementwise operations, in the same
// order, give the same floats at any width).
template <class Scalar>
[[gnu::always_inline]] inline void mixBlocks(const Scalar* self, Scalar selfWeight,
                                             const Scalar* const* inputs, const Scalar* weights,
                                             std::size_t count, Scalar* out, std::size_t dimension,
                                             const MixExtras<Scalar>& extras) {
  double distanceSq = 0;
  for (std::size_t begin = 0; begin < dimension; begin += kBlock) {
    const std::size_t n = std::min(kBlock, dimension - begin);
    const Scalar* x = self + begin;
    Scalar* o = out + begin;
#pragma omp simd
    for (std::size_t i = 0; i < n; ++i) o[i] = selfWeight * x[i];
    for (std::size_t k = 0; k < count; ++k) {
      const Scalar* in = inputs[k] + begin;
      const Scalar w = weights[k];
      if (extras.inputDistancesSq != nullptr) {
        Scalar sum = 0;
#pragma omp simd reduction(+ : sum)
        for (std::size_t i = 0; i < n; ++i) {
          o[i] += w * in[i];
          sum += (in[i] - x[i]) * (in[i] - x[i]);
        }
        extras.inputDistancesSq[k] += static_cast<double>(sum);
      } else {
#pragma omp simd
        for (std::size_t i = 0; i < n; ++i) o[i] += w * in[i];
      }
    }
    if (extras.distanceSq != nullptr) {
      Scalar sum = 0;
#pragma omp simd reduction(+ : sum)
      for (std::size_t i = 0; i < n; ++i) sum += (o[i] - x[i]) * (o[i] - x[i]);
      distanceSq += static_cast<double>(sum);
    }
    if (extras.step != nullptr) {
      const Scalar* g = extras.step + begin;
      const Scalar scale = extras.stepScale;
#pragma omp simd
      for (std::size_t i = 0; i < n; ++i) o[i] += scale * g[i];
    }
  }
  if (extras.distanceSq != nullptr) *extras.distanceSq = distanceSq;
}

template <class Scalar>
[[gnu::always_inline]] inline double squaredDistanceBlocks(const Scalar* a, const Scalar* b,
                                                           std::size_t dimension) {
  double total = 0;  // blocks summed in Scalar, the blocks in double
  for (std::size_t begin = 0; begin < dimension; begin += kBlock) {
    const std::size_t n = std::min(kBlock, dimension - begin);
    Scalar sum = 0;
#pragma omp simd reduction(+ : sum)
    for (std::size_t i = begin; i < begin + n; ++i) sum += (a[i] - b[i]) * (a[i] - b[i]);
    total += static_cast<double>(sum);
  }
  return total;
}

// Sums of products in Scalar within a block, the blocks in double (as
// squaredDistanceBlocks); each term only when its vectors are given.
template <class Scalar>
[[gnu::always_inline]] inline RoundSums roundSumsBlocks(const Scalar* g, const Scalar* x,
                                                        const Scalar* delta, const Scalar* mixed,
                                                        const Scalar* previousX,
                                                        const Scalar* previousG,
                                                        std::size_t dimension) {
  RoundSums total;
  const bool curvature = previousX != nullptr && previousG != nullptr;
  for (std::size_t begin = 0; begin < dimension; begin += kBlock) {
    const std::size_t end = begin + std::min(kBlock, dimension - begin);
    Scalar gg = 0;
#pragma omp simd reduction(+ : gg)
    for (std::size_t i = begin; i < end; ++i) gg += g[i] * g[i];
    total.gradientSq += static_cast<double>(gg);
    if (delta != nullptr) {
      Scalar gd = 0;
#pragma omp simd reduction(+ : gd)
      for (std::size_t i = begin; i < end; ++i) gd += g[i] * delta[i];
      total.alongDelta += static_cast<double>(gd);
    }
    if (mixed != nullptr) {
      Scalar pull = 0;
#pragma omp simd reduction(+ : pull)
      for (std::size_t i = begin; i < end; ++i) pull += (mixed[i] - x[i]) * g[i];
      total.pull += static_cast<double>(pull);
    }
    if (curvature) {
      Scalar dot = 0;
      Scalar stepSq = 0;
#pragma omp simd reduction(+ : dot, stepSq)
      for (std::size_t i = begin; i < end; ++i) {
        const Scalar step = x[i] - previousX[i];
        dot += (g[i] - previousG[i]) * step;
        stepSq += step * step;
      }
      total.curvature += static_cast<double>(dot);
      total.stepSq += static_cast<double>(stepSq);
    }
  }
  return total;
}

#if defined(__x86_64__)
template <class Scalar>
__attribute__((target("avx2"))) RoundSums roundSumsAvx2(const Scalar* g, const Scalar* x,
                                                        const Scalar* delta, const Scalar* mixed,
                                                        const Scalar* previousX,
                                                        const Scalar* previousG,
                                                        std::size_t dimension) {
  return roundSumsBlocks(g, x, delta, mixed, previousX, previousG, dimension);
}

template <class Scalar>
__attribute__((target("avx2"))) double squaredDistanceAvx2(const Scalar* a, const Scalar* b,
                                                           std::size_t dimension) {
  return squaredDistanceBlocks(a, b, dimension);
}

// The same pass with AVX2's 256-bit registers, chosen at run time: the
// binaries target baseline x86-64, and the mix is a fifth of a round's CPU.
template <class Scalar>
__attribute__((target("avx2"))) void mixBlocksAvx2(const Scalar* self, Scalar selfWeight,
                                                   const Scalar* const* inputs,
                                                   const Scalar* weights, std::size_t count,
                                                   Scalar* out, std::size_t dimension,
                                                   const MixExtras<Scalar>& extras) {
  mixBlocks(self, selfWeight, inputs, weights, count, out, dimension, extras);
}
#endif

}  // namespace

template <class Scalar>
void fusedMix(const Scalar* self, double selfWeight, const std::vector<MixInput>& inputs,
              Scalar* out, std::size_t dimension, const MixExtras<Scalar>& extras) {
  std::vector<const Scalar*> values;
  std::vector<Scalar> weights;
  for (const MixInput& input : inputs) {
    values.push_back(static_cast<const Scalar*>(input.values));
    weights.push_back(static_cast<Scalar>(input.weight));
  }
  const auto weight = static_cast<Scalar>(selfWeight);
  if (extras.inputDistancesSq != nullptr) std::fill_n(extras.inputDistancesSq, inputs.size(), 0.0);
#if defined(__x86_64__)
  if (cpuHasAvx2()) {
    mixBlocksAvx2(self, weight, values.data(), weights.data(), values.size(), out, dimension,
                  extras);
    return;
  }
#endif
  mixBlocks(self, weight, values.data(), weights.data(), values.size(), out, dimension, extras);
}

template <class Scalar>
double squaredDistance(const Scalar* a, const Scalar* b, std::size_t dimension) {
#if defined(__x86_64__)
  if (cpuHasAvx2()) return squaredDistanceAvx2(a, b, dimension);
#endif
  return squaredDistanceBlocks(a, b, dimension);
}

template <class Scalar>
RoundSums roundSums(const Scalar* g, const Scalar* x, const Scalar* delta, const Scalar* mixed,
                    const Scalar* previousX, const Scalar* previousG, std::size_t dimension) {
#if defined(__x86_64__)
  if (cpuHasAvx2()) return roundSumsAvx2(g, x, delta, mixed, previousX, previousG, dimension);
#endif
  return roundSumsBlocks(g, x, delta, mixed, previousX, previousG, dimension);
}

template <class Scalar>
double clipWeights(const Scalar* self, std::vector<MixInput>& inputs, double radius,
                   std::size_t dimension) {
  std::vector<double> distances;
  distances.reserve(inputs.size());
  for (const MixInput& input : inputs) {
    distances.push_back(
        std::sqrt(squaredDistance(static_cast<const Scalar*>(input.values), self, dimension)));
  }
  if (radius <= 0 && !distances.empty()) {
    std::vector<double> sorted = distances;
    const auto middle = sorted.begin() + static_cast<std::ptrdiff_t>((sorted.size() - 1) / 2);
    std::nth_element(sorted.begin(), middle, sorted.end());
    radius = *middle;  // the lower median
  }
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    if (distances[k] > radius) inputs[k].weight *= radius / distances[k];
  }
  return radius;
}

template <class Scalar>
void trimmedMean(const Scalar* self, const std::vector<MixInput>& inputs, std::size_t trim,
                 Scalar* out, std::size_t dimension) {
  const std::size_t count = inputs.size() + 1;
  if (count <= 2 * trim) {
    if (out != self) std::copy(self, self + dimension, out);
    return;
  }
  // A block of every coordinate's values, one column per node, sorted down
  // the columns by an odd-even transposition network: min/max of whole
  // columns, so it vectorises; count is degree + 1, small. Summing the kept
  // columns, not "all minus the extremes", keeps a huge value from
  // swallowing the small ones.
  using Columns = Eigen::Array<Scalar, Eigen::Dynamic, Eigen::Dynamic>;
  using ConstSegment = Eigen::Map<const Eigen::Array<Scalar, Eigen::Dynamic, 1>>;
  const auto kept = static_cast<Scalar>(count - 2 * trim);
  Columns values(static_cast<Eigen::Index>(std::min(kBlock, dimension)),
                 static_cast<Eigen::Index>(count));
  Eigen::Array<Scalar, Eigen::Dynamic, 1> low(values.rows());
  for (std::size_t begin = 0; begin < dimension; begin += kBlock) {
    const auto n = static_cast<Eigen::Index>(std::min(kBlock, dimension - begin));
    auto block = values.topRows(n);
    block.col(0) = ConstSegment(self + begin, n);
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      block.col(static_cast<Eigen::Index>(k + 1)) =
          ConstSegment(static_cast<const Scalar*>(inputs[k].values) + begin, n);
    }
    for (std::size_t pass = 0; pass < count; ++pass) {
      for (std::size_t k = pass % 2; k + 1 < count; k += 2) {
        auto a = block.col(static_cast<Eigen::Index>(k));
        auto b = block.col(static_cast<Eigen::Index>(k + 1));
        low.head(n) = a.min(b);
        b = a.max(b);
        a = low.head(n);
      }
    }
    Eigen::Map<Eigen::Array<Scalar, Eigen::Dynamic, 1>>(out + begin, n) =
        block
            .middleCols(static_cast<Eigen::Index>(trim),
                        static_cast<Eigen::Index>(count - 2 * trim))
            .rowwise()
            .sum() /
        kept;
  }
}

template double squaredDistance<float>(const float*, const float*, std::size_t);
template double squaredDistance<double>(const double*, const double*, std::size_t);
template RoundSums roundSums<float>(const float*, const float*, const float*, const float*,
                                    const float*, const float*, std::size_t);
template RoundSums roundSums<double>(const double*, const double*, const double*, const double*,
                                     const double*, const double*, std::size_t);
template double clipWeights<float>(const float*, std::vector<MixInput>&, double, std::size_t);
template double clipWeights<double>(const double*, std::vector<MixInput>&, double, std::size_t);
template void trimmedMean<float>(const float*, const std::vector<MixInput>&, std::size_t, float*,
                                 std::size_t);
template void trimmedMean<double>(const double*, const std::vector<MixInput>&, std::size_t, double*,
                                  std::size_t);
template void fusedMix<float>(const float*, double, const std::vector<MixInput>&, float*,
                              std::size_t, const MixExtras<float>&);
template void fusedMix<double>(const double*, double, const std::vector<MixInput>&, double*,
                               std::size_t, const MixExtras<double>&);

}  // namespace consensusd::consensus
