#include "consensusd/consensus/wait_policy.hpp"

#include <algorithm>
#include <chrono>

#include "consensusd/consensus/mixing.hpp"

namespace consensusd::consensus {
namespace {

class WaitForAll : public WaitPolicy {
 public:
  WaitDecision decide(const PolicyContext& context) override {
    return {context.maxCount, std::nullopt};
  }
};

class StaticBackups : public WaitPolicy {
 public:
  explicit StaticBackups(std::int64_t backups) : backups_(backups) {}
  WaitDecision decide(const PolicyContext& context) override {
    const auto wanted = static_cast<std::int64_t>(context.degree) - backups_;
    const auto count = static_cast<std::size_t>(std::max<std::int64_t>(wanted, 0));
    return {std::clamp(count, context.minCount, context.maxCount), std::nullopt};
  }

 private:
  std::int64_t backups_;
};

class FixedTimeout : public WaitPolicy {
 public:
  explicit FixedTimeout(Duration timeout) : timeout_(timeout) {}
  WaitDecision decide(const PolicyContext& context) override {
    return {context.maxCount, timeout_};
  }

 private:
  Duration timeout_;
};

class ArrivalQuantile : public WaitPolicy {
 public:
  explicit ArrivalQuantile(double q) : q_(q) {}
  WaitDecision decide(const PolicyContext& context) override {
    if (context.arrivals->size() == 0) return {context.maxCount, std::nullopt};
    return {context.maxCount, context.arrivals->pooledQuantile(q_)};
  }

 private:
  double q_;
};

class Dynamic : public WaitPolicy {
 public:
  Dynamic(std::int64_t warmupRounds, const PolicySpec& spec)
      : warmupRounds_(warmupRounds), spec_(spec) {}
  WaitDecision decide(const PolicyContext& context) override {
    if (context.round < warmupRounds_ || context.arrivals->size() < 2 ||
        context.gradients->samples() < 2) {
      return {context.maxCount, std::nullopt};
    }
    const std::vector<DynamicScore> scores = dynamicScores(context, spec_);
    // Of equal scores, the most neighbours whose arrivals cost no time beyond
    // our own compute (m ascends); not those the lead-bound floor alone ties:
    // waiting for them slows this node, which holds its neighbours at their
    // bound, and the tie spreads (docs/design-notes.md, "Ties go to more neighbours").
    const DynamicScore* best = nullptr;
    for (const DynamicScore& score : scores) {
      if (score.gain <= 0) continue;
      if (best == nullptr || score.rho > best->rho ||
          (score.rho == best->rho && score.waitS <= best->waitS))
        best = &score;
    }
    // Under mild delays the rates of several m differ by a few percent, less
    // than the model's error, and the gain undervalues mixing there: take the
    // most neighbours within the margin. Rates at the node's own pace (not
    // the floor's), and only once the window is full: a few rounds cannot
    // show that a wait is cheap when spikes are rare (docs/design-notes.md,
    // "A margin for mixing").
    if (best != nullptr && context.arrivals->full()) {
      const auto pace = [](const DynamicScore& score) {
        return score.gain / std::max(score.waitS, 1e-9);
      };
      const double least = (1.0 - spec_.tieMargin) * pace(*best);
      for (const DynamicScore& score : scores) {
        if (score.m > best->m && score.gain > 0 && pace(score) >= least) best = &score;
      }
    }
    return {best != nullptr ? best->m : context.maxCount, std::nullopt};
  }

 private:
  std::int64_t warmupRounds_;
  PolicySpec spec_;
};

}  // namespace

std::vector<DynamicScore> dynamicScores(const PolicyContext& context, const PolicySpec& spec) {
  // Live neighbours; their order does not matter, since every one is weighed
  // by its chance of being in by each cut-off.
  std::vector<const NeighborView*> order;
  for (const NeighborView& neighbor : *context.neighbors) {
    if (neighbor.live) order.push_back(&neighbor);
  }
  std::vector<std::size_t> liveSlots;
  liveSlots.reserve(order.size());
  for (const NeighborView* neighbor : order) liveSlots.push_back(neighbor->slot);

  const double eta = context.learningRate;
  // With the heterogeneity term (opt-in), descent counts only the part of the
  // gradient that moves the network: what the neighbours pull back every
  // round is the node's data differing from theirs (zero for i.i.d. data;
  // most of ||g||^2 with skewed labels).
  const double gradNormSq = spec.heterogeneityTerm ? context.gradients->progressNormSq()
                                                   : context.gradients->gradNormSq();
  const double noise = context.gradients->variance() /
                       static_cast<double>(std::max<std::size_t>(context.batchSize, 1));
  const double smoothness = context.gradients->smoothness();
  const ArrivalHistory::Forecast forecast = context.arrivals->forecast(liveSlots, context.now);
  std::vector<DynamicScore> scores;
  for (std::size_t m = context.minCount; m <= context.maxCount; ++m) {
    double used = 0;
    double squares = 0;
    double pull = 0;
    // Every neighbour in by the cut-off is mixed, not only the m waited for
    // (under bimodal delays, waiting for one brings in every one not slow).
    const std::vector<double>& inTime = forecast.inTime[std::min(m, order.size())];
    for (std::size_t k = 0; k < order.size(); ++k) {
      const double weight = inTime[k] * order[k]->weight;
      used += weight;
      squares += weight * order[k]->weight;
      if (order[k]->distanceSq >= 0) pull += weight * order[k]->distanceSq;
    }
    if (context.renormalizeSelf >= 0) {
      // Priced at the weights the mix will apply: self and those in scaled to 1.
      const double scale = renormalizeScale(context.renormalizeSelf, used);
      used *= scale;
      squares *= scale * scale;
      pull *= scale;
    }
    const double self = std::max(0.0, 1.0 - used);
    const double s2 = self * self + squares;
    // Descent of one SGD step, plus the pull toward the neighbours
    // (L/2 sum w ||x_j - x_i||^2: what mixing removes from the disagreement,
    // weighted like the smoothness bound does). The noise term of a one-shot
    // average is off by default: in gossip every node's gradient noise
    // reaches the network average with weight 1/N whatever m is.
    const double gain = eta * gradNormSq * (1.0 - smoothness * eta / 2.0) -
                        (spec.noiseTerm ? smoothness * eta * eta / 2.0 * noise * s2 : 0.0) +
                        (spec.pullTerm ? smoothness / 2.0 * pull : 0.0);
    const Duration wait = forecast.roundTime[std::min(m, liveSlots.size())];
    const Duration expected = std::max(wait, context.leadFloor);
    const double seconds = std::max(std::chrono::duration<double>(expected).count(), 1e-9);
    scores.push_back(
        {m, gain, seconds, std::chrono::duration<double>(wait).count(), gain / seconds});
  }
  return scores;
}

std::unique_ptr<WaitPolicy> makePolicy(const PolicySpec& spec, std::int64_t warmupRounds) {
  switch (spec.kind) {
    case PolicyKind::All:
      return std::make_unique<WaitForAll>();
    case PolicyKind::Static:
      return std::make_unique<StaticBackups>(spec.backups);
    case PolicyKind::Timeout:
      return std::make_unique<FixedTimeout>(spec.timeout);
    case PolicyKind::Quantile:
      return std::make_unique<ArrivalQuantile>(spec.quantile);
    case PolicyKind::Dynamic:
      return std::make_unique<Dynamic>(warmupRounds, spec);
  }
  return std::make_unique<WaitForAll>();
}

}  // namespace consensusd::consensus
