#pragma once
// The mix of docs/design.md §2 step 4 over the neighbours that answered:
// x_hat = (1 - sum_R w_ij) x_i + sum_R w_ij x_j ("absorb": a missing
// neighbour's weight goes to self), or those weights renormalized (the
// default). Always a convex combination when the topology's weights are
// (non-negative rows summing to at most 1).

#include <Eigen/Core>
#include <vector>

namespace consensusd::consensus {

struct MixInput {
  const void* values;  // Scalar[dimension]
  double weight;
};

// Self weight of the absorb rule for the given neighbour weights.
double absorbSelfWeight(const std::vector<MixInput>& inputs);

// "renormalize": the topology's self weight and the weights of the
// neighbours that answered, scaled to sum to 1: a missing neighbour's weight
// is shared by self and those in, in proportion (with uniform weights, the
// plain average of self and those in).
void renormalizeWeights(std::vector<MixInput>& inputs, double selfWeight);
// The factor it scales by when the neighbours in weigh `present` in all
// (1 when nothing is in).
double renormalizeScale(double selfWeight, double present);

// What fusedMix can do in the same pass, block by block while the mix is in
// cache: each input's squared distance ||x_k - self||^2 (inputDistancesSq:
// one per input), the squared distance ||self - mix||^2, then a step
// out += scale * step.
template <class Scalar>
struct MixExtras {
  double* inputDistancesSq = nullptr;
  double* distanceSq = nullptr;
  const Scalar* step = nullptr;
  Scalar stepScale = 0;
};

// out = selfWeight * self + sum_k w_k x_k in one cache-blocked pass (the
// memory traffic of one read of each input and one write), `out` may alias
// `self` (then without distances).
template <class Scalar>
void fusedMix(const Scalar* self, double selfWeight, const std::vector<MixInput>& inputs,
              Scalar* out, std::size_t dimension, const MixExtras<Scalar>& extras = {});

// ||a - b||^2 over `dimension` values in one pass (AVX2 where the CPU has
// it): the distance of a neighbour's estimate, measured as it arrives.
template <class Scalar>
double squaredDistance(const Scalar* a, const Scalar* b, std::size_t dimension);

// What the dynamic rule reads of a finished round, in one pass (AVX2 where
// the CPU has it) over the vectors given; a null one's sums stay 0. g: the
// gradient at x; delta: a trainer's step (g.delta gives its eta); mixed:
// the mix (the heterogeneity's pull (mixed - x).g); previousX and
// previousG: the round before's (the curvature along the path).
struct RoundSums {
  double gradientSq = 0;  // ||g||^2
  double alongDelta = 0;  // g.delta
  double pull = 0;        // (mixed - x).g
  double curvature = 0;   // (g - previousG).(x - previousX)
  double stepSq = 0;      // ||x - previousX||^2
};
template <class Scalar>
RoundSums roundSums(const Scalar* g, const Scalar* x, const Scalar* delta, const Scalar* mixed,
                    const Scalar* previousX, const Scalar* previousG, std::size_t dimension);

// Self-centred clipping: scales each weight by min(1, radius / ||x_k - self||),
// so x_hat = self + sum_k w_k clip(x_k - self) and no neighbour moves us by
// more than w_k * radius. radius 0: the median of the responders' distances
// (a minority of liars cannot set it). Returns the radius used.
template <class Scalar>
double clipWeights(const Scalar* self, std::vector<MixInput>& inputs, double radius,
                   std::size_t dimension);

// Coordinate-wise trimmed mean of self and the inputs (weights ignored): per
// coordinate the `trim` largest and smallest values are dropped and the rest
// averaged. With too few values to trim, out = self.
template <class Scalar>
void trimmedMean(const Scalar* self, const std::vector<MixInput>& inputs, std::size_t trim,
                 Scalar* out, std::size_t dimension);

}  // namespace consensusd::consensus
