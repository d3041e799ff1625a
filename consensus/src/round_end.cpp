// The round's end: RoundEngine::finish and its steps, in the order finish
// takes them (record the arrivals, plan the mix, choose its inputs, settle
// a join, mix, learn from the round, step, advance). The rest of the engine
// (starting rounds, taking estimates in, timing) is round_engine.cpp.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <utility>

#include "consensusd/consensus/mixing.hpp"
#include "consensusd/consensus/round_engine.hpp"

namespace consensusd::consensus {

template <class Scalar>
RoundRecord RoundEngine<Scalar>::finish(Time now, CutoffReason reason) {
  RoundRecord record;
  record.round = round_;
  record.start = roundStart_;
  record.end = now;
  record.compute = gradientAt_ - roundStart_;
  record.blocked = blocked_;
  record.reason = reason;
  record.target = decision_.count;
  record.live = liveCount(now);
  record.loss = loss_;
  record.gradient = stats_;
  recordArrivals(record, now);

  const MixPlan plan = planMix(now);
  record.adopted = join_.joining && plan.newestMixed > plan.joinAbove;
  Chosen chosen = chooseInputs(plan, record);
  if (chosen.inputs.empty()) record.adopted = false;  // symmetric: none of them used ours
  settleJoining(plan.joinAbove, record.adopted, !chosen.inputs.empty(), now);

  // The gradient at x_k: the update itself, or a delta's probe; none for a
  // delta alone (the dynamic rule then has no gradient statistics).
  const bool isGradient = updateKind_ == UpdateKind::Gradient;
  Vector* const g = isGradient ? &gradient_ : haveProbe_ ? &probe_ : nullptr;
  record.learningRate = schedule_.at(round_);
  // (A node that adopts its neighbours' x drops its gradient: it was taken at the x it leaves.)
  // (With publish: update it went out in x_k + u and stays in whatever the mix.)
  record.gradientApplied =
      (publishesUpdate() || round_ >= plan.mixRound - options_.staleness) && !record.adopted;
  // The step goes into the mix's pass unless something must see the mix
  // before it (the heterogeneity term) or it needs the momentum's velocity.
  const bool heterogeneity = g != nullptr && options_.policy.kind == PolicyKind::Dynamic &&
                             options_.policy.heterogeneityTerm;
  // With publish: update the update is in x_k already, published with it.
  const bool stepAfterMix = record.gradientApplied && !publishesUpdate();
  const bool fuseStep = stepAfterMix && !heterogeneity && !(isGradient && sgd_.hasMomentum()) &&
                        !outer_ && options_.robust != Robust::TrimmedMean;
  mixInto(record, chosen, fuseStep);
  learnFromRound(record, g, heterogeneity);
  if (stepAfterMix && !fuseStep) applyUpdate(*mixed_, record.learningRate);
  params_.swap(mixed_);
  if (havePrevious_) keepCurvatureSample(*g);
  advance(record, plan);
  return record;
}

template <class Scalar>
void RoundEngine<Scalar>::recordArrivals(const RoundRecord& record, Time now) {
  ArrivalHistory::Round observed;
  observed.round = round_;
  observed.start = roundStart_;
  observed.compute = record.compute;
  observed.blocked = blocked_;
  observed.duration = now - roundStart_;
  for (const Slot& slot : slots_) {
    const auto* entry = usable(slot, round_);
    observed.censored.push_back(entry == nullptr);
    observed.offsets.push_back(entry != nullptr
                                   ? std::max(Duration::zero(), entry->arrival - roundStart_)
                                   : now - roundStart_);
  }
  arrivals_.record(std::move(observed));
}

template <class Scalar>
typename RoundEngine<Scalar>::MixPlan RoundEngine<Scalar>::planMix(Time now) {
  MixPlan plan;
  // Round skipping: far behind the neighbours, mix with their newest and jump.
  plan.skip = options_.roundSkipping ? skipTarget(now) : std::nullopt;
  // A fresh node does not jump alone to neighbours it holds nothing of yet:
  // it would then send them its x_0 as their round's estimate.
  if (plan.skip && join_.joining &&
      std::none_of(slots_.begin(), slots_.end(),
                   [&](const Slot& slot) { return usable(slot, *plan.skip) != nullptr; }))
    plan.skip.reset();
  plan.mixRound = plan.skip.value_or(round_);
  for (const Slot& slot : slots_)
    if (const auto* entry = usable(slot, plan.mixRound))
      plan.newestMixed = std::max(plan.newestMixed, entry->round);
  // A fresh node that holds estimates of neighbours far ahead joins a
  // running cluster: its x is theirs alone (its own x_0, or a fellow
  // joiner's, would pull them back toward the start until mixing washed it
  // out). While a neighbour is known to be far ahead it stays joining; a
  // whole cluster starting together mixes estimates of its own rounds and
  // keeps x_0. Once a neighbour was seen far ahead (believed there, or
  // claiming it), "far" counts from round 0: a joiner that ran rounds alone
  // until its neighbours came into reach may have caught up with their
  // round numbers, but holds nothing of their state.
  if (join_.joining && std::any_of(slots_.begin(), slots_.end(), [&](const Slot& slot) {
        return slot.aheadSince.has_value() || slot.newestRound > round_ + options_.skipAhead;
      }))
    join_.clusterAhead = true;
  plan.joinAbove = (join_.clusterAhead ? 0 : round_) + options_.skipAhead;
  return plan;
}

template <class Scalar>
typename RoundEngine<Scalar>::Chosen RoundEngine<Scalar>::chooseInputs(const MixPlan& plan,
                                                                       RoundRecord& record) {
  Chosen chosen;
  for (std::size_t s = 0; s < slots_.size(); ++s) {
    Slot& slot = slots_[s];
    const auto* entry = usable(slot, plan.mixRound);
    if (entry == nullptr || (record.adopted && entry->round <= plan.joinAbove)) continue;
    if (options_.mixMode == MixMode::Symmetric && !plan.skip) {
      const auto it = slot.decisions.find(round_);
      if (it == slot.decisions.end() || !it->second) continue;
    }
    chosen.inputs.push_back({entry->values, slot.weight});
    chosen.slots.push_back(s);
    record.responders.push_back(slot.node);
    ++slot.counters.mixed;
  }
  return chosen;
}

template <class Scalar>
void RoundEngine<Scalar>::settleJoining(std::int64_t joinAbove, bool adopted, bool mixedAny,
                                        Time now) {
  // A neighbour that may be the running cluster: known far ahead (believed
  // there, or claiming it and not believed yet), or not heard at all (its
  // connection may still be coming up). A fellow joiner's round can end
  // before either is settled; joining ends only once none is left.
  const bool aheadUnheld = std::any_of(slots_.begin(), slots_.end(), [&](const Slot& slot) {
    const bool claiming = slot.aheadSince && now - slot.aheadLast <= options_.peerTimeout;
    const bool unheard = slot.newestRound < 0 && !slot.aheadSince;
    return (slot.newestRound > joinAbove || claiming || unheard) &&
           slot.presence == Presence::Working;
  });
  if (adopted || (mixedAny && !aheadUnheld)) join_.joining = false;
}

template <class Scalar>
void RoundEngine<Scalar>::mixInto(RoundRecord& record, Chosen& chosen, bool fuseStep) {
  std::vector<MixInput>& inputs = chosen.inputs;
  const Vector& params = *params_;
  Vector& mixed = writable(mixed_);
  const auto dimension = static_cast<std::size_t>(params.size());
  // The mixed neighbours' distances, measured in the mix's pass when the
  // policy reads them (one for every input, the public copy's too).
  std::vector<double> inputDistancesSq;
  double distanceSq = 0;
  MixExtras<Scalar> extras;
  extras.distanceSq = &distanceSq;
  const auto measureInMix = [&] {
    if (!measuresDistances()) return;
    inputDistancesSq.resize(inputs.size());
    extras.inputDistancesSq = inputDistancesSq.data();
  };
  if (record.adopted) {
    double total = 0;
    for (const MixInput& input : inputs) total += input.weight;
    for (MixInput& input : inputs) input.weight /= total;
    record.selfWeight = 0;
    measureInMix();
    fusedMix(params.data(), 0.0, inputs, mixed.data(), dimension, extras);
    record.consensusDistance = std::sqrt(distanceSq);
  } else if (options_.robust == Robust::TrimmedMean) {
    record.selfWeight = 1.0 / static_cast<double>(inputs.size() + 1);  // nominal: unweighted
    trimmedMean(params.data(), inputs, options_.trim, mixed.data(), dimension);
    record.consensusDistance = static_cast<double>((params - mixed).norm());
  } else {
    if (options_.mixMode == MixMode::Renormalize) renormalizeWeights(inputs, topologySelfWeight_);
    if (options_.robust == Robust::Clip)
      clipWeights(params.data(), inputs, options_.clipRadius, dimension);
    record.selfWeight = absorbSelfWeight(inputs);
    double selfWeight = record.selfWeight;
    if (compressed() && !inputs.empty()) {
      // CHOCO-SGD: x + gamma sum_j w_j (c_j - c_i), the public copies'
      // differences (what every neighbour of ours holds of us is c_i).
      double pulled = 0;
      for (MixInput& input : inputs) pulled += input.weight *= options_.consensusStep;
      inputs.push_back({publicCopy_->data(), -pulled});
      selfWeight = 1.0;
      record.selfWeight = 1.0 - pulled;
    }
    measureInMix();
    if (fuseStep) {  // x - eta g and x + (-eta) g are the same floats
      extras.step = gradient_.data();
      extras.stepScale = updateKind_ == UpdateKind::Gradient
                             ? -static_cast<Scalar>(record.learningRate)
                             : Scalar(1);
    }
    fusedMix(params.data(), selfWeight, inputs, mixed.data(), dimension, extras);
    record.consensusDistance = std::sqrt(distanceSq);
  }
  for (std::size_t k = 0; k < std::min(inputDistancesSq.size(), chosen.slots.size()); ++k) {
    Slot& slot = slots_[chosen.slots[k]];
    if (dueValues(slot) == inputs[k].values) {
      slot.distanceSq = inputDistancesSq[k];
      slot.distanceDue.reset();
    }
  }
  measureDueDistances();  // the rest of this round's arrivals, against the same x_k
}

template <class Scalar>
void RoundEngine<Scalar>::learnFromRound(RoundRecord& record, const Vector* g, bool heterogeneity) {
  // What the delta's eta and the dynamic policy read of the round, in one
  // pass: the delta along g; the pull against g, for the heterogeneity;
  // the curvature along the path for L (on a large model's sample, apart).
  const Vector& params = *params_;
  const bool isGradient = updateKind_ == UpdateKind::Gradient;
  const bool dynamic = options_.policy.kind == PolicyKind::Dynamic;
  const bool curvature = havePrevious_ && g != nullptr && dynamic;
  const bool curvatureWhole = curvature && sampleStride_ == 1;
  RoundSums sums;
  if (g != nullptr && (dynamic || !isGradient)) {
    sums = roundSums(g->data(), params.data(), isGradient ? nullptr : gradient_.data(),
                     heterogeneity ? mixed_->data() : nullptr,
                     curvatureWhole ? previousParams_->data() : nullptr,
                     curvatureWhole ? previousGradient_.data() : nullptr,
                     static_cast<std::size_t>(params.size()));
  }
  if (!isGradient && g != nullptr) {
    // The trainer's step along -g: what eta an SGD step of the same
    // progress would have taken (Adam's, momentum's, anything's).
    const double eta =
        sums.gradientSq > 0 ? std::max(-sums.alongDelta / sums.gradientSq, 0.0) : 0.0;
    deltaEta_ = deltaEta_ ? *deltaEta_ + 0.1 * (eta - *deltaEta_) : eta;
    record.learningRate = *deltaEta_;
  }
  if (heterogeneity) gradients_.recordPull(sums.pull, record.learningRate);
  if (curvature) {
    // (g_k - g_{k-1}) . (x_k - x_{k-1}) carries +eta sigma^2 / B from the
    // minibatch noise of g_{k-1}, which also moved x: take it out. On a
    // sample, both sums scale by the stride.
    const double noise = previousEta_ * previousVariance_ /
                         static_cast<double>(std::max<std::size_t>(options_.batchSize, 1));
    const auto scale = static_cast<double>(sampleStride_);
    if (!curvatureWhole) {
      const Vector& previous = *previousParams_;
      const Eigen::Index n = previous.size();
      const auto stride = Eigen::InnerStride<>(sampleStride_);
      const Eigen::Map<const Vector, 0, Eigen::InnerStride<>> x(params.data(), n, stride);
      const Eigen::Map<const Vector, 0, Eigen::InnerStride<>> gk(g->data(), n, stride);
      sums.curvature = static_cast<double>((gk - previousGradient_).dot(x - previous));
      sums.stepSq = static_cast<double>((x - previous).squaredNorm());
    }
    gradients_.recordStep(scale * sums.curvature - noise, scale * sums.stepSq);
  }
  havePrevious_ = g != nullptr && dynamic;
  // ||g||^2 measured here, from the pass above: whatever a driver hands in,
  // and nothing from a delta without its gradient.
  if (g != nullptr && dynamic) gradients_.record(sums.gradientSq, stats_.sampleVariance);
  previousEta_ = record.learningRate;
  previousVariance_ = stats_.sampleVariance;
}

template <class Scalar>
void RoundEngine<Scalar>::applyUpdate(Vector& x, double learningRate) {
  const bool isGradient = updateKind_ == UpdateKind::Gradient;
  if (outer_) {  // a gradient's update is -eta g
    outer_->step(x, gradient_, isGradient ? -static_cast<Scalar>(learningRate) : Scalar(1));
  } else if (isGradient) {
    sgd_.step(x, gradient_, learningRate);
  } else {
    x += gradient_;
  }
}

template <class Scalar>
void RoundEngine<Scalar>::advance(RoundRecord& record, const MixPlan& plan) {
  // A node that adopted the cluster's state goes on at its round.
  const std::int64_t target = plan.skip        ? plan.mixRound
                              : record.adopted ? plan.newestMixed
                                               : round_ + 1;
  record.skipped = target > round_ + 1;
  record.nextRound = std::max(target, round_ + 1);
  round_ = record.nextRound;
  phase_ = Phase::Idle;
  for (Slot& slot : slots_) {
    slot.mailbox.discardBefore(oldestUseful());
    slot.decisions.erase(slot.decisions.begin(), slot.decisions.lower_bound(round_));
  }
}

template <class Scalar>
void RoundEngine<Scalar>::keepCurvatureSample(Vector& gradient) {
  if (sampleStride_ == 1) {
    // x_k's buffer is kept, and x_{k-1}'s takes the next mix (writable()
    // replaces it while a send of it is in flight).
    if (!previousParams_) previousParams_ = std::make_shared<Vector>(params_->size());
    previousParams_.swap(mixed_);
    if (&gradient == &probe_) {
      previousGradient_.swap(probe_);  // the next delta's probe is copied in
    } else {
      previousGradient_ = gradient;  // still the update handed back (takeSpentUpdate)
    }
    return;
  }
  const Vector& params = *mixed_;
  const Eigen::Index n = (params.size() + sampleStride_ - 1) / sampleStride_;
  const auto stride = Eigen::InnerStride<>(sampleStride_);
  if (!previousParams_) previousParams_ = std::make_shared<Vector>(n);
  *previousParams_ = Eigen::Map<const Vector, 0, Eigen::InnerStride<>>(params.data(), n, stride);
  previousGradient_ = Eigen::Map<const Vector, 0, Eigen::InnerStride<>>(gradient.data(), n, stride);
}

// The header declares the engine instantiated elsewhere (extern template):
// what is defined here is instantiated here.
template RoundRecord RoundEngine<float>::finish(Time, CutoffReason);
template void RoundEngine<float>::recordArrivals(const RoundRecord&, Time);
template RoundEngine<float>::MixPlan RoundEngine<float>::planMix(Time);
template RoundEngine<float>::Chosen RoundEngine<float>::chooseInputs(const MixPlan&, RoundRecord&);
template void RoundEngine<float>::settleJoining(std::int64_t, bool, bool, Time);
template void RoundEngine<float>::mixInto(RoundRecord&, Chosen&, bool);
template void RoundEngine<float>::learnFromRound(RoundRecord&, const Vector*, bool);
template void RoundEngine<float>::applyUpdate(Vector&, double);
template void RoundEngine<float>::advance(RoundRecord&, const MixPlan&);
template void RoundEngine<float>::keepCurvatureSample(Vector&);
template RoundRecord RoundEngine<double>::finish(Time, CutoffReason);
template void RoundEngine<double>::recordArrivals(const RoundRecord&, Time);
template RoundEngine<double>::MixPlan RoundEngine<double>::planMix(Time);
template RoundEngine<double>::Chosen RoundEngine<double>::chooseInputs(const MixPlan&,
                                                                       RoundRecord&);
template void RoundEngine<double>::settleJoining(std::int64_t, bool, bool, Time);
template void RoundEngine<double>::mixInto(RoundRecord&, Chosen&, bool);
template void RoundEngine<double>::learnFromRound(RoundRecord&, const Vector*, bool);
template void RoundEngine<double>::applyUpdate(Vector&, double);
template void RoundEngine<double>::advance(RoundRecord&, const MixPlan&);
template void RoundEngine<double>::keepCurvatureSample(Vector&);

}  // namespace consensusd::consensus
