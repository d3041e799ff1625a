#include "consensusd/topology/yaml_io.hpp"

#include <yaml-cpp/yaml.h>

#include <charconv>

namespace consensusd::topology {
namespace {

using schema::MapReader;
using schema::NodeKind;
using schema::Source;
using schema::YamlNode;

const std::vector<std::string> kTopKeys{"name",  "directed", "mixing", "doubly_stochastic",
                                        "nodes", "edges"};
const std::vector<std::string> kNodeKeys{"id", "endpoint", "status", "public_key", "self_weight"};
const std::vector<std::string> kEdgeKeys{"from", "to", "weight"};

const YamlNode& requireList(const Source& source, const MapReader& map, std::string_view key) {
  const YamlNode& node = map.require(key);
  if (node.kind != NodeKind::Sequence) {
    schema::fail(source, node, "expected a list, got " + schema::describe(node),
                 map.childPath(key));
  }
  return node;
}

NodeSpec readNode(const Source& source, const YamlNode& item, const std::string& path) {
  const MapReader map(source, item, path);
  map.rejectUnknown(kNodeKeys);
  NodeSpec node;
  node.at = item.position;
  node.id = schema::readString(source, map.require("id"), map.childPath("id"));
  node.endpoint = schema::readString(source, map.require("endpoint"), map.childPath("endpoint"));
  if (const YamlNode* status = map.find("status")) {
    node.status = schema::readString(source, *status, map.childPath("status"));
  }
  if (const YamlNode* key = map.find("public_key")) {
    node.publicKey = schema::readString(source, *key, map.childPath("public_key"));
    if (!isZ85Key(node.publicKey)) {
      schema::fail(source, *key, "public_key must be 40 Z85 characters (consensusctl keygen)",
                   map.childPath("public_key"));
    }
  }
  if (const YamlNode* weight = map.find("self_weight")) {
    node.selfWeight =
        schema::readDouble(source, *weight, map.childPath("self_weight"), -1e300, 1e300);
  }
  return node;
}

EdgeSpec readEdge(const Source& source, const YamlNode& item, const std::string& path) {
  EdgeSpec edge;
  edge.at = item.position;
  if (item.kind == NodeKind::Sequence) {
    if (item.items.size() != 2) {
      schema::fail(
          source, item,
          "an edge list needs exactly 2 node ids, got " + std::to_string(item.items.size()), path);
    }
    edge.from = schema::readString(source, item.items[0], path + "[0]");
    edge.to = schema::readString(source, item.items[1], path + "[1]");
    return edge;
  }
  if (item.kind != NodeKind::Map) {
    schema::fail(source, item,
                 "expected [from, to] or {from, to, weight}, got " + schema::describe(item), path);
  }
  const MapReader map(source, item, path);
  map.rejectUnknown(kEdgeKeys);
  edge.from = schema::readString(source, map.require("from"), map.childPath("from"));
  edge.to = schema::readString(source, map.require("to"), map.childPath("to"));
  if (const YamlNode* weight = map.find("weight")) {
    edge.weight = schema::readDouble(source, *weight, map.childPath("weight"), -1e300, 1e300);
  }
  return edge;
}

std::string shortest(double value) {
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return {buffer, result.ptr};
}

}  // namespace

TopologySpec readTopologySpec(const Source& source, const YamlNode& root) {
  if (root.kind == NodeKind::Null) schema::fail(source, root, "topology file is empty", "");
  const MapReader map(source, root, "");
  map.rejectUnknown(kTopKeys);
  TopologySpec spec;
  if (const YamlNode* name = map.find("name"))
    spec.name = schema::readString(source, *name, "name");
  if (const YamlNode* directed = map.find("directed"))
    spec.directed = schema::readBool(source, *directed, "directed");
  if (const YamlNode* mixing = map.find("mixing")) {
    spec.mixing =
        *parseMixingRule(schema::readChoice(source, *mixing, "mixing", mixingRuleNames()));
  }
  if (const YamlNode* doubly = map.find("doubly_stochastic")) {
    spec.doublyStochastic = schema::readBool(source, *doubly, "doubly_stochastic");
  }
  const YamlNode& nodes = requireList(source, map, "nodes");
  spec.nodesAt = nodes.position;
  for (std::size_t i = 0; i < nodes.items.size(); ++i) {
    spec.nodes.push_back(readNode(source, nodes.items[i], "nodes[" + std::to_string(i) + "]"));
  }
  const YamlNode& edges = requireList(source, map, "edges");
  spec.edgesAt = edges.position;
  for (std::size_t i = 0; i < edges.items.size(); ++i) {
    spec.edges.push_back(readEdge(source, edges.items[i], "edges[" + std::to_string(i) + "]"));
  }
  return spec;
}

Topology parseTopology(std::string_view text, const std::string& fileName) {
  const Source source{fileName};
  return Topology::fromSpec(readTopologySpec(source, schema::parseYaml(text, fileName)), fileName);
}

Topology loadTopology(const std::string& path) {
  const Source source{path == "-" ? "<stdin>" : path};
  return Topology::fromSpec(readTopologySpec(source, schema::loadYamlFile(path)), source.file);
}

std::string toYaml(const Topology& topology) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << topology.name();
  out << YAML::Key << "directed" << YAML::Value << topology.directed();
  out << YAML::Key << "mixing" << YAML::Value << toString(topology.mixing());
  if (topology.doublyStochastic()) out << YAML::Key << "doubly_stochastic" << YAML::Value << true;
  out << YAML::Key << "nodes" << YAML::Value << YAML::BeginSeq;
  for (const NodeSpec& node : topology.nodes()) {
    out << YAML::Flow << YAML::BeginMap;
    out << YAML::Key << "id" << YAML::Value << node.id;
    out << YAML::Key << "endpoint" << YAML::Value << YAML::DoubleQuoted << node.endpoint;
    if (!node.status.empty())
      out << YAML::Key << "status" << YAML::Value << YAML::DoubleQuoted << node.status;
    if (!node.publicKey.empty()) {
      out << YAML::Key << "public_key" << YAML::Value << YAML::DoubleQuoted << node.publicKey;
    }
    if (node.selfWeight)
      out << YAML::Key << "self_weight" << YAML::Value << shortest(*node.selfWeight);
    out << YAML::EndMap;
  }
  out << YAML::EndSeq;
  out << YAML::Key << "edges" << YAML::Value << YAML::BeginSeq;
  for (const Edge& edge : topology.edges()) {
    const std::string& from = topology.node(edge.from).id;
    const std::string& to = topology.node(edge.to).id;
    if (edge.weight) {
      out << YAML::Flow << YAML::BeginMap << YAML::Key << "from" << YAML::Value << from << YAML::Key
          << "to" << YAML::Value << to << YAML::Key << "weight" << YAML::Value
          << shortest(*edge.weight) << YAML::EndMap;
    } else {
      out << YAML::Flow << YAML::BeginSeq << from << to << YAML::EndSeq;
    }
  }
  out << YAML::EndSeq;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace consensusd::topology
