#pragma once
// A trainer's updates into the round engine (model.kind: external): a
// gradient, or a delta with or without the gradient it came from. An
// emulated straggler (straggler.*) holds an update as the built-in compute
// thread sleeps: the trainer's own time counts as compute, the extra delay
// is added on top; an update of 0 samples (a round that only mixes) is
// never held. Engine thread only.

#include <cstdint>
#include <optional>

#include "consensusd/consensus/round_engine.hpp"
#include "consensusd/consensus/straggler.hpp"
#include "trainer/trainer_endpoint.hpp"

namespace consensusd::daemon {

// What the node counts of an update the engine took.
struct FedUpdate {
  std::int64_t round = 0;
  std::optional<std::uint64_t> samples;  // training samples behind it, if reported
  std::optional<double> accuracy;        // an evaluation, if the trainer made one
  std::optional<double> testLoss;
};

template <class Scalar>
class TrainerFeed {
 public:
  using Vector = Eigen::Matrix<Scalar, Eigen::Dynamic, 1>;
  using Engine = consensus::RoundEngine<Scalar>;

  explicit TrainerFeed(const consensus::StragglerSpec& straggler) : straggler_(straggler) {}

  // `update` (its spans in the trainer's region) to the engine now, or
  // copied and held until its emulated delay is over.
  std::optional<FedUpdate> take(const TrainerUpdate& update, Engine& engine, consensus::Time now);
  // The held update, once due.
  std::optional<FedUpdate> takeDue(Engine& engine, consensus::Time now);
  std::optional<consensus::Time> due() const {
    return held_ ? std::optional(held_->due) : std::nullopt;
  }

 private:
  struct HeldUpdate {
    TrainerUpdate update;  // its spans are not used: `values` and `gradient` are the copies
    Vector values;
    Vector gradient;
    consensus::Time due;
  };
  static FedUpdate feed(const TrainerUpdate& update, const Eigen::Ref<const Vector>& values,
                        const Eigen::Ref<const Vector>& gradient, Engine& engine,
                        consensus::Time now);

  consensus::Straggler straggler_;
  std::optional<HeldUpdate> held_;
};

}  // namespace consensusd::daemon
