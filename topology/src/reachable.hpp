#pragma once
// Reachability over adjacency lists, before a Topology exists: the file
// check (every node reached both ways) and the generators (retry until
// connected) share it.

#include <cstddef>
#include <vector>

namespace consensusd::topology {

// Indices reachable from `start` following `adjacency`.
std::vector<bool> reachable(const std::vector<std::vector<std::size_t>>& adjacency,
                            std::size_t start);

}  // namespace consensusd::topology
