#pragma once
// What the consensus core's tests share: a fake clock in milliseconds, small
// generated graphs, a hub node with scripted arrivals.

#include <doctest/doctest.h>

#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <queue>
#include <random>

#include "consensusd/consensus/driver.hpp"
#include "consensusd/consensus/estimators.hpp"
#include "consensusd/consensus/mailbox.hpp"
#include "consensusd/consensus/mixing.hpp"
#include "consensusd/consensus/round_engine.hpp"
#include "consensusd/consensus/straggler.hpp"
#include "consensusd/topology/analysis.hpp"
#include "consensusd/topology/generators.hpp"

namespace consensus_test {

using namespace consensusd::consensus;
using consensusd::data::GradientStats;
using consensusd::data::Schedule;
using consensusd::topology::GeneratorOptions;
using consensusd::topology::Topology;
using Engine = RoundEngine<double>;
using std::chrono::milliseconds;

inline Time ms(double value) {
  return std::chrono::duration_cast<Time>(std::chrono::duration<double, std::milli>(value));
}

inline Topology graph(const std::string& kind, std::size_t nodes) {
  GeneratorOptions options;
  options.kind = kind;
  options.nodes = nodes;
  options.degree = 4;
  return Topology::fromSpec(consensusd::topology::generate(options), "<test>");
}

inline Schedule rate(double eta) {
  Schedule schedule;
  schedule.learningRate = eta;
  return schedule;
}

// Node 0 of a 5-node star: neighbours n1..n4, each with weight 1/5.
struct Hub {
  Topology topology = graph("star", 5);
  Engine engine;
  explicit Hub(EngineOptions options, double eta = 0.0, double momentum = 0.0)
      : engine(topology, 0, options, rate(eta), momentum, Eigen::VectorXd::Zero(3), Time{}) {}

  void send(std::size_t node, std::int64_t round, double value, Time at) {
    const Eigen::VectorXd values = Eigen::VectorXd::Constant(3, value);
    engine.onEstimate(node, round, values.data(), at);
  }
  void gradient(Time at, double value = 0.0) {
    engine.onGradient(engine.round(), Eigen::VectorXd::Constant(3, value), 0.0, GradientStats{},
                      at);
  }
};

inline EngineOptions withPolicy(PolicyKind kind) {
  EngineOptions options;
  options.policy.kind = kind;
  options.roundSkipping = false;
  return options;
}

// One round of the window: our compute time and every neighbour's arrival offset.
inline void recordArrivals(ArrivalHistory& history, std::int64_t round, Duration compute,
                           std::vector<Duration> offsets) {
  ArrivalHistory::Round record;
  record.round = round;
  record.compute = compute;
  record.censored.assign(offsets.size(), false);
  record.offsets = std::move(offsets);
  history.record(std::move(record));
}

}  // namespace consensus_test
