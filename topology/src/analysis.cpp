#include "consensusd/topology/analysis.hpp"

#include <Eigen/Eigenvalues>
#include <algorithm>
#include <functional>
#include <vector>

namespace consensusd::topology {
namespace {

// Longest shortest path (in hops) along arcs j -> i (i mixes j); none if some
// node cannot reach another.
std::optional<std::size_t> diameterOf(const Topology& topology) {
  std::size_t longest = 0;
  for (std::size_t start = 0; start < topology.size(); ++start) {
    for (const std::size_t hops : hopsFrom(topology, start)) {
      if (hops == kUnreachable) return std::nullopt;
      longest = std::max(longest, hops);
    }
  }
  return longest;
}

}  // namespace

std::vector<std::size_t> hopsFrom(const Topology& topology, std::size_t from) {
  std::vector<std::size_t> hops(topology.size(), kUnreachable);
  std::vector<std::size_t> queue{from};
  hops[from] = 0;
  for (std::size_t head = 0; head < queue.size(); ++head) {
    const std::size_t at = queue[head];
    for (const Neighbor& next : topology.outNeighbors(at)) {
      if (hops[next.index] != kUnreachable) continue;
      hops[next.index] = hops[at] + 1;
      queue.push_back(next.index);
    }
  }
  return hops;
}

Eigen::MatrixXd mixingMatrix(const Topology& topology) {
  const auto n = static_cast<Eigen::Index>(topology.size());
  Eigen::MatrixXd w = Eigen::MatrixXd::Zero(n, n);
  for (Eigen::Index i = 0; i < n; ++i) {
    const auto row = static_cast<std::size_t>(i);
    w(i, i) = topology.selfWeight(row);
    for (const Neighbor& j : topology.inNeighbors(row))
      w(i, static_cast<Eigen::Index>(j.index)) = j.weight;
  }
  return w;
}

Analysis analyze(const Topology& topology) {
  Analysis result;
  result.nodes = topology.size();
  result.edges = topology.edges().size();
  result.directed = topology.directed();
  result.minDegree = SIZE_MAX;
  for (std::size_t i = 0; i < topology.size(); ++i) {
    result.minDegree = std::min(result.minDegree, topology.inNeighbors(i).size());
    result.maxDegree = std::max(result.maxDegree, topology.inNeighbors(i).size());
  }
  result.diameter = diameterOf(topology);
  result.connected = result.diameter.has_value();
  result.hash = topology.hashHex();

  const Eigen::MatrixXd w = mixingMatrix(topology);
  result.doublyStochastic = ((w.colwise().sum().array() - 1.0).abs() < 1e-9).all();
  std::vector<double> moduli;
  if (w.isApprox(w.transpose(), 1e-12)) {
    const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> solver(w, Eigen::EigenvaluesOnly);
    for (const double value : solver.eigenvalues()) moduli.push_back(std::abs(value));
  } else {
    const Eigen::EigenSolver<Eigen::MatrixXd> solver(w, false);
    for (const auto& value : solver.eigenvalues()) moduli.push_back(std::abs(value));
  }
  std::sort(moduli.begin(), moduli.end(), std::greater<>());
  result.slem = moduli.size() > 1 ? std::min(1.0, moduli[1]) : 0.0;
  result.spectralGap = 1.0 - result.slem;
  return result;
}

}  // namespace consensusd::topology
