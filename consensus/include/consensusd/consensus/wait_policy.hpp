#pragma once
// Wait policies (docs/design.md §3) behind one interface: each round, how many
// fresh neighbours to wait for, and optionally a time after the round start
// at which to stop waiting anyway. The engine applies the decision together
// with m_min, suspects and the hard deadline.

#include <memory>
#include <optional>
#include <vector>

#include "consensusd/consensus/estimators.hpp"
#include "consensusd/consensus/options.hpp"

namespace consensusd::consensus {

struct NeighborView {
  std::size_t slot;
  double weight;      // w_ij
  bool live;          // not suspect
  double distanceSq;  // ||x_j - x_i||^2 from its newest estimate seen; < 0 when unknown
};

struct PolicyContext {
  std::int64_t round = 0;
  std::size_t degree = 0;
  std::size_t live = 0;
  std::size_t minCount = 0;  // m_min, limited to the live neighbours
  std::size_t maxCount = 0;  // m_max (or the degree), limited to the live neighbours
  double learningRate = 0.0;
  std::size_t batchSize = 1;
  const std::vector<NeighborView>* neighbors = nullptr;
  const ArrivalHistory* arrivals = nullptr;
  const GradientEstimator* gradients = nullptr;
  Duration leadFloor{};  // the lead bound keeps rounds at least this long (0: not binding)
  Time now{};            // the round start being decided
  // mix = renormalize: the topology's self weight, with which those in share
  // a missing neighbour's weight (negative: absorb, self keeps it).
  double renormalizeSelf = -1.0;
};

struct WaitDecision {
  std::size_t count = 0;           // fresh neighbours to wait for (m)
  std::optional<Duration> cutoff;  // stop waiting this long after the round start
};

class WaitPolicy {
 public:
  virtual ~WaitPolicy() = default;
  virtual WaitDecision decide(const PolicyContext& context) = 0;
};

std::unique_ptr<WaitPolicy> makePolicy(const PolicySpec& spec, std::int64_t warmupRounds);

// The dynamic rule's pieces, exposed for tests and the status socket.
struct DynamicScore {
  std::size_t m;
  double gain;
  double expectedTimeS;  // E[T(m)], floored at the lead-bound pace
  double waitS;          // E[T(m)] before the floor
  double rho;
};
// The terms counted are the spec's (pullTerm, noiseTerm, heterogeneityTerm).
std::vector<DynamicScore> dynamicScores(const PolicyContext& context, const PolicySpec& spec = {});

}  // namespace consensusd::consensus
