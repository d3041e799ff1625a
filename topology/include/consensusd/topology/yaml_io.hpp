#pragma once
// Topology files (docs/design.md §4): strict reading with file:line:col errors,
// and writing in the canonical form (natural node order, sorted edges).

#include <string>
#include <string_view>

#include "consensusd/schema/reader.hpp"
#include "consensusd/topology/topology.hpp"

namespace consensusd::topology {

// Reads the file's shape (keys, types); Topology::fromSpec checks the graph.
TopologySpec readTopologySpec(const schema::Source& source, const schema::YamlNode& root);

Topology parseTopology(std::string_view text, const std::string& fileName);
// `path` "-" reads standard input.
Topology loadTopology(const std::string& path);

std::string toYaml(const Topology& topology);

}  // namespace consensusd::topology
