#include "reachable.hpp"

namespace consensusd::topology {

// Indices reachable from `start` following `adjacency`.
std::vector<bool> reachable(const std::vector<std::vector<std::size_t>>& adjacency,
                            std::size_t start) {
  std::vector<bool> seen(adjacency.size(), false);
  std::vector<std::size_t> stack{start};
  seen[start] = true;
  while (!stack.empty()) {
    const std::size_t at = stack.back();
    stack.pop_back();
    for (const std::size_t next : adjacency[at]) {
      if (!seen[next]) {
        seen[next] = true;
        stack.push_back(next);
      }
    }
  }
  return seen;
}

}  // namespace consensusd::topology
