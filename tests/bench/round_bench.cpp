// The consensus core's cost per round (policy decision, storing d estimates,
// the fused mix and the step) next to one minibatch gradient of the model it
// serves, measured in the same run: the core must be negligible next to the
// gradient (issue: consensus core); and the codecs' passes over one
// compressed frame, with the machine's kernels and with baseline x86-64.
// Run through scripts/bench-round-overhead.

#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <optional>
#include <random>

#include "consensusd/consensus/codec.hpp"
#include "consensusd/consensus/mixing.hpp"
#include "consensusd/consensus/round_engine.hpp"
#include "consensusd/data/model.hpp"
#include "consensusd/topology/generators.hpp"

namespace {

using consensusd::consensus::Compression;
using consensusd::consensus::EngineOptions;
using consensusd::consensus::Kernels;
using consensusd::consensus::PolicyKind;
using consensusd::consensus::RoundEngine;
using consensusd::consensus::Time;

constexpr std::size_t kInputs = 784;
constexpr std::size_t kClasses = 10;

// A generated graph; the benchmarks run its node 0.
consensusd::topology::Topology generated(const std::string& kind, std::size_t nodes,
                                         std::optional<std::size_t> degree = std::nullopt) {
  consensusd::topology::GeneratorOptions graph;
  graph.kind = kind;
  graph.nodes = nodes;
  if (degree) graph.degree = *degree;
  return consensusd::topology::Topology::fromSpec(consensusd::topology::generate(graph), "<bench>");
}

consensusd::topology::Topology randomRegular(std::size_t nodes, std::size_t degree) {
  return generated("random-regular", nodes, degree);
}

consensusd::data::ModelOptions softmax() {
  consensusd::data::ModelOptions options;
  options.inputs = kInputs;
  options.classes = kClasses;
  return options;
}

// One round of node 0 of a random 4-regular graph, every neighbour answering.
void engineRound(benchmark::State& state) {
  const auto policy = static_cast<PolicyKind>(state.range(0));
  const auto topology = randomRegular(16, 4);
  EngineOptions options;
  options.policy.kind = policy;
  options.warmupRounds = 0;
  const consensusd::data::Model<float> model(softmax());
  const auto dimension = static_cast<Eigen::Index>(model.dimension());
  consensusd::data::Schedule schedule;
  RoundEngine<float> engine(topology, 0, options, schedule, 0.0, Eigen::VectorXf::Zero(dimension),
                            Time{});
  const Eigen::VectorXf neighbour = Eigen::VectorXf::Random(dimension);
  const Eigen::VectorXf gradient = Eigen::VectorXf::Random(dimension) * 1e-3f;
  consensusd::data::GradientStats stats{1.0, 10.0};
  std::int64_t t = 0;
  for (auto _ : state) {
    const auto start = engine.tryStart(Time(t));
    const std::int64_t round = start->round;
    for (const auto& in : topology.inNeighbors(0))
      engine.onEstimate(in.index, round, neighbour.data(), Time(t + 1000));
    engine.onGradient(round, gradient, 0.5, stats, Time(t + 500));
    benchmark::DoNotOptimize(engine.tryFinish(Time(t + 2000)));
    t += 1'000'000;
  }
  state.SetLabel(
      std::string(consensusd::data::nameOf(consensusd::consensus::kPolicyKinds, policy)));
}

// The dynamic rule's decision alone: context and scores (the neighbour distances
// are measured as estimates arrive, so they count in engineRound), for a node
// of the given degree whose window holds distinct arrival offsets, as real
// ones are (the forecast integrates over every distinct value).
void dynamicDecision(benchmark::State& state) {
  const auto topology = randomRegular(64, static_cast<std::size_t>(state.range(0)));
  EngineOptions options;
  options.policy.kind = PolicyKind::Dynamic;
  const consensusd::data::Model<float> model(softmax());
  const auto dimension = static_cast<Eigen::Index>(model.dimension());
  RoundEngine<float> engine(topology, 0, options, {}, 0.0, Eigen::VectorXf::Zero(dimension),
                            Time{});
  const Eigen::VectorXf neighbour = Eigen::VectorXf::Random(dimension);
  std::mt19937 rng(1);
  std::exponential_distribution<double> delayMs(0.2);  // mean 5 ms
  const auto at = [&](std::int64_t start) {
    return Time(start + static_cast<std::int64_t>(1e6 * (1.0 + delayMs(rng))));
  };
  std::int64_t t = 0;
  for (int k = 0; k < 60; ++k, t += 1'000'000'000) {  // fill the estimator window
    const std::int64_t round = engine.tryStart(Time(t))->round;
    for (const auto& in : topology.inNeighbors(0))
      engine.onEstimate(in.index, round, neighbour.data(), at(t));
    engine.onGradient(round, neighbour * 1e-3f, 0.5, {1.0, 10.0}, at(t));
    engine.tryFinish(Time(t + 500'000'000));
  }
  for (auto _ : state) {
    const auto context = engine.policyContext(Time(t));
    benchmark::DoNotOptimize(consensusd::consensus::dynamicScores(context));
  }
}

void softmaxGradient(benchmark::State& state) {
  consensusd::data::Model<float> model(softmax());
  Eigen::VectorXf params = Eigen::VectorXf::Zero(static_cast<Eigen::Index>(model.dimension()));
  Eigen::VectorXf grad(params.size());
  consensusd::data::Batch<float> batch;
  batch.x = (Eigen::MatrixXf::Random(kInputs, 32).array() + 1.0f) * 0.5f;
  std::mt19937 rng(1);
  for (int i = 0; i < 32; ++i) batch.labels.push_back(static_cast<std::int32_t>(rng() % kClasses));
  consensusd::data::GradientStats stats;
  for (auto _ : state) benchmark::DoNotOptimize(model.lossAndGradient(params, batch, grad, &stats));
}

// About the parameters of examples/torch's CNN (860 kB of float32).
constexpr std::size_t kCnnDimension = 215'000;

void codecLabel(benchmark::State& state, Compression codec, Kernels kernels) {
  state.SetLabel(
      std::string(consensusd::data::nameOf(consensusd::consensus::kCompressions, codec)) +
      (kernels == Kernels::Best ? " best" : " baseline"));
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(kCnnDimension * 4));
}

// The sender's pass: frame = Q(x - copy), copy += decode(frame).
void codecEncode(benchmark::State& state) {
  const auto codec = static_cast<Compression>(state.range(0));
  const auto kernels = static_cast<Kernels>(state.range(1));
  const Eigen::VectorXf x = Eigen::VectorXf::Random(kCnnDimension);
  std::vector<float> copy(kCnnDimension, 0.0f);
  std::vector<std::byte> frame(consensusd::consensus::frameBytes(codec, kCnnDimension));
  for (auto _ : state) {
    consensusd::consensus::encodeDifference<float>(codec, std::span(x.data(), kCnnDimension), copy,
                                                   frame, kernels);
    benchmark::DoNotOptimize(frame.data());
  }
  codecLabel(state, codec, kernels);
}

// A receiver's pass over one neighbour's frame: check it, copy += decode(frame).
void codecApply(benchmark::State& state) {
  const auto codec = static_cast<Compression>(state.range(0));
  const auto kernels = static_cast<Kernels>(state.range(1));
  const Eigen::VectorXf x = Eigen::VectorXf::Random(kCnnDimension) * 1e-3f;
  std::vector<float> sender(kCnnDimension, 0.0f);
  std::vector<std::byte> frame(consensusd::consensus::frameBytes(codec, kCnnDimension));
  consensusd::consensus::encodeDifference<float>(codec, std::span(x.data(), kCnnDimension), sender,
                                                 frame);
  std::vector<float> copy(kCnnDimension, 0.0f);
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        consensusd::consensus::applyDifference<float>(codec, frame, copy, kernels));
  }
  codecLabel(state, codec, kernels);
}

// One round at the demo's size: node 0 of the complete graph of 8 with
// kCnnDimension parameters, the dynamic policy, a trainer's delta with the
// gradient it stepped from, the 7 estimates kept in place (as the daemon
// keeps a received message); beside it the mix of the 7 alone, the one pass
// over them a round cannot do without.
void demoRound(benchmark::State& state) {
  const auto topology = generated("complete", 8);
  EngineOptions options;
  options.policy.kind = PolicyKind::Dynamic;
  options.warmupRounds = 0;
  RoundEngine<float> engine(topology, 0, options, {}, 0.0, Eigen::VectorXf::Zero(kCnnDimension),
                            Time{});
  std::vector<Eigen::VectorXf> neighbours;
  for (std::size_t k = 0; k < 7; ++k) neighbours.push_back(Eigen::VectorXf::Random(kCnnDimension));
  const Eigen::VectorXf delta = Eigen::VectorXf::Random(kCnnDimension) * 1e-3f;
  const Eigen::VectorXf gradient = Eigen::VectorXf::Random(kCnnDimension);
  std::int64_t t = 0;
  for (auto _ : state) {
    const std::int64_t round = engine.tryStart(Time(t))->round;
    std::size_t k = 0;
    for (const auto& in : topology.inNeighbors(0)) {
      const float* values = neighbours[k++].data();
      // Held in place: an owner without a control block.
      engine.onEstimate(in.index, round, values, Time(t + 1000),
                        std::shared_ptr<const void>(std::shared_ptr<const void>(), values));
    }
    engine.onDelta(round, delta, gradient, 0.5, {1.0, 10.0}, Time(t + 500));
    benchmark::DoNotOptimize(engine.tryFinish(Time(t + 2000)));
    t += 1'000'000;
  }
}

void demoMix(benchmark::State& state) {
  const Eigen::VectorXf self = Eigen::VectorXf::Random(kCnnDimension);
  std::vector<Eigen::VectorXf> neighbours;
  std::vector<consensusd::consensus::MixInput> inputs;
  for (std::size_t k = 0; k < 7; ++k) neighbours.push_back(Eigen::VectorXf::Random(kCnnDimension));
  for (const auto& v : neighbours) inputs.push_back({v.data(), 1.0 / 8});
  Eigen::VectorXf out(kCnnDimension);
  for (auto _ : state) {
    consensusd::consensus::fusedMix(self.data(), 1.0 / 8, inputs, out.data(), kCnnDimension);
    benchmark::DoNotOptimize(out.data());
  }
}

void codecs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"codec", "kernels"});
  for (const Compression codec : {Compression::Bf16, Compression::Fp16, Compression::Int8})
    for (const Kernels kernels : {Kernels::Best, Kernels::Baseline})
      b->Args({static_cast<std::int64_t>(codec), static_cast<std::int64_t>(kernels)});
}

BENCHMARK(engineRound)->ArgName("policy")->DenseRange(0, 4);
BENCHMARK(dynamicDecision)->ArgName("degree")->Arg(4)->Arg(8)->Arg(16)->Arg(32);
BENCHMARK(softmaxGradient);
BENCHMARK(demoRound);
BENCHMARK(demoMix);
BENCHMARK(codecEncode)->Apply(codecs);
BENCHMARK(codecApply)->Apply(codecs);

}  // namespace

BENCHMARK_MAIN();
