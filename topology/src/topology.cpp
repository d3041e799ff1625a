#include "consensusd/topology/topology.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <string_view>
#include <utility>

#include "reachable.hpp"

namespace consensusd::topology {
namespace {

using schema::InputError;

constexpr double kWeightTolerance = 1e-9;
constexpr std::size_t kMaxIdLength = 64;

std::string formatWeight(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.17g", value);
  return buffer;
}

std::string lineOf(schema::Position at) {
  return "line " + std::to_string(at.line);
}

bool validId(const std::string& id) {
  if (id.empty() || id.size() > kMaxIdLength) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '-' || c == '_' || c == '.';
  });
}

// A host ZeroMQ can resolve: `*`, [IPv6], a dotted quad whose parts are
// 0..255 (digits and dots only), or a name (letters, digits, '-', '_', '.';
// container networks allow '_').
bool validHost(const std::string& host) {
  if (host == "*") return true;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    return std::all_of(host.begin() + 1, host.end() - 1, [](char c) {
      return std::isxdigit(static_cast<unsigned char>(c)) != 0 || c == ':' || c == '.';
    });
  }
  const auto digitOrDot = [](char c) { return (c >= '0' && c <= '9') || c == '.'; };
  if (std::all_of(host.begin(), host.end(), digitOrDot)) {
    std::size_t parts = 0;
    std::size_t at = 0;
    while (at <= host.size()) {
      const std::size_t dot = std::min(host.find('.', at), host.size());
      const std::string part = host.substr(at, dot - at);
      if (part.empty() || part.size() > 3 || std::stoi(part) > 255) return false;
      ++parts;
      at = dot + 1;
    }
    return parts == 4;
  }
  return host.size() <= 253 && host.front() != '-' && host.front() != '.' &&
         std::all_of(host.begin(), host.end(), [](char c) {
           return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '-' || c == '_' ||
                  c == '.';
         });
}

// tcp://HOST:PORT (port 1..65535) or ipc://PATH.
bool validEndpoint(const std::string& endpoint) {
  if (endpoint.rfind("ipc://", 0) == 0) return endpoint.size() > 6;
  if (endpoint.rfind("tcp://", 0) != 0) return false;
  const std::size_t colon = endpoint.rfind(':');
  if (colon <= 6 || colon + 1 >= endpoint.size()) return false;
  if (!validHost(endpoint.substr(6, colon - 6))) return false;
  const std::string port = endpoint.substr(colon + 1);
  if (port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return false;
  }
  const long value = std::stol(port);
  return value >= 1 && value <= 65535;
}

std::uint64_t fnv1a(const std::string& text) {
  std::uint64_t hash = 0xcbf29ce484222325ULL;
  for (const char c : text) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

}  // namespace

bool isZ85Key(const std::string& text) {
  static constexpr std::string_view kAlphabet =
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
  return text.size() == 40 && std::all_of(text.begin(), text.end(), [](char c) {
           return kAlphabet.find(c) != std::string_view::npos;
         });
}

std::string toString(MixingRule rule) {
  switch (rule) {
    case MixingRule::Metropolis:
      return "metropolis";
    case MixingRule::MaxDegree:
      return "max-degree";
    case MixingRule::Uniform:
      return "uniform";
    case MixingRule::Explicit:
      return "explicit";
  }
  return "?";
}

const std::vector<std::string>& mixingRuleNames() {
  static const std::vector<std::string> kNames{"metropolis", "max-degree", "uniform", "explicit"};
  return kNames;
}

std::optional<MixingRule> parseMixingRule(const std::string& text) {
  for (const MixingRule rule :
       {MixingRule::Metropolis, MixingRule::MaxDegree, MixingRule::Uniform, MixingRule::Explicit}) {
    if (toString(rule) == text) return rule;
  }
  return std::nullopt;
}

bool naturalLess(const std::string& a, const std::string& b) {
  std::size_t i = 0;
  std::size_t j = 0;
  const auto isDigit = [](char c) { return c >= '0' && c <= '9'; };
  while (i < a.size() && j < b.size()) {
    if (isDigit(a[i]) && isDigit(b[j])) {
      std::size_t endA = i;
      std::size_t endB = j;
      while (endA < a.size() && isDigit(a[endA])) ++endA;
      while (endB < b.size() && isDigit(b[endB])) ++endB;
      std::size_t startA = i;
      std::size_t startB = j;
      while (startA + 1 < endA && a[startA] == '0') ++startA;
      while (startB + 1 < endB && b[startB] == '0') ++startB;
      const std::size_t lengthA = endA - startA;
      const std::size_t lengthB = endB - startB;
      if (lengthA != lengthB) return lengthA < lengthB;
      const int order = a.compare(startA, lengthA, b, startB, lengthB);
      if (order != 0) return order < 0;
      i = endA;
      j = endB;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  if (a.size() - i != b.size() - j) return a.size() - i < b.size() - j;
  return a < b;  // same by value ("n01" vs "n1"): fall back to bytes
}

namespace {

// Throws the InputError of `file` at `at`: the key `path` and what is wrong.
struct Failure {
  const std::string& file;
  [[noreturn]] void operator()(schema::Position at, const std::string& message,
                               const std::string& path) const {
    throw InputError(file, at, message, path);
  }
};

// Nodes: valid and unique ids, endpoints and keys; self weights as the rule allows.
void checkNodes(const TopologySpec& spec, const Failure& fail) {
  const bool isExplicit = spec.mixing == MixingRule::Explicit;
  std::map<std::string, std::size_t> fileIndex;
  std::map<std::string, std::size_t> endpointIndex;
  std::map<std::string, std::size_t> keyIndex;
  for (std::size_t i = 0; i < spec.nodes.size(); ++i) {
    const NodeSpec& node = spec.nodes[i];
    const std::string path = "nodes[" + std::to_string(i) + "]";
    if (!validId(node.id)) {
      fail(node.at, "invalid node id '" + node.id + "': use 1-64 letters, digits, '-', '_' or '.'",
           path + ".id");
    }
    if (const auto [it, inserted] = fileIndex.emplace(node.id, i); !inserted) {
      fail(node.at,
           "duplicate node id '" + node.id + "' (first at " + lineOf(spec.nodes[it->second].at) +
               ")",
           path + ".id");
    }
    if (!validEndpoint(node.endpoint)) {
      fail(node.at,
           "invalid endpoint '" + node.endpoint + "': expected tcp://HOST:PORT or ipc://PATH",
           path + ".endpoint");
    }
    if (!node.publicKey.empty() && !isZ85Key(node.publicKey)) {
      fail(node.at, "public_key must be 40 Z85 characters (consensusctl keygen)",
           path + ".public_key");
    }
    if (!node.publicKey.empty()) {
      if (const auto [it, inserted] = keyIndex.emplace(node.publicKey, i); !inserted) {
        fail(node.at,
             "duplicate public_key (also node '" + spec.nodes[it->second].id +
                 "'): every node needs its own key pair",
             path + ".public_key");
      }
    }
    if (const auto [it, inserted] = endpointIndex.emplace(node.endpoint, i); !inserted) {
      fail(node.at,
           "duplicate endpoint '" + node.endpoint + "' (also node '" + spec.nodes[it->second].id +
               "')",
           path + ".endpoint");
    }
    if (node.selfWeight && !isExplicit) {
      fail(node.at, "self_weight is only allowed with mixing: explicit", path + ".self_weight");
    }
    if (node.selfWeight && (*node.selfWeight < 0 || *node.selfWeight > 1)) {
      fail(node.at, "self_weight " + formatWeight(*node.selfWeight) + " is outside [0, 1]",
           path + ".self_weight");
    }
  }
}

// Edges between canonical indices: known ends, no loops, no duplicates,
// weights as the rule demands; sorted.
std::vector<Edge> checkEdges(const TopologySpec& spec,
                             const std::map<std::string, std::size_t>& indexOfId,
                             const Failure& fail) {
  const bool isExplicit = spec.mixing == MixingRule::Explicit;
  std::map<std::pair<std::size_t, std::size_t>, std::size_t> seenEdge;
  std::vector<Edge> edges;
  for (std::size_t e = 0; e < spec.edges.size(); ++e) {
    const EdgeSpec& edge = spec.edges[e];
    const std::string path = "edges[" + std::to_string(e) + "]";
    const auto from = indexOfId.find(edge.from);
    if (from == indexOfId.end()) fail(edge.at, "unknown node '" + edge.from + "'", path + ".from");
    const auto to = indexOfId.find(edge.to);
    if (to == indexOfId.end()) fail(edge.at, "unknown node '" + edge.to + "'", path + ".to");
    if (from->second == to->second) fail(edge.at, "self-loop on node '" + edge.from + "'", path);
    if (edge.weight && !isExplicit) {
      fail(edge.at, "edge weights are only allowed with mixing: explicit", path + ".weight");
    }
    if (!edge.weight && isExplicit)
      fail(edge.at, "mixing: explicit needs a weight on every edge", path);
    if (edge.weight && *edge.weight < 0) {
      fail(edge.at, "negative weight " + formatWeight(*edge.weight), path + ".weight");
    }
    if (edge.weight && *edge.weight > 1) {
      fail(edge.at, "weight " + formatWeight(*edge.weight) + " is greater than 1",
           path + ".weight");
    }
    std::pair<std::size_t, std::size_t> key{from->second, to->second};
    if (!spec.directed && key.first > key.second) std::swap(key.first, key.second);
    if (const auto [it, inserted] = seenEdge.emplace(key, e); !inserted) {
      fail(edge.at,
           "duplicate edge " + edge.from + (spec.directed ? " -> " : " -- ") + edge.to +
               " (first at " + lineOf(spec.edges[it->second].at) + ")",
           path);
    }
    edges.push_back({key.first, key.second, edge.weight});
  }
  std::sort(edges.begin(), edges.end(), [](const Edge& a, const Edge& b) {
    return std::tie(a.from, a.to) < std::tie(b.from, b.to);
  });
  return edges;
}

// Arcs both ways: forward[j] holds i where j -> i (i mixes j), backward[i] the j.
struct Arcs {
  std::vector<std::vector<std::size_t>> forward;
  std::vector<std::vector<std::size_t>> backward;
};

Arcs arcsOf(const std::vector<Edge>& edges, std::size_t n, bool directed) {
  Arcs arcs{std::vector<std::vector<std::size_t>>(n), std::vector<std::vector<std::size_t>>(n)};
  for (const Edge& edge : edges) {
    arcs.forward[edge.from].push_back(edge.to);
    arcs.backward[edge.to].push_back(edge.from);
    if (!directed) {
      arcs.forward[edge.to].push_back(edge.from);
      arcs.backward[edge.from].push_back(edge.to);
    }
  }
  return arcs;
}

// Every node reaches every other (both ways when directed); `idOf` names canonical indices.
void checkConnected(const TopologySpec& spec, const Arcs& arcs,
                    const std::function<std::string(std::size_t)>& idOf, const Failure& fail) {
  for (const auto* adjacency : {&arcs.forward, &arcs.backward}) {
    const std::vector<bool> seen = reachable(*adjacency, 0);
    if (const auto missing = std::find(seen.begin(), seen.end(), false); missing != seen.end()) {
      const auto k = static_cast<std::size_t>(missing - seen.begin());
      const std::string what =
          spec.directed ? "graph is not strongly connected: " : "graph is not connected: ";
      const std::string detail = adjacency == &arcs.forward
                                     ? idOf(k) + " cannot be reached from " + idOf(0)
                                     : idOf(0) + " cannot be reached from " + idOf(k);
      fail(spec.edgesAt, what + detail, "edges");
    }
  }
}

// The weight node i gives in-neighbour j under the spec's rule (docs/design.md §4).
double ruleWeight(const TopologySpec& spec, const Arcs& arcs, std::size_t maxInDegree,
                  const std::map<std::pair<std::size_t, std::size_t>, double>& explicitWeight,
                  std::size_t i, std::size_t j) {
  switch (spec.mixing) {
    case MixingRule::Metropolis:
      return 1.0 /
             static_cast<double>(1 + std::max(arcs.backward[i].size(), arcs.backward[j].size()));
    case MixingRule::MaxDegree:
      return 1.0 / static_cast<double>(1 + maxInDegree);
    case MixingRule::Uniform:
      return 1.0 / static_cast<double>(1 + arcs.backward[i].size());
    case MixingRule::Explicit:
      return explicitWeight.at({i, j});
  }
  return 0;
}

// In- and out-neighbours with their weights, and each node's own weight:
// every row sums to 1 (row-stochastic), and every column too when the spec
// says doubly_stochastic.
struct Weights {
  std::vector<std::vector<Neighbor>> in;
  std::vector<std::vector<Neighbor>> out;
  std::vector<double> self;
};

Weights mixingWeights(const TopologySpec& spec, const std::vector<std::size_t>& order,
                      const Arcs& arcs, const std::vector<Edge>& edges, const Failure& fail) {
  const std::size_t n = order.size();
  Weights w{std::vector<std::vector<Neighbor>>(n), std::vector<std::vector<Neighbor>>(n),
            std::vector<double>(n, 0.0)};
  std::size_t maxInDegree = 0;
  for (const auto& in : arcs.backward) maxInDegree = std::max(maxInDegree, in.size());
  std::map<std::pair<std::size_t, std::size_t>, double> explicitWeight;
  for (const Edge& edge : edges) {
    if (!edge.weight) continue;
    explicitWeight[{edge.to, edge.from}] = *edge.weight;
    if (!spec.directed) explicitWeight[{edge.from, edge.to}] = *edge.weight;
  }
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<std::size_t> in = arcs.backward[i];
    std::sort(in.begin(), in.end());
    double sum = 0;
    for (const std::size_t j : in) {
      const double weight = ruleWeight(spec, arcs, maxInDegree, explicitWeight, i, j);
      w.in[i].push_back({j, weight});
      w.out[j].push_back({i, weight});
      sum += weight;
    }
    const NodeSpec& node = spec.nodes[order[i]];
    const std::string path = "nodes[" + std::to_string(order[i]) + "]";
    if (node.selfWeight) {
      if (std::abs(*node.selfWeight + sum - 1.0) > kWeightTolerance) {
        fail(node.at,
             "weights of node '" + node.id + "' sum to " + formatWeight(*node.selfWeight + sum) +
                 " with self_weight, must be 1 (row-stochastic)",
             path + ".self_weight");
      }
      w.self[i] = *node.selfWeight;
    } else {
      if (sum > 1.0 + kWeightTolerance) {
        fail(node.at,
             "in-weights of node '" + node.id + "' sum to " + formatWeight(sum) +
                 " > 1 (not row-stochastic)",
             path);
      }
      w.self[i] = std::max(0.0, 1.0 - sum);
    }
  }
  for (auto& out : w.out) {
    std::sort(out.begin(), out.end(),
              [](const Neighbor& a, const Neighbor& b) { return a.index < b.index; });
  }
  if (!spec.doublyStochastic) return w;
  for (std::size_t j = 0; j < n; ++j) {
    double column = w.self[j];
    for (const Neighbor& out : w.out[j]) column += out.weight;
    if (std::abs(column - 1.0) > 1e-6) {
      const NodeSpec& node = spec.nodes[order[j]];
      fail(node.at,
           "weights given to node '" + node.id + "' sum to " + formatWeight(column) +
               ", must be 1 (doubly_stochastic: true)",
           "nodes[" + std::to_string(order[j]) + "]");
    }
  }
  return w;
}

// The text of everything that identifies the graph on the wire.
std::string canonicalText(bool directed, MixingRule mixing, bool doublyStochastic,
                          const std::vector<NodeSpec>& nodes, const std::vector<Edge>& edges) {
  std::string canonical = "consensusd-topology-v1\ndirected " + std::to_string(directed) +
                          "\nmixing " + toString(mixing) + "\ndoubly " +
                          std::to_string(doublyStochastic) + "\n";
  for (const NodeSpec& node : nodes) {
    canonical += "node " + node.id + " " + node.endpoint + " " + node.publicKey + " " +
                 (node.selfWeight ? formatWeight(*node.selfWeight) : "-") + "\n";
  }
  for (const Edge& edge : edges) {
    canonical += "edge " + std::to_string(edge.from) + " " + std::to_string(edge.to) + " " +
                 (edge.weight ? formatWeight(*edge.weight) : "-") + "\n";
  }
  return canonical;
}

}  // namespace

Topology Topology::fromSpec(TopologySpec spec, const std::string& sourceFile) {
  const Failure fail{sourceFile};
  if (spec.nodes.empty()) fail(spec.nodesAt, "a topology needs at least one node", "nodes");
  checkNodes(spec, fail);

  // Canonical node order and the index map from file order.
  std::vector<std::size_t> order(spec.nodes.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return naturalLess(spec.nodes[a].id, spec.nodes[b].id);
  });
  std::map<std::string, std::size_t> indexOfId;
  for (std::size_t k = 0; k < order.size(); ++k) indexOfId[spec.nodes[order[k]].id] = k;
  const std::size_t n = order.size();

  std::vector<Edge> edges = checkEdges(spec, indexOfId, fail);
  const Arcs arcs = arcsOf(edges, n, spec.directed);
  checkConnected(
      spec, arcs, [&](std::size_t k) { return spec.nodes[order[k]].id; }, fail);

  Topology topology;
  topology.name_ = std::move(spec.name);
  topology.directed_ = spec.directed;
  topology.mixing_ = spec.mixing;
  topology.doublyStochastic_ = spec.doublyStochastic;
  Weights weights = mixingWeights(spec, order, arcs, edges, fail);
  topology.in_ = std::move(weights.in);
  topology.out_ = std::move(weights.out);
  topology.self_ = std::move(weights.self);
  for (const std::size_t k : order) topology.nodes_.push_back(std::move(spec.nodes[k]));
  topology.edges_ = std::move(edges);
  topology.hash_ =
      fnv1a(canonicalText(topology.directed_, topology.mixing_, topology.doublyStochastic_,
                          topology.nodes_, topology.edges_));
  return topology;
}

std::optional<std::size_t> Topology::indexOf(const std::string& id) const {
  const auto it = std::lower_bound(
      nodes_.begin(), nodes_.end(), id,
      [](const NodeSpec& node, const std::string& key) { return naturalLess(node.id, key); });
  if (it == nodes_.end() || it->id != id) return std::nullopt;
  return static_cast<std::size_t>(it - nodes_.begin());
}

std::string Topology::hashHex() const {
  char buffer[17];
  std::snprintf(buffer, sizeof buffer, "%016llx", static_cast<unsigned long long>(hash_));
  return buffer;
}

TopologySpec toSpec(const Topology& topology) {
  TopologySpec spec;
  spec.name = topology.name();
  spec.directed = topology.directed();
  spec.mixing = topology.mixing();
  spec.doublyStochastic = topology.doublyStochastic();
  spec.nodes = topology.nodes();
  for (const Edge& edge : topology.edges())
    spec.edges.push_back({topology.node(edge.from).id, topology.node(edge.to).id, edge.weight, {}});
  return spec;
}

}  // namespace consensusd::topology
