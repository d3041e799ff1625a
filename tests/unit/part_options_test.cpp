// What the node's parts are built with, from a loaded config.

#include "node/part_options.hpp"

#include <doctest/doctest.h>

#include "consensusd/config/load.hpp"
#include "process.hpp"

using consensusd::daemon::trainerOptions;
using consensusd::daemon::transportOptions;
using consensusd::testing::TempDir;
using namespace std::chrono_literals;

namespace {

consensusd::config::LoadedConfig node0(const TempDir& dir, const std::string& extra,
                                       const std::string& node = "{id: n0}") {
  dir.write("topology.yaml",
            "name: g\nnodes:\n"
            "  - {id: n0, endpoint: \"tcp://127.0.0.1:7700\"}\n"
            "  - {id: n1, endpoint: \"tcp://127.0.0.1:7701\"}\n"
            "edges: [[n0, n1]]\n");
  return consensusd::config::loadConfig(
      dir.write("n0.yaml", "node: " + node +
                               "\ntopology: {file: topology.yaml}\n"
                               "status: {socket: n0.sock}\n"
                               "model: {kind: none, dimension: 4}\n" +
                               extra));
}

}  // namespace

TEST_CASE("part options: the transport binds the topology's endpoint unless node.bind") {
  const TempDir dir;
  const auto loaded = node0(dir, "consensus: {peer_timeout_ms: 700, staleness: 2}\n");
  const auto options = transportOptions(loaded, loaded.topology, loaded.nodeIndex, 4,
                                        consensusd::wire::Dtype::Float32);
  CHECK(options.bind == "tcp://127.0.0.1:7700");
  CHECK(options.expect.topologyHash == loaded.topology.hash());
  CHECK(options.expect.dimension == 4);
  CHECK(options.peerTimeout == 700ms);
  CHECK(options.staleness == 2);
  CHECK_FALSE(options.curve);
  const TempDir other;
  const auto bound = node0(other, "", "{id: n0, bind: \"tcp://*:7800\"}");
  CHECK(
      transportOptions(bound, bound.topology, bound.nodeIndex, 4, consensusd::wire::Dtype::Float32)
          .bind == "tcp://*:7800");
}

TEST_CASE("part options: the trainer socket sits beside the status socket, shape from the config") {
  const TempDir dir;
  const auto loaded = node0(dir, "");
  const auto options = trainerOptions(loaded.config, loaded);
  CHECK(options.socket == dir.path() + "/n0.trainer.sock");
  CHECK(options.dimension == 4);
}
