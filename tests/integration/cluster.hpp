#pragma once
// Local clusters of real consensusd processes for integration tests: a ring
// (or single node) topology on loopback ports below the ephemeral range,
// one config per node in a temporary folder, status sockets beside them.

#include <unistd.h>

#include <deque>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "process.hpp"

namespace consensusd::testing {

class Cluster {
 public:
  // `nodes` = 1: a single node with no edges; otherwise a ring
  // (topology.yaml), of the first `ring` nodes when given (the others have
  // configs, for a graph applied later).
  Cluster(std::size_t nodes, std::vector<std::string> overrides, std::size_t ring = 0)
      : nodes_(nodes), overrides_(std::move(overrides)), basePort_(20000 + (getpid() % 600) * 20) {
    std::vector<std::size_t> members(ring > 0 ? ring : nodes);
    for (std::size_t i = 0; i < members.size(); ++i) members[i] = i;
    writeRing("topology.yaml", members);
    for (std::size_t i = 0; i < nodes; ++i) {
      dir_.write(id(i) + ".yaml", "node: {id: " + id(i) +
                                      "}\ntopology: {file: topology.yaml}\nstatus: {socket: " +
                                      id(i) + ".sock}\ncheckpoint: {dir: ckpt-" + id(i) +
                                      "}\nlog: {metrics_file: " + id(i) + ".jsonl}\n");
    }
    children_.resize(nodes);
    logs_.resize(nodes);
  }

  // A topology file in the cluster's folder: a ring of `members` in that
  // order (one: no edges; two: one edge); returns its path.
  // `publicKeys`: each member's CURVE public key, in the same order, or none.
  std::string writeRing(const std::string& name, const std::vector<std::size_t>& members,
                        const std::vector<std::string>& publicKeys = {}) const {
    std::string text = "name: " + name.substr(0, name.find('.')) + "\nnodes:\n";
    for (std::size_t k = 0; k < members.size(); ++k) {
      const std::size_t i = members[k];
      text += "  - {id: " + id(i) +
              ", endpoint: \"tcp://127.0.0.1:" + std::to_string(basePort_ + static_cast<int>(i)) +
              "\", status: \"" + socket(i) + "\"" +
              (publicKeys.empty() ? "" : ", public_key: \"" + publicKeys[k] + "\"") + "}\n";
    }
    const std::size_t n = members.size();
    text += "edges: [";
    for (std::size_t k = 0; n > 1 && k < (n == 2 ? 1 : n); ++k)
      text += (k > 0 ? ", [" : "[") + id(members[k]) + ", " + id(members[(k + 1) % n]) + "]";
    text += "]\n";
    dir_.write(name, text);
    return path(name);
  }

  static std::string id(std::size_t i) { return "n" + std::to_string(i); }
  std::string socket(std::size_t i) const { return dir_.path() + "/" + id(i) + ".sock"; }
  std::string path(const std::string& name) const { return dir_.path() + "/" + name; }
  std::size_t size() const { return nodes_; }
  // A free port of this cluster's block, above the nodes' own ports.
  int sparePort() const { return basePort_ + 19; }

  // `extra`: more --set overrides; `env`: NAME=VALUE added to its environment.
  Child& start(std::size_t i, const std::vector<std::string>& extra = {},
               const std::vector<std::string>& env = {}) {
    std::vector<std::string> argv{"/usr/bin/env"};
    argv.insert(argv.end(), env.begin(), env.end());
    argv.insert(argv.end(), {CONSENSUSD, "--config", path(id(i) + ".yaml")});
    for (const std::string& o : overrides_) argv.insert(argv.end(), {"--set", o});
    for (const std::string& o : extra) argv.insert(argv.end(), {"--set", o});
    logs_[i] = path(id(i) + ".log." + std::to_string(++starts_));
    children_[i] = std::make_unique<Child>(argv, logs_[i]);
    return *children_[i];
  }
  void startAll() {
    for (std::size_t i = 0; i < nodes_; ++i) start(i);
  }
  Child& child(std::size_t i) { return *children_[i]; }
  std::string log(std::size_t i) const {
    std::ifstream in(logs_[i]);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  // Every node's last `count` log lines other than its periodic progress
  // ("round N  loss ..."), which a stalled node repeats: for a failure's message.
  std::string logTails(std::size_t count = 30) const {
    std::string out;
    for (std::size_t i = 0; i < nodes_; ++i) {
      std::istringstream in(log(i));
      std::deque<std::string> kept;
      for (std::string line; std::getline(in, line);) {
        if (line.find(" info round ") != std::string::npos) continue;
        kept.push_back(line);
        if (kept.size() > count) kept.pop_front();
      }
      out += "--- " + id(i) + "\n";
      for (const std::string& line : kept) out += line + "\n";
    }
    return out;
  }

 private:
  std::size_t nodes_;
  std::vector<std::string> overrides_;
  int basePort_;
  TempDir dir_;
  std::vector<std::unique_ptr<Child>> children_;
  std::vector<std::string> logs_;  // of each node's latest start
  int starts_ = 0;
};

}  // namespace consensusd::testing
