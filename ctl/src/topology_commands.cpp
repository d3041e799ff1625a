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

int runGen(GenOptions options) {
  if (!options.host.empty() && !options.hosts.empty()) {
    throw topology::GeneratorError("give --host or --hosts, not both");
  }
  if (!options.host.empty()) options.generator.hosts = {options.host};
  if (!options.hosts.empty()) options.generator.hosts = options.hosts;
  options.generator.mixing = *topology::parseMixingRule(options.mixing);
  const topology::Topology graph =
      topology::Topology::fromSpec(topology::generate(options.generator), "<generated>");
  const std::string text = topology::toYaml(graph);
  if (options.output == "-") {
    std::cout << text;
    return kExitOk;
  }
  std::ofstream out(options.output, std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw std::runtime_error("cannot write " + options.output);
  return kExitOk;
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
