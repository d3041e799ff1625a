#include "topology_commands.hpp"

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "consensusd/daemon/command_line.hpp"
#include "consensusd/schema/input_error.hpp"
#include "consensusd/topology/analysis.hpp"
#include "consensusd/topology/generators.hpp"
#include "consensusd/topology/yaml_io.hpp"

namespace consensusd::cli {
namespace {

using topology::Analysis;
using topology::GeneratorOptions;

struct GenOptions {
  GeneratorOptions generator;
  std::string mixing = "metropolis";
  std::string host;
  std::vector<std::string> hosts;
  std::string output = "-";
};

// A topology to stdout ("-") or to a file.
int printOrWrite(const topology::Topology& graph, const std::string& output) {
  const std::string text = topology::toYaml(graph);
  if (output == "-") {
    std::cout << text;
    return kExitOk;
  }
  std::ofstream out(output, std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw std::runtime_error("cannot write " + output);
  return kExitOk;
}

int runGen(GenOptions options) {
  if (!options.host.empty() && !options.hosts.empty()) {
    throw topology::GeneratorError("give --host or --hosts, not both");
  }
  if (!options.host.empty()) options.generator.hosts = {options.host};
  if (!options.hosts.empty()) options.generator.hosts = options.hosts;
  options.generator.mixing = *topology::parseMixingRule(options.mixing);
  const topology::Topology graph =
      topology::Topology::fromSpec(topology::generate(options.generator), "<generated>");
  return printOrWrite(graph, options.output);
}

struct PlaceOptions {
  std::string topology;
  std::string hosts;  // a file: node I's host on line I (a SLURM job's task layout)
  int port = 7000;
  std::string output = "-";
};

// Node I listens on its host's port P + I: a batch system decides the hosts
// at job start, the ports are fixed beforehand (they are in the node configs).
int runPlace(const PlaceOptions& options) {
  const topology::Topology given = topology::loadTopology(options.topology);
  std::ifstream in(options.hosts);
  if (!in) throw UsageError("--hosts: cannot read " + options.hosts);
  std::vector<std::string> hosts;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) hosts.push_back(line);
  if (hosts.size() != given.size()) {
    throw UsageError("--hosts: " + options.hosts + " names " + std::to_string(hosts.size()) +
                     " hosts for the " + std::to_string(given.size()) + " nodes of " +
                     options.topology);
  }
  if (const long last = options.port + static_cast<long>(given.size()) - 1; last > 65535)
    throw UsageError("--port: ports up to " + std::to_string(last) + " are outside 1..65535");
  topology::TopologySpec spec = topology::toSpec(given);
  for (std::size_t i = 0; i < spec.nodes.size(); ++i) {
    spec.nodes[i].endpoint =
        "tcp://" + hosts[i] + ":" + std::to_string(options.port + static_cast<int>(i));
  }
  // fromSpec checks every endpoint, as loading the written file will.
  return printOrWrite(topology::Topology::fromSpec(std::move(spec), options.topology),
                      options.output);
}

int runCheck(const std::string& file) {
  const topology::Topology graph = topology::loadTopology(file);
  std::cout << (file == "-" ? "<stdin>" : file) << ": ok (" << graph.size() << " nodes, "
            << graph.edges().size() << (graph.directed() ? " arcs" : " edges") << ", hash "
            << graph.hashHex() << ")\n";
  return kExitOk;
}

nlohmann::json toJson(const topology::Topology& graph, const Analysis& analysis) {
  nlohmann::json json;
  json["name"] = graph.name();
  json["nodes"] = analysis.nodes;
  json["edges"] = analysis.edges;
  json["directed"] = analysis.directed;
  json["mixing"] = topology::toString(graph.mixing());
  json["min_degree"] = analysis.minDegree;
  json["max_degree"] = analysis.maxDegree;
  json["diameter"] =
      analysis.diameter ? nlohmann::json(*analysis.diameter) : nlohmann::json(nullptr);
  json["connected"] = analysis.connected;
  json["doubly_stochastic"] = analysis.doublyStochastic;
  json["slem"] = analysis.slem;
  json["spectral_gap"] = analysis.spectralGap;
  json["hash"] = analysis.hash;
  return json;
}

int runInfo(const std::string& file, bool asJson) {
  const topology::Topology graph = topology::loadTopology(file);
  const Analysis analysis = topology::analyze(graph);
  if (asJson) {
    std::cout << toJson(graph, analysis).dump(2) << "\n";
    return kExitOk;
  }
  const auto row = [](const char* label, const std::string& value) {
    std::printf("%-18s %s\n", label, value.c_str());
  };
  const auto fixed = [](double value) {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%.6f", value);
    return std::string(buffer);
  };
  row("name", graph.name());
  row("nodes", std::to_string(analysis.nodes));
  row(analysis.directed ? "arcs" : "edges", std::to_string(analysis.edges));
  row("directed", analysis.directed ? "yes" : "no");
  row("mixing", topology::toString(graph.mixing()) +
                    (analysis.doublyStochastic ? " (doubly stochastic)" : ""));
  row("degree", std::to_string(analysis.minDegree) + ".." + std::to_string(analysis.maxDegree));
  row("diameter", analysis.diameter ? std::to_string(*analysis.diameter) : "infinite");
  row("connected", analysis.connected ? "yes" : "no");
  row("slem", fixed(analysis.slem));
  row("spectral gap", fixed(analysis.spectralGap));
  row("hash", analysis.hash);
  return kExitOk;
}

}  // namespace

void addTopologyCommands(CLI::App& parent, std::function<int()>& action) {
  CLI::App* topology =
      parent.add_subcommand("topology", "Generate, check and analyse topology files");
  topology->require_subcommand(1);

  auto gen = std::make_shared<GenOptions>();
  CLI::App* genCommand =
      topology->add_subcommand("gen", "Write a generated topology (stdout by default)");
  genCommand->add_option("kind", gen->generator.kind, "Graph kind")
      ->required()
      ->check(CLI::IsMember(topology::generatorKinds()));
  genCommand->add_option("-n,--nodes", gen->generator.nodes,
                         "Number of nodes (torus: rows * cols)");
  genCommand->add_option("--rows", gen->generator.rows, "torus: rows");
  genCommand->add_option("--cols", gen->generator.cols, "torus: columns");
  genCommand->add_option("-k,--degree", gen->generator.degree, "random-regular: degree")
      ->capture_default_str();
  genCommand
      ->add_option("-p,--probability", gen->generator.probability, "erdos-renyi: edge probability")
      ->capture_default_str();
  genCommand->add_option("--seed", gen->generator.seed, "random-regular, erdos-renyi: seed")
      ->capture_default_str();
  genCommand->add_option("--mixing", gen->mixing, "Mixing weights")
      ->check(CLI::IsMember({"metropolis", "max-degree", "uniform"}))
      ->capture_default_str();
  genCommand->add_option("--name", gen->generator.name, "Topology name (default KIND + N)");
  genCommand->add_option("--host", gen->host, "Host of every node (default 127.0.0.1)");
  genCommand->add_option("--hosts", gen->hosts, "Hosts, node i on hosts[i % H]")->delimiter(',');
  genCommand
      ->add_option("--base-port", gen->generator.basePort, "Port of the first node on each host")
      ->capture_default_str();
  genCommand->add_option("-o,--output", gen->output, "Output file, - for stdout")
      ->capture_default_str();
  genCommand->callback([gen, &action] { action = [gen] { return runGen(*gen); }; });

  auto place = std::make_shared<PlaceOptions>();
  CLI::App* placeCommand = topology->add_subcommand(
      "place", "Rewrite the endpoints: node I at the host on line I of --hosts, port P + I");
  placeCommand->add_option("topology", place->topology, "Topology file")->required();
  placeCommand
      ->add_option("--hosts", place->hosts, "File with one host per line, node I's on line I")
      ->required();
  placeCommand->add_option("--port", place->port, "Node 0's port P")
      ->capture_default_str()
      ->check(CLI::Range(1, 65535));
  placeCommand->add_option("-o,--output", place->output, "Output file, - for stdout")
      ->capture_default_str();
  placeCommand->callback([place, &action] { action = [place] { return runPlace(*place); }; });

  auto checkFile = std::make_shared<std::string>();
  CLI::App* check = topology->add_subcommand(
      "check", "Validate a topology file; exit 78 with the error if invalid");
  check->add_option("file", *checkFile, "Topology file, - for stdin")->required();
  check->callback([checkFile, &action] { action = [checkFile] { return runCheck(*checkFile); }; });

  auto infoFile = std::make_shared<std::string>();
  auto infoJson = std::make_shared<bool>(false);
  CLI::App* info =
      topology->add_subcommand("info", "Degrees, diameter, spectral gap and hash of a topology");
  info->add_option("file", *infoFile, "Topology file, - for stdin")->required();
  info->add_flag("--json", *infoJson, "Machine-readable output");
  info->callback([infoFile, infoJson, &action] {
    action = [infoFile, infoJson] { return runInfo(*infoFile, *infoJson); };
  });
}

}  // namespace consensusd::cli
