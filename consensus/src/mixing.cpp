#include "consensusd/consensus/mixing.hpp"

#include <algorithm>

namespace consensusd::consensus {
namespace {

constexpr std::size_t kBlock = 2048;  // elements per block: inputs stay in L1/L2

}  // namespace

double absorbSelfWeight(const std::vector<MixInput>& inputs) {
  double sum = 0;
  for (const MixInput& input : inputs) sum += input.weight;
  return std::max(0.0, 1.0 - sum);
}

template <class Scalar>
void fusedMix(const Scalar* self, double selfWeight, const std::vector<MixInput>& inputs,
              Scalar* out, std::size_t dimension) {
  using Segment = Eigen::Map<Eigen::Array<Scalar, Eigen::Dynamic, 1>>;
  using ConstSegment = Eigen::Map<const Eigen::Array<Scalar, Eigen::Dynamic, 1>>;
  for (std::size_t begin = 0; begin < dimension; begin += kBlock) {
    const auto n = static_cast<Eigen::Index>(std::min(kBlock, dimension - begin));
    Segment block(out + begin, n);
    block = static_cast<Scalar>(selfWeight) * ConstSegment(self + begin, n);
    for (const MixInput& input : inputs) {
      block += static_cast<Scalar>(input.weight) *
               ConstSegment(static_cast<const Scalar*>(input.values) + begin, n);
    }
  }
}

template void fusedMix<float>(const float*, double, const std::vector<MixInput>&, float*,
                              std::size_t);
template void fusedMix<double>(const double*, double, const std::vector<MixInput>&, double*,
                               std::size_t);

}  // namespace consensusd::consensus
