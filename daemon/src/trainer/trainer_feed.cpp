#include "trainer/trainer_feed.hpp"

namespace consensusd::daemon {
namespace {

template <class Vector>
Eigen::Map<const Vector> vectorOf(std::span<const std::byte> bytes) {
  using Scalar = typename Vector::Scalar;
  return {reinterpret_cast<const Scalar*>(bytes.data()),
          static_cast<Eigen::Index>(bytes.size() / sizeof(Scalar))};
}

}  // namespace

template <class Scalar>
std::optional<FedUpdate> TrainerFeed<Scalar>::take(const TrainerUpdate& update, Engine& engine,
                                                   consensus::Time now) {
  const Eigen::Map<const Vector> values = vectorOf<Vector>(update.values);
  const Eigen::Map<const Vector> gradient = vectorOf<Vector>(update.gradient);
  // A round that only mixes (0 samples) computed nothing to slow down: no
  // delay and no draw, so the stragglers' sequence is the delta rounds'.
  if (update.samples == std::uint64_t{0}) return feed(update, values, gradient, engine, now);
  const auto delay = std::chrono::duration_cast<consensus::Duration>(straggler_.extraDelay(
      update.round, std::chrono::duration_cast<consensus::Duration>(update.elapsed)));
  if (delay <= consensus::Duration::zero()) return feed(update, values, gradient, engine, now);
  held_.emplace(
      HeldUpdate{update, values, gradient, now + delay});  // copies: the region is the trainer's
  return std::nullopt;
}

template <class Scalar>
std::optional<FedUpdate> TrainerFeed<Scalar>::takeDue(Engine& engine, consensus::Time now) {
  if (!held_ || now < held_->due) return std::nullopt;
  const FedUpdate fed = feed(held_->update, held_->values, held_->gradient, engine, now);
  held_.reset();
  return fed;
}

template <class Scalar>
FedUpdate TrainerFeed<Scalar>::feed(const TrainerUpdate& update,
                                    const Eigen::Ref<const Vector>& values,
                                    const Eigen::Ref<const Vector>& gradient, Engine& engine,
                                    consensus::Time now) {
  data::GradientStats stats;  // ||g||^2: the engine measures it
  stats.sampleVariance = update.gradVariance;
  if (update.kind == consensus::UpdateKind::Delta && gradient.size() > 0) {
    engine.onDelta(update.round, values, gradient, update.loss, stats, now);
  } else {
    engine.onGradient(update.round, values, update.loss, stats, now, update.kind);
  }
  return {update.round, update.samples, update.accuracy, update.testLoss};
}

template class TrainerFeed<float>;
template class TrainerFeed<double>;

}  // namespace consensusd::daemon
