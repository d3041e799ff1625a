#include "straggler_flags.hpp"

#include <sstream>

#include "consensusd/daemon/command_line.hpp"

namespace consensusd::cli {

std::vector<StragglerFlag> stragglerFlags(const std::vector<std::string>& specs,
                                          const topology::Topology& graph, bool allowAll) {
  std::vector<StragglerFlag> flags;
  for (const std::string& spec : specs) {
    const auto eq = spec.find('=');
    const std::string who = spec.substr(0, eq);
    const bool all = allowAll && who == "all";
    const auto index = graph.indexOf(who);
    if (eq == std::string::npos || (!all && !index)) {
      throw UsageError("--straggler '" + spec +
                       "': expected NODE=KEY=VALUE[,KEY=VALUE] with NODE a node of the topology" +
                       (allowAll ? " or all" : ""));
    }
    std::vector<std::string> overrides;
    std::stringstream items(spec.substr(eq + 1));
    for (std::string item; std::getline(items, item, ',');)
      if (!item.empty()) overrides.push_back("straggler." + item);
    for (std::size_t i = 0; i < graph.size(); ++i)
      if (all || i == *index) flags.push_back({i, overrides});
  }
  return flags;
}

std::map<std::size_t, std::vector<std::string>> daemonStragglers(
    const std::vector<std::string>& specs, const topology::Topology& graph) {
  std::map<std::size_t, std::vector<std::string>> byNode;
  for (StragglerFlag& flag : stragglerFlags(specs, graph, false)) {
    if (!byNode.emplace(flag.node, std::move(flag.overrides)).second) {
      throw UsageError("--straggler: node " + graph.node(flag.node).id +
                       " is named twice; a daemon runs one straggler model, give its keys in "
                       "one flag");
    }
  }
  return byNode;
}

}  // namespace consensusd::cli
