#pragma once
// The communication graph: nodes with endpoints, directed arcs, and the mixing
// weights each node gives its in-neighbours (docs/design.md §4).
//
// A Topology is immutable and always valid: fromSpec() rejects everything
// docs/design.md §4 lists. Nodes are kept in natural id order (n2 before n10);
// a node's index is its position in that order, the same on every machine.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "consensusd/schema/input_error.hpp"

namespace consensusd::topology {

enum class MixingRule { Metropolis, MaxDegree, Uniform, Explicit };

// A CurveZMQ key as text: 40 characters of the Z85 alphabet (32 bytes).
bool isZ85Key(const std::string& text);

std::string toString(MixingRule rule);
std::optional<MixingRule> parseMixingRule(const std::string& text);
const std::vector<std::string>& mixingRuleNames();

// What a file (or a generator) says, before validation.
struct NodeSpec {
  std::string id;
  std::string endpoint;
  std::string status;     // status socket path, optional
  std::string publicKey;  // CurveZMQ public key (Z85), optional
  std::optional<double> selfWeight;
  schema::Position at;
};

// Undirected graphs: both directions. Directed: `to` mixes `from`'s estimate.
struct EdgeSpec {
  std::string from;
  std::string to;
  std::optional<double> weight;  // only with MixingRule::Explicit
  schema::Position at;
};

struct TopologySpec {
  std::string name;
  bool directed = false;
  MixingRule mixing = MixingRule::Metropolis;
  bool doublyStochastic = false;  // explicit weights must also have columns summing to 1
  std::vector<NodeSpec> nodes;
  std::vector<EdgeSpec> edges;
  schema::Position nodesAt;
  schema::Position edgesAt;
};

struct Neighbor {
  std::size_t index;
  double weight;  // w_ij for an in-neighbour j of i; the arc's weight for an out-neighbour
};

// One edge as written canonically: undirected edges with from < to.
struct Edge {
  std::size_t from;
  std::size_t to;
  std::optional<double> weight;
};

class Topology {
 public:
  // Validates `spec`; errors name `sourceFile` and the offending entry.
  static Topology fromSpec(TopologySpec spec, const std::string& sourceFile);

  const std::string& name() const { return name_; }
  bool directed() const { return directed_; }
  MixingRule mixing() const { return mixing_; }
  bool doublyStochastic() const { return doublyStochastic_; }
  std::size_t size() const { return nodes_.size(); }
  const std::vector<NodeSpec>& nodes() const { return nodes_; }
  const NodeSpec& node(std::size_t index) const { return nodes_.at(index); }
  const std::vector<Edge>& edges() const { return edges_; }
  std::optional<std::size_t> indexOf(const std::string& id) const;

  // Neighbours whose estimates node i mixes, with w_ij (sorted by index).
  const std::vector<Neighbor>& inNeighbors(std::size_t i) const { return in_.at(i); }
  // Neighbours that mix node i's estimate (where i sends).
  const std::vector<Neighbor>& outNeighbors(std::size_t i) const { return out_.at(i); }
  double selfWeight(std::size_t i) const { return self_.at(i); }

  // Hash of the canonical graph (nodes, endpoints, keys, edges, weights;
  // not the name or status paths): identifies the graph on the wire.
  std::uint64_t hash() const { return hash_; }
  std::string hashHex() const;

 private:
  Topology() = default;

  std::string name_;
  bool directed_ = false;
  MixingRule mixing_ = MixingRule::Metropolis;
  bool doublyStochastic_ = false;
  std::vector<NodeSpec> nodes_;
  std::vector<Edge> edges_;
  std::vector<std::vector<Neighbor>> in_;
  std::vector<std::vector<Neighbor>> out_;
  std::vector<double> self_;
  std::uint64_t hash_ = 0;
};

// The spec a topology was built from (ids in edges, no positions): edit and
// rebuild with fromSpec.
TopologySpec toSpec(const Topology& topology);

// "n2" < "n10": digit runs compare by value.
bool naturalLess(const std::string& a, const std::string& b);

}  // namespace consensusd::topology
