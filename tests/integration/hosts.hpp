#pragma once
// Hosts for integration tests: network namespaces on one bridge (made by
// scripts/netns-testbed, always removed), daemons started inside them, and
// what their status sockets say. Needs root.

#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "consensusd/ctl/status_client.hpp"
#include "process.hpp"

namespace consensusd::testing {

using nlohmann::json;
using namespace std::chrono_literals;

inline const std::string kScript = CONSENSUSD_SOURCE_DIR "/scripts/netns-testbed";

// Namespaces, bridge and links for one test; always removed.
class Hosts {
 public:
  explicit Hosts(std::size_t nodes)
      : prefix_("cnt" + std::to_string(getpid() % 100000)),
        subnet_("10.78." + std::to_string(getpid() % 200)) {
    const auto up = runProcess({kScript, "up", std::to_string(nodes), prefix_, subnet_}, {}, 60s);
    INFO(up.out << up.err);
    REQUIRE(up.exitCode == 0);
  }
  ~Hosts() { runProcess({kScript, "down", prefix_}, {}, 60s); }
  Hosts(const Hosts&) = delete;
  Hosts& operator=(const Hosts&) = delete;

  std::string address(std::size_t i) const { return subnet_ + "." + std::to_string(i + 1); }
  std::string ns(std::size_t i) const { return prefix_ + std::to_string(i); }
  void link(std::size_t i, bool up) const {
    REQUIRE(runProcess({kScript, up ? "heal" : "cut", prefix_, std::to_string(i)}).exitCode == 0);
  }
  void shape(std::size_t i, const std::string& rate) const {
    const auto shaped = runProcess({kScript, "shape", prefix_, std::to_string(i), rate});
    INFO(shaped.out << shaped.err);
    REQUIRE(shaped.exitCode == 0);
  }

 private:
  std::string prefix_;
  std::string subnet_;
};

inline json status(const TempDir& dir, std::size_t i) {
  try {
    return cli::askDaemon(dir.path() + "/n" + std::to_string(i) + ".sock", {{"cmd", "status"}}, 5s);
  } catch (const std::exception&) {
    return json::object();
  }
}

// A node's neighbours as its status socket lists them (none if it does not answer).
inline json neighbors(const std::string& socket) {
  try {
    return cli::askDaemon(socket, {{"cmd", "neighbors"}}, 5s).value("neighbors", json::array());
  } catch (const std::exception&) {
    return json::array();
  }
}

// Peak resident memory of a process (VmHWM), in bytes; 0 if unreadable.
inline double peakResident(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) * 1024;
  return 0;
}

// A topology of `nodes` daemons on `hosts`, a ring (one edge for two), and
// their configs, in `dir`.
inline void writeCluster(const TempDir& dir, const Hosts& hosts, std::size_t nodes) {
  std::string topology = "name: netns\nnodes:\n";
  for (std::size_t i = 0; i < nodes; ++i) {
    topology += "  - {id: n" + std::to_string(i) + ", endpoint: \"tcp://" + hosts.address(i) +
                ":7000\", status: \"" + dir.path() + "/n" + std::to_string(i) + ".sock\"}\n";
  }
  topology += "edges: [";
  for (std::size_t i = 0; i < (nodes == 2 ? 1 : nodes); ++i)
    topology += std::string(i > 0 ? ", " : "") + "[n" + std::to_string(i) + ", n" +
                std::to_string((i + 1) % nodes) + "]";
  topology += "]\n";
  dir.write("topology.yaml", topology);
  for (std::size_t i = 0; i < nodes; ++i) {
    const std::string id = "n" + std::to_string(i);
    dir.write(id + ".yaml", "node: {id: " + id + "}\ntopology: {file: topology.yaml}\n" +
                                "checkpoint: {dir: ckpt-" + id + "}\nlog: {metrics_file: " + id +
                                ".jsonl}\n");
  }
}

inline std::unique_ptr<Child> startIn(const Hosts& hosts, const TempDir& dir, std::size_t i,
                                      const std::vector<std::string>& overrides) {
  const std::string id = "n" + std::to_string(i);
  std::vector<std::string> argv{"/usr/sbin/ip",
                                "netns",
                                "exec",
                                hosts.ns(i),
                                CONSENSUSD,
                                "--config",
                                dir.path() + "/" + id + ".yaml"};
  for (const std::string& o : overrides) argv.insert(argv.end(), {"--set", o});
  return std::make_unique<Child>(argv, dir.path() + "/" + id + ".log");
}

inline std::int64_t roundOf(const TempDir& dir, std::size_t i) {
  return status(dir, i).value("round", std::int64_t{-1});
}

// The parameters of node i's newest checkpoint: float32 after the 44-byte
// header, the CRC-32C after them (no momentum: one vector).
inline std::vector<float> parameters(const TempDir& dir, std::size_t i) {
  const json answer =
      cli::askDaemon(dir.path() + "/n" + std::to_string(i) + ".sock", {{"cmd", "checkpoint"}}, 10s);
  std::ifstream in(answer.at("path").get<std::string>(), std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() > 48);
  std::vector<float> values((bytes.size() - 48) / 4);
  std::memcpy(values.data(), bytes.data() + 44, values.size() * 4);
  return values;
}

inline double distance(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0;
  for (std::size_t k = 0; k < a.size(); ++k) sum += std::pow(double(a[k]) - double(b[k]), 2);
  return std::sqrt(sum);
}

}  // namespace consensusd::testing
