#include "consensusd/topology/generators.hpp"

#include <algorithm>
#include <random>
#include <set>
#include <utility>

#include "reachable.hpp"

namespace consensusd::topology {
namespace {

using EdgeSet = std::set<std::pair<std::size_t, std::size_t>>;

constexpr std::size_t kMaxNodes = 1u << 20;
constexpr int kMaxAttempts = 1000;

// Uniform integer in [0, bound): rejection sampling on the raw engine, so the
// graph from a seed does not depend on the standard library's distributions.
std::size_t uniformBelow(std::mt19937_64& rng, std::size_t bound) {
  const std::uint64_t range = bound;
  const std::uint64_t limit = UINT64_MAX - UINT64_MAX % range;
  std::uint64_t value = rng();
  while (value >= limit) value = rng();
  return static_cast<std::size_t>(value % range);
}

double uniformUnit(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

void addUndirected(EdgeSet& edges, std::size_t a, std::size_t b) {
  if (a != b) edges.emplace(std::min(a, b), std::max(a, b));
}

bool connected(std::size_t n, const EdgeSet& edges) {
  std::vector<std::vector<std::size_t>> adjacency(n);
  for (const auto& [a, b] : edges) {
    adjacency[a].push_back(b);
    adjacency[b].push_back(a);
  }
  const std::vector<bool> seen = reachable(adjacency, 0);
  return std::all_of(seen.begin(), seen.end(), [](bool s) { return s; });
}

// Pairs k stubs per node at random, choosing only pairs that keep the graph
// simple (Steger-Wormald); restarts when stuck or disconnected.
EdgeSet randomRegular(std::size_t n, std::size_t k, std::mt19937_64& rng) {
  if (k < 1 || k >= n) throw GeneratorError("random-regular needs 1 <= degree < nodes");
  if ((n * k) % 2 != 0) throw GeneratorError("random-regular needs nodes * degree to be even");
  if (k == 1 && n > 2)
    throw GeneratorError("random-regular with degree 1 is disconnected for more than 2 nodes");
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    std::vector<std::size_t> stubs;
    for (std::size_t v = 0; v < n; ++v) stubs.insert(stubs.end(), k, v);
    EdgeSet edges;
    bool stuck = false;
    while (!stubs.empty() && !stuck) {
      bool paired = false;
      for (std::size_t tries = 0; tries < 64 * stubs.size() && !paired; ++tries) {
        const std::size_t i = uniformBelow(rng, stubs.size());
        const std::size_t j = uniformBelow(rng, stubs.size());
        const std::size_t a = stubs[i];
        const std::size_t b = stubs[j];
        if (i == j || a == b || edges.count({std::min(a, b), std::max(a, b)}) != 0) continue;
        addUndirected(edges, a, b);
        stubs[std::max(i, j)] = stubs.back();
        stubs.pop_back();
        stubs[std::min(i, j)] = stubs.back();
        stubs.pop_back();
        paired = true;
      }
      stuck = !paired;
    }
    if (!stuck && connected(n, edges)) return edges;
  }
  throw GeneratorError("random-regular: no connected simple graph found; try another seed");
}

EdgeSet erdosRenyi(std::size_t n, double p, std::mt19937_64& rng) {
  if (!(p > 0 && p <= 1)) throw GeneratorError("erdos-renyi needs 0 < probability <= 1");
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    EdgeSet edges;
    for (std::size_t a = 0; a < n; ++a) {
      for (std::size_t b = a + 1; b < n; ++b) {
        if (uniformUnit(rng) < p) edges.emplace(a, b);
      }
    }
    if (connected(n, edges)) return edges;
  }
  throw GeneratorError("erdos-renyi: still disconnected after " + std::to_string(kMaxAttempts) +
                       " samples; raise --probability");
}

bool isPowerOfTwo(std::size_t n) {
  return n != 0 && (n & (n - 1)) == 0;
}

}  // namespace

const std::vector<std::string>& generatorKinds() {
  static const std::vector<std::string> kKinds{"ring",        "chain",          "star",
                                               "complete",    "torus",          "hypercube",
                                               "exponential", "random-regular", "erdos-renyi"};
  return kKinds;
}

TopologySpec generate(const GeneratorOptions& options) {
  const std::string& kind = options.kind;
  std::size_t n = options.nodes;
  if (kind == "torus") {
    if (options.rows == 0 && options.cols == 0)
      throw GeneratorError("torus needs --rows and --cols");
    if (options.rows == 0 || options.cols == 0)
      throw GeneratorError("torus needs both --rows and --cols");
    if (n != 0 && n != options.rows * options.cols) {
      throw GeneratorError("torus: --nodes must equal rows * cols (" +
                           std::to_string(options.rows * options.cols) + ")");
    }
    n = options.rows * options.cols;
  }
  if (n < 2) throw GeneratorError("a generated topology needs at least 2 nodes");
  if (n > kMaxNodes) throw GeneratorError("at most " + std::to_string(kMaxNodes) + " nodes");
  if (options.hosts.empty()) throw GeneratorError("at least one host is needed");
  const std::size_t portsPerHost = (n + options.hosts.size() - 1) / options.hosts.size();
  if (options.basePort < 1 || options.basePort + portsPerHost - 1 > 65535) {
    throw GeneratorError("ports " + std::to_string(options.basePort) + ".." +
                         std::to_string(options.basePort + portsPerHost - 1) +
                         " are outside 1..65535");
  }

  std::mt19937_64 rng(options.seed);
  EdgeSet edges;  // undirected pairs, or (from, to) arcs for directed kinds
  bool directed = false;
  if (kind == "ring") {
    for (std::size_t i = 0; i < n; ++i) addUndirected(edges, i, (i + 1) % n);
  } else if (kind == "chain") {
    for (std::size_t i = 0; i + 1 < n; ++i) addUndirected(edges, i, i + 1);
  } else if (kind == "star") {
    for (std::size_t i = 1; i < n; ++i) addUndirected(edges, 0, i);
  } else if (kind == "complete") {
    for (std::size_t a = 0; a < n; ++a) {
      for (std::size_t b = a + 1; b < n; ++b) addUndirected(edges, a, b);
    }
  } else if (kind == "torus") {
    const std::size_t rows = options.rows;
    const std::size_t cols = options.cols;
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t c = 0; c < cols; ++c) {
        addUndirected(edges, r * cols + c, r * cols + (c + 1) % cols);
        addUndirected(edges, r * cols + c, ((r + 1) % rows) * cols + c);
      }
    }
  } else if (kind == "hypercube") {
    if (!isPowerOfTwo(n))
      throw GeneratorError("hypercube needs a power of two nodes, got " + std::to_string(n));
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t bit = 1; bit < n; bit <<= 1) addUndirected(edges, i, i ^ bit);
    }
  } else if (kind == "exponential") {
    directed = true;
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t step = 1; step < n; step <<= 1) {
        if ((i + step) % n != i) edges.emplace(i, (i + step) % n);
      }
    }
  } else if (kind == "random-regular") {
    edges = randomRegular(n, options.degree, rng);
  } else if (kind == "erdos-renyi") {
    edges = erdosRenyi(n, options.probability, rng);
  } else {
    throw GeneratorError("unknown topology kind '" + kind + "'");
  }

  TopologySpec spec;
  spec.name = options.name.empty() ? kind + std::to_string(n) : options.name;
  spec.directed = directed;
  spec.mixing = options.mixing;
  if (options.mixing == MixingRule::Explicit) {
    throw GeneratorError("generators compute weights: use metropolis, max-degree or uniform");
  }
  for (std::size_t i = 0; i < n; ++i) {
    const std::string& host = options.hosts[i % options.hosts.size()];
    const std::size_t port = options.basePort + i / options.hosts.size();
    spec.nodes.push_back(
        {"n" + std::to_string(i), "tcp://" + host + ":" + std::to_string(port), {}, {}, {}, {}});
  }
  for (const auto& [a, b] : edges) {
    spec.edges.push_back({"n" + std::to_string(a), "n" + std::to_string(b), std::nullopt, {}});
  }
  return spec;
}

}  // namespace consensusd::topology
