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
  const std::size_t n = topology.size();
  std::size_t longest = 0;
  std::vector<std::size_t> distance(n);
  std::vector<std::size_t> queue;
  queue.reserve(n);
  for (std::size_t start = 0; start < n; ++start) {
    std::fill(distance.begin(), distance.end(), SIZE_MAX);
    distance[start] = 0;
    queue.assign(1, start);
    for (std::size_t head = 0; head < queue.size(); ++head) {
      const std::size_t at = queue[head];
      for (const Neighbor& next : topology.outNeighbors(at)) {
        if (distance[next.index] == SIZE_MAX) {
          distance[next.index] = distance[at] + 1;
          queue.push_back(next.index);
        }
      }
    }
    if (queue.size() != n) return std::nullopt;
    longest = std::max(longest, distance[queue.back()]);
  }
  return longest;
}

}  // namespace

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
