#pragma once
// Standard graphs as topology specs (the same files a user would write).
// Deterministic: the same options and seed give the same graph everywhere.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "consensusd/topology/topology.hpp"

namespace consensusd::topology {

// Bad generator arguments (e.g. hypercube of 6 nodes): a usage error.
class GeneratorError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct GeneratorOptions {
  std::string kind;          // one of generatorKinds()
  std::size_t nodes = 0;     // all kinds; torus may give rows and cols instead
  std::size_t rows = 0;      // torus
  std::size_t cols = 0;      // torus
  std::size_t degree = 4;    // random-regular
  double probability = 0.5;  // erdos-renyi
  std::uint64_t seed = 1;    // random-regular, erdos-renyi
  MixingRule mixing = MixingRule::Metropolis;
  std::string name;  // default: KIND + nodes, e.g. "ring8"
  // Node i listens on hosts[i % hosts.size()], port basePort + i / hosts.size().
  std::vector<std::string> hosts{"127.0.0.1"};
  unsigned basePort = 7000;
};

const std::vector<std::string>& generatorKinds();

// Node ids are n0..n{N-1}. Exponential graphs are directed (BlueFog style:
// node i sends to i + 2^k mod N); all others are undirected.
TopologySpec generate(const GeneratorOptions& options);

}  // namespace consensusd::topology
