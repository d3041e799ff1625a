#pragma once
// `--straggler NODE=KEY=VALUE[,KEY=VALUE]` (and `all=...` when allowed): one
// straggler model per flag and node it names, as `straggler.KEY=VALUE`
// overrides, in flag order. A node not in the topology is a UsageError; the
// keys are checked by the config schema.

#include <map>
#include <string>
#include <vector>

#include "consensusd/topology/topology.hpp"

namespace consensusd::cli {

struct StragglerFlag {
  std::size_t node = 0;  // topology index
  std::vector<std::string> overrides;
};
std::vector<StragglerFlag> stragglerFlags(const std::vector<std::string>& specs,
                                          const topology::Topology& graph, bool allowAll);

// For daemons (compose, k8s): one model per node, so a node named twice is a
// UsageError (the simulator stacks several). Node index -> its overrides.
std::map<std::size_t, std::vector<std::string>> daemonStragglers(
    const std::vector<std::string>& specs, const topology::Topology& graph);

}  // namespace consensusd::cli
