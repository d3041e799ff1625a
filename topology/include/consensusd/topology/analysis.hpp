#pragma once
// What `consensusctl topology info` reports: sizes, degrees, diameter,
// connectivity and the spectrum of the mixing matrix W.

#include <Eigen/Core>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "consensusd/topology/topology.hpp"

namespace consensusd::topology {

struct Analysis {
  std::size_t nodes = 0;
  std::size_t edges = 0;  // as written: undirected edges, or arcs when directed
  bool directed = false;
  std::size_t minDegree = 0;  // in-degree: the neighbours a node mixes
  std::size_t maxDegree = 0;
  std::optional<std::size_t> diameter;  // hops; none when not (strongly) connected
  bool connected = false;               // strongly connected when directed
  double slem = 0;                      // second-largest eigenvalue modulus of W
  double spectralGap = 0;               // 1 - slem
  bool doublyStochastic = false;        // columns of W also sum to 1
  std::string hash;
};

// Hops from `from` to every node along arcs j -> i (the way estimates
// travel); kUnreachable for a node it cannot reach.
inline constexpr std::size_t kUnreachable = static_cast<std::size_t>(-1);
std::vector<std::size_t> hopsFrom(const Topology& topology, std::size_t from);

// Row i holds w_ij (self weight on the diagonal).
Eigen::MatrixXd mixingMatrix(const Topology& topology);

// Dense eigen-decomposition: O(N^3), a few seconds at N = 2000.
Analysis analyze(const Topology& topology);

}  // namespace consensusd::topology
