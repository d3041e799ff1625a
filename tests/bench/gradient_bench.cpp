// Gradient throughput (samples/s) of softmax regression and a 784-256-10
// MLP, next to the plain Eigen GEMMs of the same shapes measured in the same
// run: the ratio says how much the model adds on top of the unavoidable
// matrix products. Run through scripts/bench-gradients.

#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <random>

#include "consensusd/data/model.hpp"

namespace {

using consensusd::data::Batch;
using consensusd::data::Dataset;
using consensusd::data::GradientStats;
using consensusd::data::Model;
using consensusd::data::ModelKind;
using consensusd::data::ModelOptions;

constexpr Eigen::Index kInputs = 784;
constexpr Eigen::Index kClasses = 10;
constexpr Eigen::Index kHidden = 256;

ModelOptions optionsFor(std::int64_t kind) {
  ModelOptions options;
  options.kind = kind == 0 ? ModelKind::Softmax : ModelKind::Mlp;
  options.inputs = kInputs;
  options.classes = kClasses;
  if (kind == 1) options.hidden = {kHidden};
  return options;
}

// Layer shapes (out, in) of the model.
std::vector<std::pair<Eigen::Index, Eigen::Index>> shapesFor(std::int64_t kind) {
  if (kind == 0) return {{kClasses, kInputs}};
  return {{kHidden, kInputs}, {kClasses, kHidden}};
}

template <class Scalar>
void gradient(benchmark::State& state) {
  const std::int64_t kind = state.range(0);
  const auto batchSize = static_cast<std::size_t>(state.range(1));
  Dataset data;
  data.features =
      (Eigen::MatrixXf::Random(kInputs, static_cast<Eigen::Index>(batchSize)).array() + 1.0f) *
      0.5f;
  data.classes = kClasses;
  std::mt19937 rng(1);
  for (std::size_t i = 0; i < batchSize; ++i)
    data.labels.push_back(static_cast<std::int32_t>(rng() % kClasses));
  std::vector<std::size_t> indices(batchSize);
  for (std::size_t i = 0; i < batchSize; ++i) indices[i] = i;

  Model<Scalar> model(optionsFor(kind));
  typename Model<Scalar>::Vector params(static_cast<Eigen::Index>(model.dimension()));
  typename Model<Scalar>::Vector grad(params.size());
  model.initialize(params, 1);
  Batch<Scalar> batch;
  consensusd::data::gather(data, indices, batch);
  GradientStats stats;
  for (auto _ : state) {
    benchmark::DoNotOptimize(model.lossAndGradient(params, batch, grad, &stats));
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(batchSize));
}

// The same matrix products and nothing else: W X forward, delta X^T for the
// weight gradient, W^T delta to go down a layer.
template <class Scalar>
void gemmOnly(benchmark::State& state) {
  using Matrix = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic>;
  const std::int64_t kind = state.range(0);
  const Eigen::Index batchSize = state.range(1);
  const auto shapes = shapesFor(kind);
  std::vector<Matrix> weights;
  std::vector<Matrix> inputs;
  std::vector<Matrix> outputs;
  std::vector<Matrix> grads;
  std::vector<Matrix> below;
  for (const auto& [out, in] : shapes) {
    weights.push_back(Matrix::Random(out, in));
    inputs.push_back(Matrix::Random(in, batchSize));
    outputs.push_back(Matrix(out, batchSize));
    grads.push_back(Matrix(out, in));
    below.push_back(Matrix(in, batchSize));
  }
  for (auto _ : state) {
    for (std::size_t l = 0; l < shapes.size(); ++l) outputs[l].noalias() = weights[l] * inputs[l];
    for (std::size_t l = shapes.size(); l-- > 0;) {
      grads[l].noalias() = outputs[l] * inputs[l].transpose();
      if (l > 0) below[l].noalias() = weights[l].transpose() * outputs[l];
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * batchSize);
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"mlp", "batch"});
  for (const int kind : {0, 1}) {
    for (const int batch : {32, 128}) b->Args({kind, batch});
  }
}

BENCHMARK_TEMPLATE(gradient, float)->Apply(shapes);
BENCHMARK_TEMPLATE(gemmOnly, float)->Apply(shapes);
BENCHMARK_TEMPLATE(gradient, double)->Apply(shapes);
BENCHMARK_TEMPLATE(gemmOnly, double)->Apply(shapes);

}  // namespace

BENCHMARK_MAIN();
