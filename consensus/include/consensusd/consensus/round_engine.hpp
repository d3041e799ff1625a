#pragma once
// One node's round (docs/design.md §2) as a state machine driven from outside:
// the daemon drives it on the real clock, the simulator on a virtual one.
// No sockets, no files, no clock: every call carries `now`.
//
// A driver's loop:
//   if (auto start = engine.tryStart(now)) { if (start->publish) send(*start);
//                                            computeGradientAt(*start->params); }
//   on a message:      engine.onEstimate(sender, round, values, now);
//   on the gradient:   engine.onGradient(round, g, loss, stats, now);  (or swapGradient)
//   publish: update:   if (auto p = engine.takePublication()) send(*p);
//   symmetric mode:    send engine.takeDecisions(); engine.onDecision(...);
//   if (auto record = engine.tryFinish(now)) { log, metrics }
//   sleep until a message, the gradient, or engine.nextWakeup().
//
// Not thread-safe: one owner (the daemon's engine thread).

#include <Eigen/Core>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <variant>
#include <vector>

#include "consensusd/consensus/estimators.hpp"
#include "consensusd/consensus/mailbox.hpp"
#include "consensusd/consensus/mixing.hpp"
#include "consensusd/consensus/options.hpp"
#include "consensusd/consensus/wait_policy.hpp"
#include "consensusd/data/model.hpp"
#include "consensusd/data/optimizer.hpp"
#include "consensusd/topology/topology.hpp"

namespace consensusd::consensus {

// What ended a round: the m waited for were in, the policy's time-out, or
// the hard deadline.
enum class CutoffReason { Count, Timeout, Deadline };
const char* cutoffName(CutoffReason reason);  // "count", "timeout", "deadline"

// Per-neighbour counters (the status socket shows them).
struct NeighborCounters {
  std::uint64_t onTime = 0;      // stored before the cut-off of its round
  std::uint64_t late = 0;        // stored after it (may serve a later round)
  std::uint64_t stale = 0;       // older than the staleness bound: dropped
  std::uint64_t duplicate = 0;   // same round twice: dropped
  std::uint64_t superseded = 0;  // older than everything held: dropped
  std::uint64_t mixed = 0;       // rounds in which it was averaged
  // Compressed frames that could not be applied: a gap in the sender's
  // sequence, or a frame that does not decode (both wait for a keyframe).
  std::uint64_t gap = 0;
  std::uint64_t corrupt = 0;
};

struct RoundRecord {
  std::int64_t round = 0;
  std::int64_t nextRound = 0;  // round + 1, or the round skipped to
  bool skipped = false;
  // A node that started fresh joined a running cluster: it took its
  // neighbours' estimates (their weighted average) in place of its own x.
  bool adopted = false;
  bool gradientApplied = true;  // false when a skip made it too old
  Time start{};
  Time end{};
  Duration compute{};
  Duration blocked{};  // waiting on the lead bound before the start
  CutoffReason reason = CutoffReason::Count;
  std::size_t target = 0;               // m the policy chose
  std::size_t live = 0;                 // non-suspect neighbours at the cut-off
  std::vector<std::size_t> responders;  // topology indices averaged this round
  double selfWeight = 1.0;
  double consensusDistance = 0.0;  // ||x_i - x_hat||
  double learningRate = 0.0;
  double loss = 0.0;
  data::GradientStats gradient;
};

// What a driver hands the engine for the node's own step: a gradient (the
// engine's optimizer and schedule step along it: x_{k+1} = mix - eta g, with
// momentum if set) or a delta an outside optimizer already took at x_k
// (x_{k+1} = mix + delta; docs/trainers.md).
enum class UpdateKind { Gradient, Delta };

struct Decision {
  std::size_t node;  // topology index of the neighbour to tell
  std::int64_t round;
  bool used;  // whether its estimate was averaged
};

// What a neighbour's last keep-alive (HELLO, or BYE) said of it.
enum class Presence { Working, Idle, Left };

template <class Scalar>
class RoundEngine {
 public:
  using Vector = Eigen::Matrix<Scalar, Eigen::Dynamic, 1>;

  enum class Phase { Idle, Running, Deciding };

  // An estimate for the out-neighbours: x_k (publish: start) or x_k + u
  // (publish: update).
  struct Publication {
    std::int64_t round = 0;
    // Shared, never copied: the engine writes this buffer again only once
    // every holder (sends in flight, the compute job) has let it go.
    std::shared_ptr<const Vector> params;
    // With compression (EngineOptions::compression): the node's public copy
    // c after this round, and the frame that took it there from the copy of
    // round `base`. A neighbour whose copy is at `base` gets the frame; any
    // other (first contact, a gap) the copy whole, as a keyframe. The first
    // round has no frame: every neighbour gets a keyframe.
    std::shared_ptr<const std::vector<std::byte>> frame;
    std::int64_t base = -1;
    std::shared_ptr<const Vector> publicCopy;
  };
  // A round begins: its update is computed at `params` (x_k). With publish:
  // start the estimate leaves now (`publish`: this is its Publication); with
  // publish: update it leaves once the update is in (takePublication()).
  struct Start : Publication {
    bool publish = true;
  };

  RoundEngine(const topology::Topology& topology, std::size_t self, EngineOptions options,
              data::Schedule schedule, double momentum, Vector initial, Time now,
              std::int64_t firstRound = 0);

  std::optional<Start> tryStart(Time now);
  // publish: update: x_k + u, once the round's update came (onGradient,
  // swapGradient, onDelta); taken once. Empty with publish: start.
  std::optional<Publication> takePublication();
  // A new graph while running (an operator applies one), between rounds:
  // neighbours in both keep their slots (mailbox, public copy, counters,
  // presence) under their new index, weight and reach; new ones start as
  // at a start (unheard: suspect a peer timeout from `now` unless heard);
  // those gone are dropped. The arrival window and the policy start again
  // (the window's columns were the old slots). `next` must outlive the
  // engine, or the next call.
  void setTopology(const topology::Topology& next, std::size_t self, Time now);
  // Every message's round is checked against the sender's horizon first
  // (plausibleRound): beyond it, `Implausible`, and nothing changes.
  // `owner` keeps `values` alive: the mailbox then holds them in place (no copy).
  // With compression, an estimate is a keyframe: the sender's public copy,
  // which replaces the one held.
  Receipt onEstimate(std::size_t node, std::int64_t round, const Scalar* values, Time now,
                     std::shared_ptr<const void> owner = {});
  // A compressed frame of the sender's round `round` that builds on its
  // copy of round `base`: applied to the copy held (then what onEstimate
  // would do with the copy), or `Gap` / `Corrupt`, after which only a
  // keyframe brings the copy back. A frame never applied twice or out of order.
  Receipt onFrame(std::size_t node, std::int64_t round, std::int64_t base,
                  std::span<const std::byte> frame, Time now);
  void onGradient(std::int64_t round, const Eigen::Ref<const Vector>& gradient, double loss,
                  const data::GradientStats& stats, Time now,
                  UpdateKind kind = UpdateKind::Gradient);
  // The same without the copy: the engine takes `gradient`'s buffer and
  // hands back one it held, for the driver's next gradient: same size,
  // holding zeros or an update given earlier (the engine never writes an
  // update's buffer), or empty once takeSpentUpdate() took it. Refused
  // (wrong round, one already in): untouched.
  void swapGradient(std::int64_t round, Vector& gradient, double loss,
                    const data::GradientStats& stats, Time now);
  // A delta d together with the gradient g at x_k it came from (a trainer's
  // own optimizer step): d is applied; g gives the dynamic rule what a
  // gradient update gives it (norm, curvature), and its step size is the
  // trainer's, eta = -g.d / ||g||^2.
  void onDelta(std::int64_t round, const Eigen::Ref<const Vector>& delta,
               const Eigen::Ref<const Vector>& gradient, double loss,
               const data::GradientStats& stats, Time now);
  Receipt onDecision(std::size_t node, std::int64_t round, bool usedMine, Time now);
  // A keep-alive from a neighbour working on `round`: not suspect, and its
  // progress counts for the lead bound and skipping even when its estimates
  // were lost (a restarted node must learn where the others are). A
  // neighbour that says it computes nothing (Idle: its trainer is gone) or
  // that it stops (Left: its goodbye) is counted out like a suspect at once,
  // until a keep-alive says it works again.
  Receipt onKeepAlive(std::size_t node, std::int64_t round, Time now,
                      Presence presence = Presence::Working);
  // A part of the neighbour's estimate of `round` arrived (the rest is on
  // its way): a keep-alive, and while parts keep coming the hard deadline
  // waits for an estimate this round can use (on a slow link a whole
  // estimate may take longer); until the rest is in, the neighbour is
  // suspect only after four peer timeouts of silence (a stalled transfer).
  Receipt onArriving(std::size_t node, std::int64_t round, Time now);
  std::optional<RoundRecord> tryFinish(Time now);
  std::vector<Decision> takeDecisions();
  // The next time something can change without a message (cut-off, deadline,
  // a neighbour turning suspect); none when the driver should act now or wait
  // for a message or the gradient.
  std::optional<Time> nextWakeup(Time now) const;

  // The engine's model-sized buffers (x_k, x_hat, the update): where its
  // memory is, for a driver that makes it resident before the first round.
  std::vector<std::span<Scalar>> modelBuffers();

  // The update buffer after a round applied it, for the driver's next
  // gradient (one buffer circulates between the engine and the compute
  // thread instead of two); empty during a round and when none is spent.
  Vector takeSpentUpdate();

  // Takes effect at the next round start.
  void setPolicy(const PolicySpec& spec);
  // Initial parameters from elsewhere (an external trainer's seeded
  // initialisation), before the first round starts.
  void resetParams(const Eigen::Ref<const Vector>& params);

  Phase phase() const { return phase_; }
  std::int64_t round() const { return round_; }
  // Started fresh and not yet joined (or found the cluster starting with it):
  // its first mix of estimates far ahead will take their state.
  bool joining() const { return join_.joining; }
  const Vector& params() const { return *params_; }
  // x_k for a reader that outlives the round (a checkpoint being written):
  // the engine writes a fresh buffer while it is held.
  std::shared_ptr<const Vector> sharedParams() const { return params_; }
  // The momentum velocity (zeros without momentum); checkpoints keep it so a
  // restart does not reset momentum.
  const Vector& velocity() const { return outer_ ? outer_->velocity() : sgd_.velocity(); }
  void restoreVelocity(const Eigen::Ref<const Vector>& velocity) {
    outer_ ? outer_->setVelocity(velocity) : sgd_.setVelocity(velocity);
  }
  bool keepsVelocity() const { return outer_.has_value() || sgd_.hasMomentum(); }
  std::size_t degree() const { return slots_.size(); }
  std::size_t nodeOfSlot(std::size_t slot) const { return slots_[slot].node; }
  // Silent for longer than it may be, or idle: not waited for, no lead bound.
  bool suspect(std::size_t slot, Time now) const;
  Presence presence(std::size_t slot) const { return slots_[slot].presence; }
  std::int64_t newestRound(std::size_t slot) const { return slots_[slot].newestRound; }
  // The highest round `slot`'s sender can honestly have reached while it
  // hears us: our round + max_lead x (hops from us to it) + skip_ahead + 1,
  // saturating. docs/protocol.md, "Plausible rounds".
  std::int64_t horizon(std::size_t slot) const;
  const NeighborCounters& counters(std::size_t slot) const { return slots_[slot].counters; }
  const ArrivalHistory& arrivals() const { return arrivals_; }
  const GradientEstimator& gradients() const { return gradients_; }
  const WaitDecision& decision() const { return decision_; }
  // The context the policy saw at the last round start (for diagnostics).
  PolicyContext policyContext(Time now);

 private:
  struct Slot {
    Slot(std::size_t node_, Mailbox<Scalar> mailbox_, Time heard)
        : node(node_), mailbox(std::move(mailbox_)), lastHeard(heard) {}
    std::size_t node;
    double weight = 0;
    Mailbox<Scalar> mailbox;
    Time lastHeard;
    std::int64_t newestRound = -1;
    double distanceSq = -1;  // ||x_j - x_i||^2 of the newest estimate that arrived
    // The round of a stored estimate whose distance is still to be measured:
    // in the mix's pass if it is mixed, else at the round's end or the next
    // start, against the same x_i it arrived at.
    std::optional<std::int64_t> distanceDue;
    NeighborCounters counters;
    std::map<std::int64_t, bool> decisions;  // symmetric mode: round -> used our estimate
    std::int64_t reach = 0;                  // horizon() - our round
    // A run of claims beyond the horizon with nothing plausible in between:
    // when it spans half a peer timeout, the sender is taken to be ahead for
    // real (we were away), and its claims are accepted until it is back in
    // reach. One message, or a lie between a live neighbour's messages,
    // never gets that far.
    std::optional<Time> aheadSince;
    Time aheadLast{};  // the run's latest claim: a silence of a peer timeout ends it
    std::optional<Time> revivalStart;       // a suspect's first message; a second revives it
    Presence presence = Presence::Working;  // what its last keep-alive said
    std::optional<std::int64_t> arriving;   // the round of an estimate partly here
    Time arrivingAt{};                      // its latest part
    // With compression: our copy of the sender's public copy, and its round
    // (-1: none held; a keyframe must come).
    Vector copy;
    std::int64_t copyRound = -1;
  };

  // A slot for `node` as at a start: nothing held, heard `now` (so
  // suspect a peer timeout from then if nothing comes).
  Slot newSlot(std::size_t node, Time now) const;
  // Its index, weight and reach in a topology.
  void placeSlot(Slot& slot, const topology::Neighbor& neighbor,
                 const std::vector<std::size_t>& hops, std::size_t nodes) const;

  // What an estimate and a keep-alive share: the sender's slot, if it is a
  // neighbour and its round plausible (then heard, its newest round
  // advanced); else why not.
  std::variant<std::size_t, Receipt> admit(std::size_t node, std::int64_t round, Time now);
  // Whether `round` from `slot` may be believed now; updates the ahead run.
  bool plausibleRound(Slot& slot, std::int64_t round, Time now);
  // A message from `slot` was accepted: it is live again, except that a
  // suspect needs two messages (a single replayed one revives nobody).
  void heard(Slot& slot, Time now);
  // The estimate `values` of `slot` for `round` was stored or not: the
  // counters, the late arrivals' record and the pull term's distance.
  Receipt noteStored(std::size_t index, std::int64_t round, const Scalar* values, Receipt receipt,
                     Time now);
  // The slot's copy now holds its round `round`: the only entry its mailbox holds.
  Receipt holdCopy(std::size_t index, std::int64_t round, Time now);
  bool compressed() const { return options_.compression != Compression::None; }
  bool publishesUpdate() const { return options_.publish == Publish::Update; }
  // This round's estimate from x_k as it is now (the frame from the public
  // copy, with compression); the round's wait for neighbours starts.
  Publication publish(Time now);
  // publish: update: x_k + u (the outer step or momentum's, if set) into
  // x_k's buffer, then its publication.
  void publishUpdated(Time now);
  bool awaitsUpdate(std::int64_t round) const;
  static Vector& writable(std::shared_ptr<Vector>& buffer);
  void tookUpdate(UpdateKind kind, double loss, const data::GradientStats& stats, Time now);

  std::optional<std::size_t> slotOf(std::size_t node) const;
  // Suspect, or too far behind to be waited for (it catches up by skipping).
  bool countedOut(std::size_t slot, Time now) const;
  std::size_t liveCount(Time now) const;
  // The estimate of `slot` that counts for `round`, or null.
  const typename Mailbox<Scalar>::Entry* usable(const Slot& slot, std::int64_t round) const;
  std::int64_t oldestUseful() const;
  std::optional<CutoffReason> cutoffReached(Time now) const;
  // How long `slot` may be silent before it is suspect: a peer timeout, or
  // several while an estimate of it is half here.
  Duration silenceLimit(const Slot& slot) const;
  // A live neighbour without a usable estimate is sending one this round can use.
  bool usableArriving(Time now) const;
  // The pull term's distances (dynamic policy) are measured.
  bool measuresDistances() const;
  // The values a slot's due distance is of (null: none due, or gone).
  const Scalar* dueValues(const Slot& slot) const;
  // Measures every due distance against x_i now.
  void measureDueDistances();
  // For the curvature (dynamic policy), once x_{k+1} is in params_: x_k
  // (in mixed_) and g_k become the round before's, whole by rotating the
  // buffers, or every stride-th value of them for a large model, so no
  // model-sized copy is kept.
  void keepCurvatureSample(Vector& gradient);
  std::optional<std::int64_t> skipTarget(Time now) const;

  // The round's end (finish), one step each, in this order.
  RoundRecord finish(Time now, CutoffReason reason);
  // Where the round mixes: its own round, a skip's target, or a join's.
  struct MixPlan {
    std::optional<std::int64_t> skip;  // round skipping's target
    std::int64_t mixRound = 0;         // the round whose estimates count
    std::int64_t newestMixed = -1;     // the newest round among them
    std::int64_t joinAbove = 0;        // a joiner adopts only estimates past this round
  };
  // The estimates mixed, and their slots.
  struct Chosen {
    std::vector<MixInput> inputs;
    std::vector<std::size_t> slots;
  };
  // What this round's waiting saw, for the estimators.
  void recordArrivals(const RoundRecord& record, Time now);
  MixPlan planMix(Time now);
  Chosen chooseInputs(const MixPlan& plan, RoundRecord& record);
  // Joining ends once the node adopted the cluster's state, or mixed while no
  // neighbour that may be the running cluster is left.
  void settleJoining(std::int64_t joinAbove, bool adopted, bool mixedAny, Time now);
  // x_hat into mixed_, with the step in the same pass when `fuseStep`; the
  // consensus distance and the mixed neighbours' distances measured there.
  void mixInto(RoundRecord& record, Chosen& chosen, bool fuseStep);
  // The delta's eta and what the dynamic rule learns of the round.
  void learnFromRound(RoundRecord& record, const Vector* g, bool heterogeneity);
  // The update onto x (x_hat when the mix did not take it; x_k with publish:
  // update): outer step, SGD or delta.
  void applyUpdate(Vector& x, double learningRate);
  // On to the next round (or a skip's, or the adopted cluster's).
  void advance(RoundRecord& record, const MixPlan& plan);

  const topology::Topology* topology_;  // the caller's; setTopology replaces it
  std::size_t self_;
  EngineOptions options_;
  data::Schedule schedule_;
  std::unique_ptr<WaitPolicy> policy_;
  std::optional<PolicySpec> pendingPolicy_;
  std::vector<Slot> slots_;
  ArrivalHistory arrivals_;
  GradientEstimator gradients_;
  data::Sgd<Scalar> sgd_;
  std::optional<data::NesterovOuter<Scalar>> outer_;  // outer: nesterov

  Phase phase_ = Phase::Idle;
  bool started_ = false;  // a first round began: silence counts from then
  // Started at round 0 (no checkpoint) and not yet joined: the first mix
  // holding estimates of neighbours far ahead adopts those (a running cluster
  // joined). Ends there, or at a mix while no live neighbour is far ahead
  // (the cluster started with it).
  struct JoinState {
    bool joining = false;
    bool clusterAhead = false;  // while joining, a neighbour was seen far ahead
  } join_;
  std::int64_t round_;
  Time roundStart_{};
  // When this round's estimate left (its start, or its update with publish:
  // update): the hard deadline counts from here.
  std::optional<Time> publishedAt_;
  std::optional<Publication> publication_;  // publish: update, not yet taken
  std::optional<Time> blockedSince_;        // first refusal by the lead bound
  Duration blocked_{};
  WaitDecision decision_;
  std::vector<NeighborView> views_;
  std::optional<CutoffReason> decidedReason_;  // symmetric: the cut-off already passed
  std::vector<Decision> outgoingDecisions_;

  // x_i^k and x_hat rotate by a swap; x_i^k is published at the round
  // start, so both are shared.
  std::shared_ptr<Vector> params_;  // x_i^k
  std::shared_ptr<Vector> mixed_;   // x_hat
  // With compression: our public copy c_i (as every neighbour holds it) and
  // the round of the frame that made it; this round's frame.
  std::shared_ptr<Vector> publicCopy_;
  std::int64_t publicRound_ = -1;
  std::shared_ptr<std::vector<std::byte>> frame_;
  Vector gradient_;  // the update: a gradient, or a delta
  Vector probe_;     // with a delta from onDelta: the gradient at x_k
  bool haveGradient_ = false;
  bool haveProbe_ = false;
  UpdateKind updateKind_ = UpdateKind::Gradient;
  std::optional<double> deltaEta_;  // the trainer's step size, averaged: the rule's eta
  Time gradientAt_{};
  double loss_ = 0.0;
  data::GradientStats stats_;
  // x_{k-1} and g_{k-1} at every sampleStride_-th coordinate (all of
  // them up to kCurvatureSample values).
  std::shared_ptr<Vector> previousParams_;  // whole: rotates with params_ and mixed_
  Vector previousGradient_;
  Eigen::Index sampleStride_ = 1;
  double topologySelfWeight_;  // w_ii: what `renormalize` shares a missing weight with
  bool havePrevious_ = false;  // previousGradient_ holds g_{k-1}
  double previousEta_ = 0.0;
  double previousVariance_ = 0.0;
};

extern template class RoundEngine<float>;
extern template class RoundEngine<double>;

}  // namespace consensusd::consensus
