#pragma once
// Where the dashboard draws each node, computed once per topology: a ring
// as a circle in its cycle order, a torus (nodes numbered row by row, as
// `topology gen torus` writes them) as a grid, anything else by a seeded
// force layout. Coordinates in [0, 1]; the same graph always gets the same
// picture.

#include <string>
#include <vector>

#include "consensusd/topology/topology.hpp"

namespace consensusd::cli {

struct Layout {
  std::string kind;  // "ring", "grid" or "force"
  std::vector<double> x;
  std::vector<double> y;
};

Layout layoutGraph(const topology::Topology& graph);

}  // namespace consensusd::cli
