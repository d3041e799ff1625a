#pragma once
// Loading a node config: strict schema (unknown keys, types, ranges), then
// `--set key.path=value` overrides through the same checks, then
// cross-checks against the topology. Every failure is a schema::InputError
// naming file:line:col and key path; callers exit with schema::kExitConfig.

#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "consensusd/config/node_config.hpp"
#include "consensusd/schema/reader.hpp"
#include "consensusd/topology/topology.hpp"

namespace consensusd::config {

// One documented key of the schema.
struct Key {
  std::string path;   // "train.batch_size"
  std::string type;   // "integer", "number", "string", "boolean", "path", ...
  std::string range;  // "[1, 65536]", "iid | contiguous | ..."
  std::string doc;
  std::function<void(NodeConfig&, const schema::Source&, const schema::YamlNode&)> read;
  std::function<std::string(const NodeConfig&)> show;  // current value as YAML text
  // Set only for file paths: relative values resolve against the config's folder.
  std::function<std::string&(NodeConfig&)> pathField;
};

const std::vector<Key>& schemaKeys();

// Every key as a Markdown table row: key, type, default, range, meaning.
std::string schemaTable();

// Where each key got its value (file or --set), for cross-check errors.
struct Origin {
  std::string file;
  schema::Position position;
};
using Origins = std::map<std::string, Origin>;

// Shape, types, ranges and the checks that need no other file.
NodeConfig readConfig(std::string_view text, const std::string& fileName,
                      const std::vector<std::string>& overrides = {}, Origins* origins = nullptr);

// A node's CurveZMQ key pair (Z85), as `consensusctl keygen` writes it.
struct CurveKeyPair {
  std::string publicKey;
  std::string secretKey;
};

struct LoadedConfig {
  NodeConfig config;
  topology::Topology topology;
  std::size_t nodeIndex;
  std::optional<CurveKeyPair> curve;          // with security.curve: read from secret_key_file
  std::optional<std::uint32_t> trainerGroup;  // trainer.group's gid, when set
};

// A key file: YAML with `node`, `public_key` and `secret_key`. Errors (a
// file others may read, a malformed key) name the file and key.
CurveKeyPair readKeyFile(const std::string& path);
// The same as YAML text; the header comment says it is secret.
std::string keyFileText(const std::string& node, const CurveKeyPair& keys);

// readConfig, then relative paths resolved against the config's folder, the
// topology loaded and cross-checked, and node-dependent defaults filled in.
LoadedConfig loadConfig(const std::string& path, const std::vector<std::string>& overrides = {});

// The running config with `overrides` applied (set-policy at run time),
// checked as loadConfig checks a file, against the node's in-degree too.
// Errors name "<running config>" and the key.
inline constexpr const char* kRunningConfig = "<running config>";
NodeConfig reconfigure(const NodeConfig& running, const std::vector<std::string>& overrides,
                       std::size_t inDegree);

// A topology applied to a running node (`consensusctl apply`, SIGHUP),
// checked as loadConfig checks the file at start and against what cannot
// change while the node runs: the node is in it, at the endpoint it bound
// and (with CURVE) with its key, every node has a key, and the wait policy
// fits the node's degree there. Errors name the file, line and key.
struct AppliedTopology {
  topology::Topology graph;
  std::size_t nodeIndex;
};
AppliedTopology checkTopology(const NodeConfig& running, const topology::NodeSpec& self,
                              std::string_view text, const std::string& fileName);

// The effective config as YAML (every key, defaults included).
std::string toYaml(const NodeConfig& config);

}  // namespace consensusd::config
