#include "consensusd/consensus/round_engine.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <utility>

#include "consensusd/consensus/mixing.hpp"
#include "consensusd/topology/analysis.hpp"
#include "round_arithmetic.hpp"

namespace consensusd::consensus {

const char* cutoffName(CutoffReason reason) {
  constexpr data::NameTable<CutoffReason, 3> kNames{{{CutoffReason::Count, "count"},
                                                     {CutoffReason::Timeout, "timeout"},
                                                     {CutoffReason::Deadline, "deadline"}}};
  return data::nameOf(kNames, reason).data();
}
namespace {

// A neighbour whose estimate is half here is suspect only after this many
// peer timeouts of silence: its transfer stalled, it did not end (on a
// congested link TCP backs off for seconds after a loss; two estimates
// into one 100 Mbit/s link stalled past 3 s).
constexpr int kStalledTransfer = 4;
// The curvature's sample: every value of a model up to this size, every
// stride-th of a larger one (the ratio of two sums over the same
// coordinates: a model of 100M parameters keeps 8 MB, not 800).
constexpr Eigen::Index kCurvatureSample = Eigen::Index{1} << 20;

}  // namespace

template <class Scalar>
RoundEngine<Scalar>::RoundEngine(const topology::Topology& topology, std::size_t self,
                                 EngineOptions options, data::Schedule schedule, double momentum,
                                 Vector initial, Time now, std::int64_t firstRound)
    : topology_(&topology),
      self_(self),
      options_(options),
      schedule_(schedule),
      policy_(makePolicy(options.policy, options.warmupRounds)),
      arrivals_(topology.inNeighbors(self).size(), options.windowRounds, options.hardDeadline),
      gradients_(options.windowRounds, options.batchSize),
      sgd_(static_cast<std::size_t>(initial.size()), momentum),
      join_{firstRound == 0, false},
      round_(firstRound),
      params_(std::make_shared<Vector>(std::move(initial))),
      topologySelfWeight_(topology.selfWeight(self)) {
  const auto dimension = static_cast<std::size_t>(params_->size());
  const std::vector<std::size_t> hops = topology::hopsFrom(topology, self);
  for (const topology::Neighbor& neighbor : topology.inNeighbors(self)) {
    slots_.push_back(newSlot(neighbor.index, now));
    placeSlot(slots_.back(), neighbor, hops, topology.size());
  }
  if (options_.outer == Outer::Nesterov) {
    if (sgd_.hasMomentum())
      throw std::invalid_argument("the outer step keeps its own momentum: no train.momentum");
    outer_.emplace(dimension, options_.outerLearningRate, options_.outerMomentum);
  }
  if (compressed()) {
    if (options_.robust != Robust::None)
      throw std::invalid_argument("compressed estimates mix public copies: no robust mixing");
    // Allocated once (each slot's copy too), with the other model-sized buffers (modelBuffers).
    publicCopy_ = std::make_shared<Vector>(params_->size());
  }
  // Model-sized buffers: x_k and x_hat, rotated by a swap each round, and
  // the update (no allocation, no copy per round).
  mixed_ = std::make_shared<Vector>(params_->size());
  gradient_.setZero(params_->size());  // zeros: swapGradient hands these out
  sampleStride_ =
      std::max<Eigen::Index>(1, (params_->size() + kCurvatureSample - 1) / kCurvatureSample);
}

template <class Scalar>
typename RoundEngine<Scalar>::Slot RoundEngine<Scalar>::newSlot(std::size_t node, Time now) const {
  const auto dimension = static_cast<std::size_t>(params_->size());
  Slot slot(node, Mailbox<Scalar>(options_.mailboxDepth, dimension), now);
  if (compressed()) slot.copy.resize(params_->size());
  return slot;
}

template <class Scalar>
void RoundEngine<Scalar>::placeSlot(Slot& slot, const topology::Neighbor& neighbor,
                                    const std::vector<std::size_t>& hops, std::size_t nodes) const {
  slot.node = neighbor.index;
  slot.weight = neighbor.weight;
  // A neighbour that hears us (in h hops) runs at most max_lead rounds
  // ahead of each node on the way: lead bound and skip target both stop there.
  const std::size_t h =
      hops[neighbor.index] != topology::kUnreachable ? hops[neighbor.index] : nodes;
  slot.reach = addSaturating(0, options_.skipAhead + 1);
  for (std::size_t k = 0; k < h; ++k) slot.reach = addSaturating(slot.reach, options_.maxLead);
}

template <class Scalar>
void RoundEngine<Scalar>::setTopology(const topology::Topology& next, std::size_t self, Time now) {
  if (phase_ != Phase::Idle) throw std::logic_error("a new topology applies between rounds");
  std::vector<Slot> old = std::move(slots_);
  slots_.clear();
  const std::vector<std::size_t> hops = topology::hopsFrom(next, self);
  for (const topology::Neighbor& neighbor : next.inNeighbors(self)) {
    const std::string& id = next.node(neighbor.index).id;
    const auto kept = std::find_if(old.begin(), old.end(), [&](const Slot& slot) {
      return topology_->node(slot.node).id == id;
    });
    // A new neighbour counts once it speaks (two messages revive a suspect):
    // it may not run yet, and a round must not wait a peer timeout for it.
    slots_.push_back(kept != old.end() ? std::move(*kept)
                                       : newSlot(neighbor.index, now - options_.peerTimeout));
    placeSlot(slots_.back(), neighbor, hops, next.size());
  }
  topology_ = &next;
  self_ = self;
  topologySelfWeight_ = next.selfWeight(self);
  // The window's columns were the old slots: the estimators start again.
  arrivals_ = ArrivalHistory(slots_.size(), options_.windowRounds, options_.hardDeadline);
  policy_ = makePolicy(options_.policy, options_.warmupRounds);
}

template <class Scalar>
std::optional<std::size_t> RoundEngine<Scalar>::slotOf(std::size_t node) const {
  for (std::size_t s = 0; s < slots_.size(); ++s) {
    if (slots_[s].node == node) return s;
  }
  return std::nullopt;
}

template <class Scalar>
Duration RoundEngine<Scalar>::silenceLimit(const Slot& slot) const {
  return slot.arriving ? kStalledTransfer * options_.peerTimeout : options_.peerTimeout;
}

template <class Scalar>
bool RoundEngine<Scalar>::suspect(std::size_t slot, Time now) const {
  return slots_[slot].presence != Presence::Working ||
         now - slots_[slot].lastHeard >= silenceLimit(slots_[slot]);
}

template <class Scalar>
std::int64_t RoundEngine<Scalar>::horizon(std::size_t slot) const {
  return addSaturating(round_, slots_[slot].reach);
}

template <class Scalar>
bool RoundEngine<Scalar>::countedOut(std::size_t slot, Time now) const {
  // Further behind than the lead bound ever lets a neighbour fall: it is new
  // or back from an absence, and catches up by skipping to us; waiting for
  // it (or holding our lead to it) would stall us while it does.
  const std::int64_t reach = addSaturating(options_.maxLead, options_.skipAhead);
  return suspect(slot, now) || addSaturating(slots_[slot].newestRound, reach) < round_;
}

template <class Scalar>
std::size_t RoundEngine<Scalar>::liveCount(Time now) const {
  std::size_t live = 0;
  for (std::size_t s = 0; s < slots_.size(); ++s) live += countedOut(s, now) ? 0u : 1u;
  return live;
}

template <class Scalar>
std::int64_t RoundEngine<Scalar>::oldestUseful() const {
  return options_.mixRound == MixRound::Newest ? round_ - options_.staleness : round_;
}

template <class Scalar>
const typename Mailbox<Scalar>::Entry* RoundEngine<Scalar>::usable(const Slot& slot,
                                                                   std::int64_t round) const {
  const auto* newest = slot.mailbox.newest();
  if (options_.mixRound == MixRound::Newest) {
    return newest != nullptr && newest->round >= round - options_.staleness ? newest : nullptr;
  }
  if (const auto* exact = slot.mailbox.exact(round)) return exact;
  // `same`: a neighbour further ahead than the ring holds counts with its newest.
  return newest != nullptr && newest->round > round ? newest : nullptr;
}

template <class Scalar>
void RoundEngine<Scalar>::setPolicy(const PolicySpec& spec) {
  pendingPolicy_ = spec;
}

template <class Scalar>
PolicyContext RoundEngine<Scalar>::policyContext(Time now) {
  views_.clear();
  for (std::size_t s = 0; s < slots_.size(); ++s)
    views_.push_back({s, slots_[s].weight, !countedOut(s, now), slots_[s].distanceSq});
  PolicyContext context;
  context.round = round_;
  context.now = now;
  context.degree = slots_.size();
  context.live = liveCount(now);
  const std::size_t upper =
      options_.maxResponders == 0 ? slots_.size() : std::min(options_.maxResponders, slots_.size());
  context.maxCount = std::min(upper, context.live);
  context.minCount = std::min(options_.minResponders, context.maxCount);
  context.learningRate = deltaEta_ ? *deltaEta_ : schedule_.at(round_);
  context.batchSize = options_.batchSize;
  context.neighbors = &views_;
  context.arrivals = &arrivals_;
  context.gradients = &gradients_;
  if (options_.mixMode == MixMode::Renormalize) context.renormalizeSelf = topologySelfWeight_;
  context.leadFloor =
      arrivals_.meanBlocked() > Duration::zero() ? arrivals_.meanCycle() : Duration::zero();
  return context;
}

template <class Scalar>
std::optional<typename RoundEngine<Scalar>::Start> RoundEngine<Scalar>::tryStart(Time now) {
  if (phase_ != Phase::Idle) return std::nullopt;
  // Lead bound (stale-synchronous): never more than max_lead rounds ahead of
  // any live neighbour's newest round; suspects, and neighbours catching up
  // from far behind, do not hold us back.
  for (std::size_t s = 0; s < slots_.size(); ++s) {
    if (!countedOut(s, now) && round_ > addSaturating(slots_[s].newestRound, options_.maxLead)) {
      if (!blockedSince_) blockedSince_ = now;
      return std::nullopt;
    }
  }

  if (pendingPolicy_) {
    options_.policy = *pendingPolicy_;
    policy_ = makePolicy(*pendingPolicy_, options_.warmupRounds);
    pendingPolicy_.reset();
  }
  if (!started_) {
    // A neighbour not heard yet is suspect a peer timeout after our first
    // round began, not after we were made (making a large model resident
    // can take seconds).
    for (Slot& slot : slots_)
      if (slot.newestRound < 0 && !slot.revivalStart)
        slot.lastHeard = std::max(slot.lastHeard, now);
    started_ = true;
  }
  phase_ = Phase::Running;
  roundStart_ = now;
  blocked_ = blockedSince_ ? now - *blockedSince_ : Duration::zero();
  blockedSince_.reset();
  haveGradient_ = false;
  decidedReason_.reset();
  measureDueDistances();  // estimates that came since the last round's end
  decision_ = policy_->decide(policyContext(now));
  publishedAt_.reset();
  publication_.reset();
  Start start;
  start.round = round_;
  start.params = params_;
  start.publish = !publishesUpdate();
  if (start.publish) static_cast<Publication&>(start) = publish(now);
  return start;
}

template <class Scalar>
typename RoundEngine<Scalar>::Publication RoundEngine<Scalar>::publish(Time now) {
  publishedAt_ = now;
  Publication out{round_, params_, nullptr, -1, nullptr};
  if (!compressed()) return out;
  // A keyframe may still be on its way: the next frame builds on a copy of it.
  if (publicCopy_.use_count() > 1) publicCopy_ = std::make_shared<Vector>(*publicCopy_);
  Vector& copy = writable(publicCopy_);
  if (publicRound_ < 0) {
    copy = *params_;  // the first round: a keyframe to everyone
  } else {
    if (!frame_ || frame_.use_count() > 1) {  // a send may still hold the last one
      frame_ = std::make_shared<std::vector<std::byte>>(
          frameBytes(options_.compression, static_cast<std::size_t>(copy.size())));
    } else {
      // The last send let go with a release decrement: see its reads (as writable()).
      std::atomic_thread_fence(std::memory_order_acquire);
    }
    encodeDifference<Scalar>(options_.compression, valuesOf(std::as_const(*params_)),
                             valuesOf(copy), *frame_);
    out.frame = frame_;
    out.base = publicRound_;
  }
  publicRound_ = round_;
  out.publicCopy = publicCopy_;
  return out;
}

template <class Scalar>
void RoundEngine<Scalar>::publishUpdated(Time now) {
  // x_k was handed to the compute job: write x_k + u into a fresh buffer
  // while it is still held.
  if (params_.use_count() > 1) {
    params_ = std::make_shared<Vector>(*params_);
  } else {
    std::atomic_thread_fence(std::memory_order_acquire);  // as writable()
  }
  applyUpdate(*params_, schedule_.at(round_));
  publication_ = publish(now);
}

template <class Scalar>
std::optional<typename RoundEngine<Scalar>::Publication> RoundEngine<Scalar>::takePublication() {
  std::optional<Publication> out;
  out.swap(publication_);
  return out;
}

template <class Scalar>
void RoundEngine<Scalar>::onGradient(std::int64_t round, const Eigen::Ref<const Vector>& gradient,
                                     double loss, const data::GradientStats& stats, Time now,
                                     UpdateKind kind) {
  if (!awaitsUpdate(round)) return;
  gradient_ = gradient;
  tookUpdate(kind, loss, stats, now);
}

template <class Scalar>
bool RoundEngine<Scalar>::awaitsUpdate(std::int64_t round) const {
  return phase_ == Phase::Running && round == round_ && !haveGradient_;
}

template <class Scalar>
void RoundEngine<Scalar>::tookUpdate(UpdateKind kind, double loss, const data::GradientStats& stats,
                                     Time now) {
  updateKind_ = kind;
  haveProbe_ = false;
  loss_ = loss;
  stats_ = stats;
  gradientAt_ = now;
  haveGradient_ = true;
  if (publishesUpdate()) publishUpdated(now);
}

template <class Scalar>
void RoundEngine<Scalar>::swapGradient(std::int64_t round, Vector& gradient, double loss,
                                       const data::GradientStats& stats, Time now) {
  if (!awaitsUpdate(round)) return;
  if (gradient.size() != params_->size())
    throw std::logic_error("swapGradient: the gradient's dimension is not the parameters'");
  gradient_.swap(gradient);
  tookUpdate(UpdateKind::Gradient, loss, stats, now);
}

template <class Scalar>
void RoundEngine<Scalar>::onDelta(std::int64_t round, const Eigen::Ref<const Vector>& delta,
                                  const Eigen::Ref<const Vector>& gradient, double loss,
                                  const data::GradientStats& stats, Time now) {
  if (!awaitsUpdate(round)) return;
  onGradient(round, delta, loss, stats, now, UpdateKind::Delta);
  probe_ = gradient;
  haveProbe_ = true;
}

template <class Scalar>
bool RoundEngine<Scalar>::usableArriving(Time now) const {
  for (std::size_t s = 0; s < slots_.size(); ++s) {
    const Slot& slot = slots_[s];
    if (slot.arriving && *slot.arriving >= oldestUseful() &&
        now - slot.arrivingAt < silenceLimit(slot) && !suspect(s, now) &&
        usable(slot, round_) == nullptr)
      return true;
  }
  return false;
}

template <class Scalar>
std::vector<std::span<Scalar>> RoundEngine<Scalar>::modelBuffers() {
  std::vector<std::span<Scalar>> out;
  std::vector<Vector*> buffers{params_.get(), mixed_.get(), &gradient_};
  if (publicCopy_) buffers.push_back(publicCopy_.get());
  for (Slot& slot : slots_) buffers.push_back(&slot.copy);
  for (Vector* v : buffers)
    if (v->size() > 0) out.emplace_back(v->data(), static_cast<std::size_t>(v->size()));
  return out;
}

template <class Scalar>
typename RoundEngine<Scalar>::Vector RoundEngine<Scalar>::takeSpentUpdate() {
  if (phase_ != Phase::Idle) return {};
  Vector spent;
  spent.swap(gradient_);
  return spent;
}

template <class Scalar>
std::optional<CutoffReason> RoundEngine<Scalar>::cutoffReached(Time now) const {
  if (!haveGradient_) return std::nullopt;  // our own step needs our gradient
  std::size_t responders = 0;
  // Counted toward the m waited for: the estimates of those that work. One of
  // a neighbour that left or went idle is mixed if here, but the m live
  // ones are still waited for (its goodbye came after its last estimate).
  for (const Slot& slot : slots_)
    responders += usable(slot, round_) != nullptr && slot.presence == Presence::Working ? 1u : 0u;
  const std::size_t live = liveCount(now);
  if (responders >= std::min(decision_.count, live)) return CutoffReason::Count;
  if (decision_.cutoff && now >= roundStart_ + *decision_.cutoff &&
      responders >= std::min(options_.minResponders, live)) {
    return CutoffReason::Timeout;
  }
  if (now >= *publishedAt_ + options_.hardDeadline && !usableArriving(now))
    return CutoffReason::Deadline;
  return std::nullopt;
}

template <class Scalar>
std::optional<std::int64_t> RoundEngine<Scalar>::skipTarget(Time now) const {
  std::vector<std::int64_t> rounds;
  for (std::size_t s = 0; s < slots_.size(); ++s) {
    if (!countedOut(s, now) && slots_[s].newestRound >= 0) rounds.push_back(slots_[s].newestRound);
  }
  if (rounds.empty()) return std::nullopt;
  std::sort(rounds.begin(), rounds.end());
  const std::size_t half = rounds.size() / 2;
  // The median (of an even count: halfway between the middle two), so that a
  // node with as many slow neighbours as fast ones still moves toward the fast
  // ones; never past the slowest neighbour's lead bound, where it would only wait.
  const std::int64_t gap = rounds.size() % 2 == 1 ? 0 : rounds[half] - rounds[half - 1];
  const std::int64_t median =
      rounds.size() % 2 == 1 ? rounds[half] : rounds[half - 1] + gap / 2 + gap % 2;
  const std::int64_t target = std::min(median, addSaturating(rounds.front(), options_.maxLead));
  if (target - round_ > options_.skipAhead) return target;
  return std::nullopt;
}

template <class Scalar>
std::optional<RoundRecord> RoundEngine<Scalar>::tryFinish(Time now) {
  if (phase_ == Phase::Running) {
    const std::optional<CutoffReason> reason = cutoffReached(now);
    if (!reason) return std::nullopt;
    if (options_.mixMode != MixMode::Symmetric) return finish(now, *reason);
    // Symmetric: tell every neighbour whether we used it, then wait for theirs.
    phase_ = Phase::Deciding;
    decidedReason_ = reason;
    for (const Slot& slot : slots_)
      outgoingDecisions_.push_back({slot.node, round_, usable(slot, round_) != nullptr});
  }
  if (phase_ != Phase::Deciding) return std::nullopt;
  // A neighbour already past this round (it skipped it) will never decide on
  // it: its messages arrive in order, so a later round without a decision
  // means none is coming, and the edge does not count.
  bool complete = true;
  for (const Slot& slot : slots_) {
    if (usable(slot, round_) != nullptr && slot.decisions.count(round_) == 0 &&
        slot.newestRound <= round_)
      complete = false;
  }
  if (!complete && now < *publishedAt_ + options_.hardDeadline) return std::nullopt;
  return finish(now, *decidedReason_);
}

template <class Scalar>
std::vector<Decision> RoundEngine<Scalar>::takeDecisions() {
  std::vector<Decision> out;
  out.swap(outgoingDecisions_);
  return out;
}

template <class Scalar>
std::optional<Time> RoundEngine<Scalar>::nextWakeup(Time now) const {
  std::optional<Time> next;
  const auto consider = [&](Time t) {
    if (t > now && (!next || t < *next)) next = t;
  };
  for (std::size_t s = 0; s < slots_.size(); ++s) {
    consider(slots_[s].lastHeard + silenceLimit(slots_[s]));
    if (slots_[s].arriving) consider(slots_[s].arrivingAt + silenceLimit(slots_[s]));
  }
  if (phase_ != Phase::Idle && publishedAt_) consider(*publishedAt_ + options_.hardDeadline);
  if (phase_ == Phase::Running && decision_.cutoff) consider(roundStart_ + *decision_.cutoff);
  return next;
}

template <class Scalar>
bool RoundEngine<Scalar>::measuresDistances() const {
  return options_.policy.kind == PolicyKind::Dynamic && options_.policy.pullTerm;
}

template <class Scalar>
const Scalar* RoundEngine<Scalar>::dueValues(const Slot& slot) const {
  if (!slot.distanceDue) return nullptr;
  if (compressed()) return slot.copy.data();  // the copy as the newest frame left it
  const auto* entry = slot.mailbox.exact(*slot.distanceDue);
  return entry != nullptr ? entry->values : nullptr;
}

template <class Scalar>
void RoundEngine<Scalar>::measureDueDistances() {
  const auto dimension = static_cast<std::size_t>(params_->size());
  for (Slot& slot : slots_) {
    if (const Scalar* values = dueValues(slot))
      slot.distanceSq = squaredDistance(values, params_->data(), dimension);
    slot.distanceDue.reset();
  }
}

template <class Scalar>
void RoundEngine<Scalar>::resetParams(const Eigen::Ref<const Vector>& params) {
  if (phase_ != Phase::Idle || params.size() != params_->size())
    throw std::logic_error("resetParams: only between rounds, at the same dimension");
  writable(params_) = params;
}

template <class Scalar>
typename RoundEngine<Scalar>::Vector& RoundEngine<Scalar>::writable(
    std::shared_ptr<Vector>& buffer) {
  // A buffer published at a round start may still be read by a send in
  // flight or the compute job: write it only once nobody else holds it,
  // else take a fresh one (rare: it was published two rounds ago).
  if (buffer.use_count() > 1) {
    buffer = std::make_shared<Vector>(buffer->size());
  } else {
    // The last other holder let go with a release decrement; see its reads.
    std::atomic_thread_fence(std::memory_order_acquire);
  }
  return *buffer;
}

template class RoundEngine<float>;
template class RoundEngine<double>;

}  // namespace consensusd::consensus
