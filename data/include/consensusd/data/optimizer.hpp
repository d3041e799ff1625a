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

  NesterovOuter(std::size_t dimension, double learningRate, double momentum)
      : learningRate_(learningRate),
        momentum_(momentum),
        velocity_(Vector::Zero(static_cast<Eigen::Index>(dimension))) {}

  void step(Eigen::Ref<Vector> x, const Eigen::Ref<const Vector>& update, Scalar scale) {
    const auto mu = static_cast<Scalar>(momentum_);
    const auto lr = static_cast<Scalar>(learningRate_);
    velocity_ = mu * velocity_ + scale * update;
    x.noalias() += lr * (scale * update + mu * velocity_);
  }

  const Vector& velocity() const { return velocity_; }
  void setVelocity(const Eigen::Ref<const Vector>& velocity) { velocity_ = velocity; }

 private:
  double learningRate_;
  double momentum_;
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
