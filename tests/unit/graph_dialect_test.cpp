// Speaking two graphs while a change rolls out, without sockets: what a
// neighbour in both is told and read in, and when one removed is told so.

#include "network/graph_dialect.hpp"

#include <doctest/doctest.h>

#include <string>

#include "consensusd/topology/yaml_io.hpp"

using consensusd::daemon::GraphDialect;
using consensusd::topology::parseTopology;
using consensusd::topology::Topology;
using namespace std::chrono_literals;
namespace wire = consensusd::wire;

namespace {

// `ids` on loopback (in this order: their indices), joined by `edges`.
Topology graph(const std::vector<std::string>& ids, const std::string& edges) {
  std::string text = "name: g\nnodes:\n";
  for (std::size_t i = 0; i < ids.size(); ++i)
    text += "  - {id: " + ids[i] + ", endpoint: \"tcp://127.0.0.1:" + std::to_string(7600 + i) +
            "\"}\n";
  return parseTopology(text + "edges: " + edges + "\n", "g.yaml");
}

wire::Expectation expecting(const Topology& g) {
  return {g.hash(), 4, wire::Dtype::Float32};
}

}  // namespace

TEST_CASE(
    "graph dialect: a neighbour in both graphs is spoken to in the old one until it speaks ours") {
  // n1 - n0 - n2 becomes a - n0 - n1 - n2: we (n0) move from index 0 to
  // 1 (indices follow the ids' order); n1 stays a neighbour, n2 leaves us,
  // a is new.
  const Topology before = graph({"n0", "n1", "n2"}, "[[n0, n1], [n0, n2]]");
  const Topology after = graph({"a", "n0", "n1", "n2"}, "[[a, n0], [n0, n1], [n1, n2]]");
  REQUIRE(after.indexOf("n0") == 1);
  GraphDialect dialect;
  dialect.change(before, 0, after, 1);
  const std::size_t n1 = *after.indexOf("n1");
  const std::size_t newcomer = *after.indexOf("a");
  CHECK(dialect.onPrevious(n1));
  CHECK_FALSE(dialect.onPrevious(newcomer));  // new: knows only the new graph

  wire::Header h{};
  h.sender = 1;
  h.topologyHash = after.hash();
  dialect.speak(h, n1);
  CHECK(h.sender == 0);  // our index in the graph n1 still runs
  CHECK(h.topologyHash == before.hash());
  wire::Header toNew{};
  toNew.sender = 1;
  toNew.topologyHash = after.hash();
  dialect.speak(toNew, newcomer);
  CHECK(toNew.sender == 1);
  CHECK(toNew.topologyHash == after.hash());

  // n1's messages in the old graph carry its index there (1).
  const auto spoken = dialect.spokenBy(n1, before.hash(), after, expecting(after));
  REQUIRE(spoken);
  CHECK(spoken->sender == 1);
  CHECK(spoken->expect.topologyHash == before.hash());
  // a claims the old graph: it was never in it.
  CHECK_FALSE(dialect.spokenBy(newcomer, before.hash(), after, expecting(after)));
  // A graph neither of us knows: validation judges it.
  const auto unknown = dialect.spokenBy(n1, 12345, after, expecting(after));
  REQUIRE(unknown);
  CHECK(unknown->expect.topologyHash == after.hash());

  // Once n1 speaks ours, we speak ours to it.
  wire::Header fromN1{};
  fromN1.kind = wire::Kind::Hello;
  fromN1.topologyHash = after.hash();
  dialect.heard(n1, fromN1, after.hash());
  CHECK_FALSE(dialect.onPrevious(n1));
}

TEST_CASE("graph dialect: a HELLO saying it runs a newer graph ends the old dialect for good") {
  const Topology before = graph({"n0", "n1"}, "[[n0, n1]]");
  const Topology after = graph({"n0", "n1", "n2"}, "[[n0, n1], [n1, n2]]");
  GraphDialect dialect;
  dialect.change(before, 0, after, 0);
  REQUIRE(dialect.onPrevious(1));
  wire::Header hello{};
  hello.kind = wire::Kind::Hello;
  hello.topologyHash = before.hash();
  hello.flags = wire::kHelloNewer;
  dialect.heard(1, hello, after.hash());
  CHECK_FALSE(dialect.onPrevious(1));
  wire::Header estimate{};
  estimate.kind = wire::Kind::Estimate;
  estimate.topologyHash = before.hash();  // still in flight in the old one
  dialect.heard(1, estimate, after.hash());
  CHECK_FALSE(dialect.onPrevious(1));
}

TEST_CASE("graph dialect: a removed neighbour is told in the graph it runs, once per interval") {
  const Topology before = graph({"n0", "n1", "n2"}, "[[n0, n1], [n0, n2]]");
  const Topology after = graph({"n0", "n1"}, "[[n0, n1]]");
  GraphDialect dialect;
  dialect.change(before, 0, after, 0);
  wire::Header bye{};
  bye.kind = wire::Kind::Bye;
  bye.topologyHash = after.hash();
  const consensusd::consensus::Time t0{};
  REQUIRE(dialect.tellRemoved("n2", bye, t0, 500ms));
  CHECK(bye.topologyHash == before.hash());
  CHECK(bye.sender == 0);
  CHECK(bye.flags == wire::kByeRemoved);
  CHECK_FALSE(dialect.tellRemoved("n2", bye, t0 + 100ms, 500ms));
  CHECK(dialect.tellRemoved("n2", bye, t0 + 500ms, 500ms));
  CHECK_FALSE(dialect.tellRemoved("n9", bye, t0, 500ms));  // never a neighbour
  GraphDialect fresh;                                      // no change yet: nobody was removed
  CHECK_FALSE(fresh.tellRemoved("n2", bye, t0, 500ms));
}
