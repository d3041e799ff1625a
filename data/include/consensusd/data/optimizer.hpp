#pragma once
// Learning-rate schedules and the SGD step (heavy-ball momentum), shared by
// the single-node trainer and the consensus round (docs/design.md §2, step 5).

#include <Eigen/Core>
#include <cstdint>
#include <optional>
#include <string>

#include "consensusd/data/names.hpp"

namespace consensusd::data {

enum class ScheduleKind { Constant, Step, InverseSqrt, Cosine };
inline constexpr NameTable<ScheduleKind, 4> kScheduleKinds{
    {{ScheduleKind::Constant, "constant"},
     {ScheduleKind::Step, "step"},
     {ScheduleKind::InverseSqrt, "inverse-sqrt"},
     {ScheduleKind::Cosine, "cosine"}}};

struct Schedule {
  ScheduleKind kind = ScheduleKind::Constant;
  double learningRate = 0.05;    // eta_0
  std::int64_t period = 1000;    // step: rounds between decays; inverse-sqrt: time scale
  double factor = 0.5;           // step: decay factor
  std::int64_t totalRounds = 0;  // cosine: length of the half wave (0: constant)

  // constant: eta_0; step: eta_0 * factor^floor(k / period);
  // inverse-sqrt: eta_0 / sqrt(1 + k / period); cosine: eta_0 (1 + cos(pi k / K)) / 2.
  double at(std::int64_t round) const;
};

template <class Scalar>
class Sgd {
 public:
  using Vector = Eigen::Matrix<Scalar, Eigen::Dynamic, 1>;

  Sgd(std::size_t dimension, double momentum)
      : momentum_(momentum), velocity_(Vector::Zero(static_cast<Eigen::Index>(dimension))) {}

  // x <- x - eta * v, v <- momentum * v + g (v = g without momentum).
  void step(Eigen::Ref<Vector> x, const Eigen::Ref<const Vector>& gradient, double eta) {
    if (momentum_ == 0.0) {
      x.noalias() -= static_cast<Scalar>(eta) * gradient;
      return;
    }
    velocity_ = static_cast<Scalar>(momentum_) * velocity_ + gradient;
    x.noalias() -= static_cast<Scalar>(eta) * velocity_;
  }

  bool hasMomentum() const { return momentum_ != 0.0; }
  const Vector& velocity() const { return velocity_; }
  // Restores the velocity of a checkpoint (same dimension).
  void setVelocity(const Eigen::Ref<const Vector>& velocity) { velocity_ = velocity; }

 private:
  double momentum_;
  Vector velocity_;
};

// DiLoCo's outer step (arXiv 2311.08105): each round's update u (a trainer's
// delta over its local steps, or -eta g) is the outer gradient's negative,
// taken with Nesterov momentum: v <- mu v + u, x <- x + lr (u + mu v).
// `scale` multiplies u on the way in (1 for a delta, -eta for a gradient).
template <class Scalar>
class NesterovOuter {
 public:
  using Vector = Eigen::Matrix<Scalar, Eigen::Dynamic, 1>;

  // `overMix`: momentum over the mix's motion (train.outer: mix-momentum),
  // not over this node's own updates (nesterov); see step().
  NesterovOuter(std::size_t dimension, double learningRate, double momentum, bool overMix = false)
      : learningRate_(learningRate),
        momentum_(momentum),
        overMix_(overMix),
        velocity_(Vector::Zero(static_cast<Eigen::Index>(dimension))) {}

  // x holds the round's mix x^ on entry, x_{k+1} on return. nesterov (DiLoCo):
  // v <- mu v + s u, x <- x^ + lr (s u + mu v). mix-momentum: x <- x^ + lr s u
  // + mu (x^ - x^_prev): heavy-ball momentum on the motion of the mix, which
  // carries the neighbours' steps averaged, while this node's own update goes
  // in once; nesterov multiplies the node's own update, noise included, by up
  // to lr / (1 - mu). velocity() then holds x^_prev.
  void step(Eigen::Ref<Vector> x, const Eigen::Ref<const Vector>& update, Scalar scale) {
    const auto mu = static_cast<Scalar>(momentum_);
    const auto lr = static_cast<Scalar>(learningRate_);
    if (!overMix_) {
      velocity_ = mu * velocity_ + scale * update;
      x.noalias() += lr * (scale * update + mu * velocity_);
      return;
    }
    const Scalar pull = havePrevious_ ? mu : Scalar(0);
    Scalar* xs = x.data();
    Scalar* previous = velocity_.data();
    const Scalar* u = update.data();
    for (Eigen::Index i = 0; i < x.size(); ++i) {
      const Scalar mixed = xs[i];
      xs[i] = mixed + lr * scale * u[i] + pull * (mixed - previous[i]);
      previous[i] = mixed;
    }
    havePrevious_ = true;
  }
  // The parameters jumped (a skip, a join, a new graph, a reset): with
  // mix-momentum the next mix's motion is no step.
  void moved() { havePrevious_ = false; }

  const Vector& velocity() const { return velocity_; }
  void setVelocity(const Eigen::Ref<const Vector>& velocity) {
    velocity_ = velocity;
    havePrevious_ = overMix_;
  }

 private:
  double learningRate_;
  double momentum_;
  bool overMix_;
  bool havePrevious_ = false;
  Vector velocity_;
};

// Minibatches without replacement; a new seeded shuffle every epoch. The
// tail that does not fill a batch waits for the next epoch's shuffle.
class MinibatchSampler {
 public:
  MinibatchSampler(std::size_t samples, std::size_t batchSize, std::uint64_t seed);
  const std::vector<std::size_t>& next();
  std::size_t epoch() const { return epoch_; }

 private:
  std::vector<std::size_t> order_;
  std::vector<std::size_t> batch_;
  std::size_t position_ = 0;
  std::size_t epoch_ = 0;
  std::uint64_t seed_;
};

}  // namespace consensusd::data
