#include <doctest/doctest.h>

#include <Eigen/Core>
#include <cmath>
#include <numbers>
#include <string>

#include "consensusd/topology/analysis.hpp"
#include "consensusd/topology/generators.hpp"
#include "consensusd/topology/yaml_io.hpp"

using namespace consensusd::topology;
using consensusd::schema::InputError;

namespace {

Topology make(const std::string& kind, std::size_t nodes,
              MixingRule mixing = MixingRule::Metropolis) {
  GeneratorOptions options;
  options.kind = kind;
  options.nodes = nodes;
  options.mixing = mixing;
  return Topology::fromSpec(generate(options), "<generated>");
}

std::string errorOf(const std::string& text) {
  try {
    parseTopology(text, "t.yaml");
  } catch (const InputError& e) {
    return e.what();
  }
  return "no error";
}

// Two nodes and an edge, with `extra` spliced into the top level.
const char* const kPair =
    "nodes:\n"
    "  - {id: a, endpoint: \"tcp://h:1\"}\n"
    "  - {id: b, endpoint: \"tcp://h:2\"}\n"
    "edges:\n"
    "  - [a, b]\n";

void checkRowsSumToOne(const Topology& topology) {
  const Eigen::MatrixXd w = mixingMatrix(topology);
  for (Eigen::Index i = 0; i < w.rows(); ++i)
    CHECK(w.row(i).sum() == doctest::Approx(1.0).epsilon(1e-12));
  CHECK((w.array() >= 0).all());
}

}  // namespace

TEST_CASE("generators: node and edge counts, degrees, connectivity") {
  struct Case {
    const char* kind;
    std::size_t nodes;
    std::size_t edges;
    std::size_t minDegree;
    std::size_t maxDegree;
    std::size_t diameter;
  };
  for (const Case c :
       {Case{"ring", 8, 8, 2, 2, 4}, Case{"chain", 5, 4, 1, 2, 4}, Case{"star", 6, 5, 1, 5, 2},
        Case{"complete", 5, 10, 4, 4, 1}, Case{"hypercube", 16, 32, 4, 4, 4},
        Case{"exponential", 8, 24, 3, 3, 3}, Case{"ring", 2, 1, 1, 1, 1}}) {
    CAPTURE(c.kind);
    const Analysis a = analyze(make(c.kind, c.nodes));
    CHECK(a.nodes == c.nodes);
    CHECK(a.edges == c.edges);
    CHECK(a.minDegree == c.minDegree);
    CHECK(a.maxDegree == c.maxDegree);
    CHECK(a.diameter == c.diameter);
    CHECK(a.connected);
  }
  GeneratorOptions torus;
  torus.kind = "torus";
  torus.rows = 3;
  torus.cols = 4;
  const Analysis t = analyze(Topology::fromSpec(generate(torus), "<generated>"));
  CHECK(t.nodes == 12);
  CHECK(t.edges == 24);
  CHECK(t.minDegree == 4);
  CHECK(t.diameter == 3);
  CHECK(make("exponential", 8).directed());
}

TEST_CASE("random generators are deterministic from the seed and always connected") {
  for (const char* kind : {"random-regular", "erdos-renyi"}) {
    CAPTURE(kind);
    GeneratorOptions options;
    options.kind = kind;
    options.nodes = 40;
    options.degree = 4;
    options.probability = 0.08;
    options.seed = 7;
    const Topology first = Topology::fromSpec(generate(options), "<g>");
    const Topology again = Topology::fromSpec(generate(options), "<g>");
    options.seed = 8;
    const Topology other = Topology::fromSpec(generate(options), "<g>");
    CHECK(first.hash() == again.hash());
    CHECK(first.hash() != other.hash());
    CHECK(analyze(first).connected);
    CHECK(analyze(other).connected);
  }
  GeneratorOptions regular;
  regular.kind = "random-regular";
  regular.nodes = 1000;
  regular.degree = 6;
  // fromSpec has checked connectivity; the dense spectrum is not needed here.
  const Topology large = Topology::fromSpec(generate(regular), "<g>");
  CHECK(large.edges().size() == 3000);
  for (std::size_t i = 0; i < large.size(); ++i) CHECK(large.inNeighbors(i).size() == 6);
}

TEST_CASE("generator arguments are checked") {
  GeneratorOptions options;
  options.kind = "hypercube";
  options.nodes = 6;
  CHECK_THROWS_WITH_AS(generate(options), "hypercube needs a power of two nodes, got 6",
                       GeneratorError);
  options.kind = "random-regular";
  options.nodes = 5;
  options.degree = 3;
  CHECK_THROWS_WITH_AS(generate(options), "random-regular needs nodes * degree to be even",
                       GeneratorError);
  options.kind = "ring";
  options.nodes = 1;
  CHECK_THROWS_WITH_AS(generate(options), "a generated topology needs at least 2 nodes",
                       GeneratorError);
  options.nodes = 4;
  options.basePort = 65534;
  CHECK_THROWS_WITH_AS(generate(options), "ports 65534..65537 are outside 1..65535",
                       GeneratorError);
}

TEST_CASE("endpoints come from one host or a list of hosts") {
  GeneratorOptions options;
  options.kind = "ring";
  options.nodes = 5;
  options.hosts = {"10.0.0.1", "10.0.0.2"};
  options.basePort = 9000;
  const TopologySpec spec = generate(options);
  CHECK(spec.nodes[0].endpoint == "tcp://10.0.0.1:9000");
  CHECK(spec.nodes[1].endpoint == "tcp://10.0.0.2:9000");
  CHECK(spec.nodes[4].endpoint == "tcp://10.0.0.1:9002");
}

TEST_CASE("mixing weights: rows sum to 1, doubly stochastic where the rule promises it") {
  for (const char* kind : {"ring", "star", "chain", "complete", "exponential"}) {
    for (const MixingRule rule :
         {MixingRule::Metropolis, MixingRule::MaxDegree, MixingRule::Uniform}) {
      CAPTURE(kind);
      CAPTURE(toString(rule));
      const Topology topology = make(kind, 7);
      checkRowsSumToOne(make(kind, 7, rule));
      if (rule != MixingRule::Uniform && !topology.directed())
        CHECK(analyze(make(kind, 7, rule)).doublyStochastic);
    }
  }
  // Uniform on an irregular graph is row- but not column-stochastic.
  CHECK_FALSE(analyze(make("star", 5, MixingRule::Uniform)).doublyStochastic);
  const Topology star = make("star", 5);
  CHECK(star.inNeighbors(1)[0].weight == doctest::Approx(1.0 / 5));  // 1 / (1 + max(1, 4))
  CHECK(star.selfWeight(1) == doctest::Approx(4.0 / 5));
}

TEST_CASE("known spectra") {
  for (const std::size_t n : {3u, 5u, 8u, 13u, 32u}) {
    CAPTURE(n);
    const double second =
        1.0 / 3 + 2.0 / 3 * std::cos(2 * std::numbers::pi / static_cast<double>(n));
    const std::size_t half = n / 2;  // the most negative eigenvalue sits at k = floor(n/2)
    const double last =
        std::abs(1.0 / 3 + 2.0 / 3 *
                               std::cos(2 * std::numbers::pi * static_cast<double>(half) /
                                        static_cast<double>(n)));
    const Analysis a = analyze(make("ring", n));
    CHECK(a.slem == doctest::Approx(std::max(second, last)).epsilon(1e-9));
    CHECK(a.spectralGap == doctest::Approx(1 - a.slem));
  }
  CHECK(analyze(make("ring", 8)).slem == doctest::Approx(0.8047378541).epsilon(1e-9));
  CHECK(analyze(make("complete", 6)).slem == doctest::Approx(0.0).epsilon(1e-9));
  for (const std::size_t dim : {2u, 3u, 5u}) {
    const double d = static_cast<double>(dim);
    CHECK(analyze(make("hypercube", std::size_t{1} << dim)).slem ==
          doctest::Approx((d - 1) / (d + 1)).epsilon(1e-9));
  }
}

TEST_CASE("the hash identifies the graph, not how it is written") {
  const std::string base = std::string("name: x\n") + kPair;
  const std::string reordered =
      "# same graph, other order and style\n"
      "edges: [[b, a]]\n"
      "nodes:\n"
      "  - id: b\n"
      "    endpoint: tcp://h:2\n"
      "  - {endpoint: 'tcp://h:1', id: a}\n"
      "name: renamed\n"
      "mixing: metropolis\n"
      "directed: false\n";
  const std::uint64_t hash = parseTopology(base, "t").hash();
  CHECK(parseTopology(reordered, "t").hash() == hash);
  CHECK(parseTopology(toYaml(parseTopology(base, "t")), "t").hash() == hash);

  std::string changedEndpoint = base;
  changedEndpoint.replace(changedEndpoint.find("h:2"), 3, "h:3");
  CHECK(parseTopology(changedEndpoint, "t").hash() != hash);
  std::string changedId = base;
  changedId.replace(changedId.find("id: b"), 5, "id: c");
  changedId.replace(changedId.find("[a, b]"), 6, "[a, c]");
  CHECK(parseTopology(changedId, "t").hash() != hash);
  CHECK(parseTopology(base + "mixing: uniform\n", "t").hash() != hash);
  CHECK(parseTopology("directed: true\n" + base + "  - [b, a]\n", "t").hash() != hash);

  const std::string weighted =
      "mixing: explicit\nnodes:\n  - {id: a, endpoint: \"tcp://h:1\"}\n"
      "  - {id: b, endpoint: \"tcp://h:2\"}\nedges:\n  - {from: a, to: b, weight: 0.5}\n";
  std::string otherWeight = weighted;
  otherWeight.replace(otherWeight.find("0.5"), 3, "0.4");
  CHECK(parseTopology(weighted, "t").hash() != parseTopology(otherWeight, "t").hash());
}

TEST_CASE("canonical form: natural node order, sorted edges, a fixed point") {
  const Topology topology = make("ring", 12);
  const std::string text = toYaml(topology);
  CHECK(text.find("n2, endpoint") < text.find("n10, endpoint"));
  CHECK(toYaml(parseTopology(text, "t")) == text);
  CHECK(topology.indexOf("n10") == 10u);
  CHECK_FALSE(topology.indexOf("n12").has_value());
  CHECK(naturalLess("n9", "n10"));
  CHECK_FALSE(naturalLess("n10", "n9"));
}

TEST_CASE("explicit weights: row-stochastic, optional self weight, doubly stochastic on request") {
  const std::string nodes =
      "nodes:\n  - {id: a, endpoint: \"tcp://h:1\"}\n  - {id: b, endpoint: \"tcp://h:2\"}\n"
      "  - {id: c, endpoint: \"tcp://h:3\"}\n";
  const Topology directed =
      parseTopology("directed: true\nmixing: explicit\n" + nodes +
                        "edges:\n  - {from: a, to: b, weight: 0.25}\n"
                        "  - {from: b, to: c, weight: 0.5}\n  - {from: c, to: a, weight: 0.75}\n",
                    "t");
  CHECK(directed.selfWeight(1) == doctest::Approx(0.75));
  CHECK(directed.inNeighbors(1)[0].index == 0);
  CHECK(directed.inNeighbors(1)[0].weight == doctest::Approx(0.25));
  checkRowsSumToOne(directed);
  CHECK_FALSE(analyze(directed).doublyStochastic);
}

TEST_CASE("every validation error names file, line, column and key path") {
  const std::string two =
      "  - {id: a, endpoint: \"tcp://h:1\"}\n  - {id: b, endpoint: \"tcp://h:2\"}\n";
  const std::string nodes = "nodes:\n" + two;
  CHECK(errorOf("") == "t.yaml:1:1: topology file is empty");
  CHECK(errorOf("[1, 2]") == "t.yaml:1:1: expected a mapping, got a list");
  CHECK(errorOf(nodes) == "t.yaml:1:1: missing key 'edges' (edges)");
  CHECK(errorOf("edges: []\n") == "t.yaml:1:1: missing key 'nodes' (nodes)");
  CHECK(errorOf("nodes: []\nedges: []\n") ==
        "t.yaml:1:8: a topology needs at least one node (nodes)");
  CHECK(errorOf(std::string(kPair) + "mixng: uniform\n") ==
        "t.yaml:6:1: unknown key 'mixng', did you mean 'mixing'? (mixng)");
  CHECK(errorOf(std::string(kPair) + "mixing: metropolitan\n") ==
        "t.yaml:6:9: unknown value 'metropolitan', did you mean 'metropolis'? "
        "(one of: metropolis max-degree uniform explicit) (mixing)");
  CHECK(errorOf(std::string(kPair) + "directed: 1\n") ==
        "t.yaml:6:11: expected true or false, got a number (directed)");
  CHECK(errorOf("nodes: {a: 1}\nedges: []\n") ==
        "t.yaml:1:8: expected a list, got a mapping (nodes)");
  CHECK(errorOf("nodes:\n  - {id: a}\nedges: []\n") ==
        "t.yaml:2:5: missing key 'endpoint' (nodes[0].endpoint)");
  CHECK(errorOf("nodes:\n  - {id: a, endpiont: x}\nedges: []\n") ==
        "t.yaml:2:13: unknown key 'endpiont', did you mean 'endpoint'? (nodes[0].endpiont)");
  CHECK(errorOf("nodes:\n  - {id: [a], endpoint: x}\nedges: []\n") ==
        "t.yaml:2:10: expected a string, got a list (nodes[0].id)");
  CHECK(
      errorOf("nodes:\n  - {id: a b, endpoint: \"tcp://h:1\"}\nedges: []\n") ==
      "t.yaml:2:5: invalid node id 'a b': use 1-64 letters, digits, '-', '_' or '.' (nodes[0].id)");
  CHECK(errorOf("nodes:\n  - {id: a, endpoint: \"http://h:1\"}\nedges: []\n") ==
        "t.yaml:2:5: invalid endpoint 'http://h:1': expected tcp://HOST:PORT or ipc://PATH "
        "(nodes[0].endpoint)");
  CHECK(errorOf("nodes:\n  - {id: a, endpoint: \"tcp://h:70000\"}\nedges: []\n") ==
        "t.yaml:2:5: invalid endpoint 'tcp://h:70000': expected tcp://HOST:PORT or ipc://PATH "
        "(nodes[0].endpoint)");
  // Hosts that could never resolve are caught here, not at bind time.
  for (const std::string host : {"300.1.1.1", "1.2.3", "1..2.3", "-h", "h/1", "[fe80::z]"}) {
    CHECK(errorOf("nodes:\n  - {id: a, endpoint: \"tcp://" + host + ":1\"}\nedges: []\n") ==
          "t.yaml:2:5: invalid endpoint 'tcp://" + host +
              ":1': expected tcp://HOST:PORT or ipc://PATH (nodes[0].endpoint)");
  }
  CHECK(errorOf("nodes:\n" + two + "  - {id: a, endpoint: \"tcp://h:3\"}\nedges: []\n") ==
        "t.yaml:4:5: duplicate node id 'a' (first at line 2) (nodes[2].id)");
  CHECK(errorOf("nodes:\n" + two + "  - {id: c, endpoint: \"tcp://h:1\"}\nedges: []\n") ==
        "t.yaml:4:5: duplicate endpoint 'tcp://h:1' (also node 'a') (nodes[2].endpoint)");
  const std::string key = "\"rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7\"";
  CHECK(errorOf("nodes:\n  - {id: a, endpoint: \"tcp://h:1\", public_key: \"" +
                std::string(40, ',') + "\"}\nedges: []\n") ==
        "t.yaml:2:48: public_key must be 40 Z85 characters (consensusctl keygen) "
        "(nodes[0].public_key)");
  CHECK(errorOf("nodes:\n  - {id: a, endpoint: \"tcp://h:1\", public_key: " + key +
                "}\n  - {id: b, endpoint: \"tcp://h:2\", public_key: " + key + "}\nedges: []\n") ==
        "t.yaml:3:5: duplicate public_key (also node 'a'): every node needs its own key pair "
        "(nodes[1].public_key)");
  CHECK(errorOf(nodes + "edges:\n  - [a, a]\n") == "t.yaml:5:5: self-loop on node 'a' (edges[0])");
  CHECK(errorOf(nodes + "edges:\n  - [a, z]\n") == "t.yaml:5:5: unknown node 'z' (edges[0].to)");
  CHECK(errorOf(nodes + "edges:\n  - [a, b, c]\n") ==
        "t.yaml:5:5: an edge list needs exactly 2 node ids, got 3 (edges[0])");
  CHECK(errorOf(nodes + "edges:\n  - a\n") ==
        "t.yaml:5:5: expected [from, to] or {from, to, weight}, got a string (edges[0])");
  CHECK(errorOf(nodes + "edges:\n  - [a, b]\n  - [b, a]\n") ==
        "t.yaml:6:5: duplicate edge b -- a (first at line 5) (edges[1])");
  CHECK(errorOf(nodes + "  - {id: c, endpoint: \"tcp://h:3\"}\nedges:\n  - [a, b]\n") ==
        "t.yaml:6:3: graph is not connected: c cannot be reached from a (edges)");
  CHECK(errorOf("directed: true\n" + nodes + "edges:\n  - [a, b]\n") ==
        "t.yaml:6:3: graph is not strongly connected: a cannot be reached from b (edges)");
  CHECK(errorOf(nodes + "edges:\n  - {from: a, to: b, weight: 0.5}\n") ==
        "t.yaml:5:5: edge weights are only allowed with mixing: explicit (edges[0].weight)");
  CHECK(errorOf("mixing: explicit\n" + nodes + "edges:\n  - [a, b]\n") ==
        "t.yaml:6:5: mixing: explicit needs a weight on every edge (edges[0])");
  CHECK(errorOf("mixing: explicit\n" + nodes + "edges:\n  - {from: a, to: b, weight: -0.5}\n") ==
        "t.yaml:6:5: negative weight -0.5 (edges[0].weight)");
  CHECK(errorOf("mixing: explicit\n" + nodes + "edges:\n  - {from: a, to: b, weight: \"0.5\"}\n") ==
        "t.yaml:6:30: expected a number, got a string (edges[0].weight)");
  CHECK(errorOf("nodes:\n  - {id: a, endpoint: \"tcp://h:1\", self_weight: 0.5}\n"
                "  - {id: b, endpoint: \"tcp://h:2\"}\nedges: [[a, b]]\n") ==
        "t.yaml:2:5: self_weight is only allowed with mixing: explicit (nodes[0].self_weight)");
  CHECK(errorOf(
            "mixing: explicit\nnodes:\n  - {id: a, endpoint: \"tcp://h:1\", self_weight: 0.7}\n"
            "  - {id: b, endpoint: \"tcp://h:2\"}\nedges:\n  - {from: a, to: b, weight: 0.5}\n") ==
        "t.yaml:3:5: weights of node 'a' sum to 1.2 with self_weight, must be 1 (row-stochastic) "
        "(nodes[0].self_weight)");
  const std::string three = "  - {id: c, endpoint: \"tcp://h:3\"}\n";
  CHECK(errorOf("mixing: explicit\n" + nodes + three +
                "edges:\n  - {from: a, to: b, weight: 0.6}\n  - {from: b, to: c, weight: 0.6}\n") ==
        "t.yaml:4:5: in-weights of node 'b' sum to 1.2 > 1 (not row-stochastic) (nodes[1])");
  CHECK(errorOf("directed: true\nmixing: explicit\ndoubly_stochastic: true\n" + nodes + three +
                "edges:\n  - {from: a, to: b, weight: 0.5}\n  - {from: b, to: c, weight: 0.5}\n"
                "  - {from: c, to: a, weight: 0.25}\n") ==
        "t.yaml:5:5: weights given to node 'a' sum to 1.25, must be 1 (doubly_stochastic: true) "
        "(nodes[0])");
}
