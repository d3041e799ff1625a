// A running node's changes of graph, without sockets: what is held, what is
// answered at once, and what switching reports.

#include "node/graph_change.hpp"

#include <doctest/doctest.h>

#include <string>

#include "consensusd/config/load.hpp"
#include "process.hpp"

using consensusd::daemon::GraphChange;
using consensusd::testing::TempDir;
using json = nlohmann::json;

namespace {

// Three nodes on loopback; `edges` as the file spells them.
std::string graph(const std::string& edges) {
  return "name: g\nnodes:\n"
         "  - {id: n0, endpoint: \"tcp://127.0.0.1:7500\"}\n"
         "  - {id: n1, endpoint: \"tcp://127.0.0.1:7501\"}\n"
         "  - {id: n2, endpoint: \"tcp://127.0.0.1:7502\"}\n"
         "edges: " +
         edges + "\n";
}

// Node n0 of a chain n0 - n1 - n2, loaded from `dir`.
consensusd::config::LoadedConfig chainNode(const TempDir& dir) {
  dir.write("topology.yaml", graph("[[n0, n1], [n1, n2]]"));
  return consensusd::config::loadConfig(
      dir.write("n0.yaml",
                "node: {id: n0}\ntopology: {file: topology.yaml}\n"
                "consensus: {policy: all}\nmodel: {kind: none, dimension: 4}\n"));
}

}  // namespace

TEST_CASE("graph change: the graph in force is answered at once and nothing is held") {
  TempDir dir;
  const auto loaded = chainNode(dir);
  GraphChange graphs(loaded.config, loaded.topology, loaded.nodeIndex);
  json answer;
  graphs.want(loaded.config, graph("[[n1, n2], [n0, n1]]"), "same.yaml",
              [&](json a) { answer = std::move(a); });
  CHECK(answer["ok"] == true);
  CHECK(answer["changed"] == false);
  CHECK(answer["topology_hash"] == GraphChange::hashText(loaded.topology));
  CHECK_FALSE(graphs.held());
  CHECK_FALSE(graphs.next());
}

TEST_CASE("graph change: a bad graph is answered with its file and line, nothing held") {
  TempDir dir;
  const auto loaded = chainNode(dir);
  GraphChange graphs(loaded.config, loaded.topology, loaded.nodeIndex);
  json answer;
  graphs.want(loaded.config, graph("[[n0, n9]]"), "bad.yaml",
              [&](json a) { answer = std::move(a); });
  CHECK(answer["ok"] == false);
  CHECK(answer["exit"] == 78);
  CHECK(answer["error"].get<std::string>().rfind("bad.yaml:", 0) == 0);
  CHECK_FALSE(graphs.held());
}

TEST_CASE("graph change: a new graph is held, one at a time, and switching reports its edges") {
  TempDir dir;
  const auto loaded = chainNode(dir);
  GraphChange graphs(loaded.config, loaded.topology, loaded.nodeIndex);
  json first;
  graphs.want(loaded.config, graph("[[n0, n2], [n1, n2]]"), "next.yaml",
              [&](json a) { first = std::move(a); });
  REQUIRE(graphs.held());
  CHECK(first.is_null());  // answered once switched to
  json second;
  graphs.want(loaded.config, graph("[[n0, n1], [n0, n2], [n1, n2]]"), "other.yaml",
              [&](json a) { second = std::move(a); });
  CHECK(second["ok"] == false);
  CHECK(second["error"] == "a topology change is under way: apply again after it");

  const auto next = graphs.next();
  REQUIRE(next);
  CHECK(next->self == 0);
  CHECK(&graphs.graph() == &loaded.topology);  // still in force until switched
  GraphChange::Switched done = graphs.switched(7, 1);
  CHECK(done.left == nullptr);  // the graph loaded at the start is the caller's
  REQUIRE(done.reply);
  CHECK(done.answer["changed"] == true);
  CHECK(done.answer["round"] == 7);
  CHECK(done.answer["added"] == json::array({"n2"}));
  CHECK(done.answer["removed"] == json::array({"n1"}));
  CHECK(&graphs.graph() == next->graph);
  CHECK(graphs.file() == "next.yaml");
  CHECK(graphs.changes() == 1);
  CHECK_FALSE(graphs.held());
}

TEST_CASE("graph change: a watch's news that leaves the file as it was changes nothing") {
  TempDir dir;
  const auto loaded = chainNode(dir);
  GraphChange graphs(loaded.config, loaded.topology, loaded.nodeIndex);
  dir.write("topology.yaml", graph("[[n0, n2], [n1, n2]]"));
  graphs.reload(loaded.config, false);
  REQUIRE(graphs.held());
  graphs.switched(3, 1);
  graphs.reload(loaded.config, false);  // the same text again: no news
  CHECK_FALSE(graphs.held());
  dir.write("topology.yaml", graph("[[n0, n1], [n1, n2]]"));
  graphs.reload(loaded.config, true);  // SIGHUP: read, and a change again
  CHECK(graphs.held());
}
