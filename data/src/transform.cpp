// Scaling, train/test splits and synthetic problems.

#include <algorithm>
#include <numeric>
#include <random>

#include "consensusd/data/dataset.hpp"
#include "consensusd/data/partition.hpp"
#include "consensusd/data/random.hpp"

namespace consensusd::data {
namespace {

Eigen::MatrixXf gaussianMatrix(Eigen::Index rows, Eigen::Index cols, std::mt19937_64& rng) {
  std::normal_distribution<float> normal;
  Eigen::MatrixXf m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = normal(rng);
  return m;
}

}  // namespace

void scale(TrainTest& data, Scaling scaling) {
  if (scaling == Scaling::None || data.train.size() == 0) return;
  const Eigen::MatrixXf& x = data.train.features;
  Eigen::VectorXf offset;
  Eigen::VectorXf divisor;
  if (scaling == Scaling::Unit) {
    offset = x.rowwise().minCoeff();
    divisor = x.rowwise().maxCoeff() - offset;
  } else {
    offset = x.rowwise().mean();
    divisor =
        ((x.colwise() - offset).array().square().rowwise().sum() / static_cast<float>(x.cols()))
            .sqrt();
  }
  divisor = (divisor.array() > 0).select(divisor, 1.0f);  // constant features stay at 0
  for (Dataset* set : {&data.train, &data.test}) {
    set->features = (set->features.colwise() - offset).array().colwise() / divisor.array();
  }
}

TrainTest splitTrainTest(const Dataset& all, double testFraction, std::uint64_t seed) {
  std::vector<std::size_t> order(all.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed);
  shuffle(order, rng);
  const auto testCount = static_cast<std::size_t>(testFraction * static_cast<double>(order.size()));
  TrainTest out;
  out.test = subset(all, {order.end() - static_cast<std::ptrdiff_t>(testCount), order.end()});
  out.train = subset(all, {order.begin(), order.end() - static_cast<std::ptrdiff_t>(testCount)});
  return out;
}

TrainTest syntheticLeastSquares(const SyntheticOptions& options, Eigen::VectorXd* optimum) {
  std::mt19937_64 rng(options.seed);
  const auto d = static_cast<Eigen::Index>(options.dimension);
  const Eigen::VectorXf truth = gaussianMatrix(d + 1, 1, rng);
  TrainTest out;
  std::normal_distribution<float> normal;
  for (auto [set, n] :
       {std::pair{&out.train, options.samples}, std::pair{&out.test, options.testSamples}}) {
    set->features = gaussianMatrix(d, static_cast<Eigen::Index>(n), rng);
    set->targets = (truth.head(d).transpose() * set->features).transpose().array() + truth[d];
    for (Eigen::Index i = 0; i < set->targets.size(); ++i) {
      set->targets[i] += static_cast<float>(options.noise) * normal(rng);
    }
  }
  if (optimum != nullptr) *optimum = truth.cast<double>();
  return out;
}

TrainTest syntheticLogistic(const SyntheticOptions& options, Eigen::VectorXd* truth) {
  std::mt19937_64 rng(options.seed);
  const auto d = static_cast<Eigen::Index>(options.dimension);
  const Eigen::VectorXf w = gaussianMatrix(d + 1, 1, rng);
  TrainTest out;
  for (auto [set, n] :
       {std::pair{&out.train, options.samples}, std::pair{&out.test, options.testSamples}}) {
    set->features = gaussianMatrix(d, static_cast<Eigen::Index>(n), rng);
    set->classes = 2;
    const Eigen::VectorXf z = (w.head(d).transpose() * set->features).transpose().array() + w[d];
    for (Eigen::Index i = 0; i < z.size(); ++i) {
      const double p = 1.0 / (1.0 + std::exp(-static_cast<double>(z[i])));
      set->labels.push_back(uniformUnit(rng) < p ? 1 : 0);
    }
  }
  if (truth != nullptr) *truth = w.cast<double>();
  return out;
}

}  // namespace consensusd::data
