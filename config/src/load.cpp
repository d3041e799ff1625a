#include "consensusd/config/load.hpp"

#include <grp.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "consensusd/config/params.hpp"
#include "consensusd/topology/yaml_io.hpp"

namespace consensusd::config {
namespace {

using schema::InputError;
using schema::MapReader;
using schema::NodeKind;
using schema::Source;
using schema::YamlNode;

std::string sectionOf(const std::string& path) {
  return path.substr(0, path.find('.'));
}
std::string leafOf(const std::string& path) {
  return path.substr(path.find('.') + 1);
}

const Key* findKey(const std::string& path) {
  for (const Key& key : schemaKeys()) {
    if (key.path == path) return &key;
  }
  return nullptr;
}

std::vector<std::string> sectionNames() {
  std::vector<std::string> names;
  for (const Key& key : schemaKeys()) {
    const std::string section = sectionOf(key.path);
    if (std::find(names.begin(), names.end(), section) == names.end()) names.push_back(section);
  }
  return names;
}

// "did you mean": a close key in the same section, else the same key name in
// another section ("consensus.batch_size" -> "train.batch_size").
std::string suggestionFor(const std::string& section, const std::string& leaf) {
  std::vector<std::string> leaves;
  for (const Key& key : schemaKeys()) {
    if (sectionOf(key.path) == section) leaves.push_back(leafOf(key.path));
  }
  if (std::string close = schema::closestMatch(leaf, leaves); !close.empty()) return close;
  for (const Key& key : schemaKeys()) {
    if (leafOf(key.path) == leaf) return key.path;
  }
  return {};
}

[[noreturn]] void unknownKey(const Source& source, const YamlNode& at, const std::string& section,
                             const std::string& leaf) {
  std::string message = "unknown key '" + leaf + "'";
  if (const std::string hint = suggestionFor(section, leaf); !hint.empty()) {
    message += ", did you mean '" + hint + "'?";
  }
  schema::fail(source, at, message, section + "." + leaf);
}

// Why the daemon could not make `folder` (none if it is one, or can be
// made): its nearest existing ancestor must be a folder the daemon may
// write in, on a real file system (not /proc or /sys).
std::optional<std::string> cannotMakeFolder(const std::filesystem::path& folder) {
  if (folder.empty()) return std::nullopt;
  std::error_code error;
  std::filesystem::path at = folder;
  while (at.has_relative_path() && !std::filesystem::exists(at, error)) at = at.parent_path();
  if (!std::filesystem::is_directory(at, error)) return "'" + at.string() + "' is not a folder";
  if (at == folder) return std::nullopt;
  struct statfs system {};
  if (::statfs(at.c_str(), &system) == 0 &&
      (system.f_type == PROC_SUPER_MAGIC || system.f_type == SYSFS_MAGIC))
    return "cannot make folder '" + folder.string() + "' in '" + at.string() +
           "', a kernel file system";
  if (::access(at.c_str(), W_OK | X_OK) != 0)
    return "cannot make folder '" + folder.string() + "' in '" + at.string() +
           "': " + std::strerror(errno);
  return std::nullopt;
}

[[noreturn]] void failAt(const Origins& origins, const std::string& path,
                         const std::string& message) {
  const auto it = origins.find(path);
  if (it == origins.end()) throw InputError(origins.at("").file, {}, message, path);
  throw InputError(it->second.file, it->second.position, message, path);
}

void applyOverride(NodeConfig& config, Origins& origins, const std::string& assignment) {
  const std::size_t equals = assignment.find('=');
  const std::string source = "--set " + assignment;
  if (equals == std::string::npos || equals == 0) {
    throw InputError(source, {1, 1}, "expected --set key.path=value");
  }
  const std::string path = assignment.substr(0, equals);
  const std::string value = assignment.substr(equals + 1);
  const Key* key = findKey(path);
  if (key == nullptr) {
    std::vector<std::string> paths;
    for (const Key& k : schemaKeys()) paths.push_back(k.path);
    std::string message = "unknown key '" + path + "'";
    if (const std::string close = schema::closestMatch(path, paths); !close.empty()) {
      message += ", did you mean '" + close + "'?";
    }
    throw InputError(source, {1, 1}, message, path);
  }
  YamlNode node = schema::parseYaml(value, source);
  if (value.empty()) {  // `--set status.http=` means the empty string
    node.kind = NodeKind::Scalar;
    node.quoted = true;
  }
  // Positions inside the value, shifted past "key.path=".
  node.position = {1, static_cast<int>(equals) + 2};
  key->read(config, Source{source}, node);
  origins[path] = {source, node.position};
}

bool isLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

void checkLocal(const NodeConfig& config, const Origins& origins) {
  for (const char* required : {"node.id", "topology.file"}) {
    if (origins.count(required) == 0) {
      const std::string path = required;
      const std::string section = sectionOf(path);
      const auto it = origins.find(section);
      const Origin& where = it != origins.end() ? it->second : origins.at("");
      throw InputError(where.file, where.position, "missing key '" + leafOf(path) + "'", path);
    }
  }
  const NodeConfig::Consensus& consensus = config.consensus;
  if (consensus.maxResponders != 0 && consensus.minResponders > consensus.maxResponders) {
    failAt(origins, "consensus.min_responders",
           "min_responders (" + std::to_string(consensus.minResponders) +
               ") is greater than max_responders (" + std::to_string(consensus.maxResponders) +
               ")");
  }
  if (consensus.compression != "none" && consensus.robust != "none") {
    failAt(origins, "consensus.compression",
           "compression mixes public copies, which consensus.robust (" + consensus.robust +
               ") does not: choose one");
  }
  if (consensus.compression != "none" && consensus.mixRound == "same") {
    failAt(origins, "consensus.mix_round",
           "compression keeps one copy of each neighbour, its newest: mix_round: same needs "
           "consensus.compression: none");
  }
  if (config.train.outer == "nesterov" && config.train.momentum > 0) {
    failAt(origins, "train.momentum",
           "outer: nesterov keeps its own momentum (train.outer_momentum): train.momentum must "
           "be 0");
  }
  if (policySpec(config).kind == consensus::PolicyKind::Timeout &&
      consensus.timeoutMs >= consensus.hardDeadlineMs) {
    failAt(origins, "consensus.timeout_ms", "timeout_ms must be below consensus.hard_deadline_ms");
  }
  if (config.straggler.toRound != 0 && config.straggler.fromRound > config.straggler.toRound) {
    failAt(origins, "straggler.from_round",
           "from_round (" + std::to_string(config.straggler.fromRound) + ") is after to_round (" +
               std::to_string(config.straggler.toRound) + ")");
  }
  if (!isExternal(config) && config.model.dimension == kAutoDimension) {
    failAt(origins, "model.dimension", "dimension: auto needs model.kind: external (a trainer's)");
  }
  if (!isExternal(config) && config.model.dtype == kAuto) {
    failAt(origins, "model.dtype", "dtype: auto needs model.kind: external (a trainer's)");
  }
  if (!hasModel(config) && config.model.dimension < 1 && config.model.dimension != kAutoDimension) {
    failAt(origins, "model.kind", "kind: " + config.model.kind + " needs model.dimension >= 1");
  }
  if (data::parseName(data::kModelKinds, config.model.kind) == data::ModelKind::Mlp &&
      config.model.hidden.empty()) {
    failAt(origins, "model.hidden", "kind: mlp needs 1 or 2 hidden layer widths");
  }
  if (config.security.curve && config.security.secretKeyFile.empty()) {
    failAt(origins, "security.curve", "security.curve needs security.secret_key_file");
  }
  if (const std::string& http = config.status.http; !http.empty()) {
    const std::size_t colon = http.rfind(':');
    const std::string port = colon == std::string::npos ? "" : http.substr(colon + 1);
    const bool numeric =
        !port.empty() && port.size() <= 5 &&
        std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!numeric || std::stol(port) > 65535)
      failAt(origins, "status.http", "expected HOST:PORT, got '" + http + "'");
    if (!config.status.httpRemote && !isLoopbackHost(http.substr(0, colon))) {
      failAt(origins, "status.http",
             "the HTTP endpoint has no authentication: bind it to loopback (127.0.0.1), or set "
             "status.http_remote: true where a network policy restricts who reaches it");
    }
  }
}

// What the wait policy asks of this node's neighbourhood: checked at load
// and again for every change at run time (set-policy).
void checkDegree(const NodeConfig& config, std::size_t inDegree, const Origins& origins) {
  const auto degree = static_cast<std::int64_t>(inDegree);
  const NodeConfig::Consensus& consensus = config.consensus;
  if (degree > 0 && consensus.minResponders > degree) {
    failAt(origins, "consensus.min_responders",
           "min_responders (" + std::to_string(consensus.minResponders) +
               ") exceeds this node's degree (" + std::to_string(degree) + ")");
  }
  if (consensus.maxResponders > degree) {
    failAt(origins, "consensus.max_responders",
           "max_responders (" + std::to_string(consensus.maxResponders) +
               ") exceeds this node's degree (" + std::to_string(degree) + ")");
  }
  if (policySpec(config).kind == consensus::PolicyKind::Static &&
      consensus.backups > degree - std::min(consensus.minResponders, degree)) {
    failAt(origins, "consensus.backups",
           "backups (" + std::to_string(consensus.backups) + ") leave fewer than min_responders (" +
               std::to_string(consensus.minResponders) + ") of this node's " +
               std::to_string(degree) + " neighbours");
  }
}

NodeConfig readTree(const YamlNode& root, const std::string& fileName,
                    const std::vector<std::string>& overrides, Origins& origins) {
  const Source source{fileName};
  origins[""] = {fileName, {1, 1}};
  if (root.kind == NodeKind::Null) schema::fail(source, root, "config file is empty", "");
  const MapReader top(source, root, "");
  const std::vector<std::string> sections = sectionNames();
  top.rejectUnknown(sections);
  NodeConfig config;
  for (const auto& [sectionKey, sectionNode] : root.entries) {
    const std::string& section = sectionKey.scalar;
    origins[section] = {fileName, sectionKey.position};
    if (sectionNode.kind == NodeKind::Null) continue;  // `train:` with nothing under it
    const MapReader map(source, sectionNode, section);
    for (const auto& [key, value] : sectionNode.entries) {
      const Key* schemaKey = findKey(section + "." + key.scalar);
      if (schemaKey == nullptr) unknownKey(source, key, section, key.scalar);
      schemaKey->read(config, source, value);
      origins[schemaKey->path] = {fileName, value.position};
    }
  }
  for (const std::string& assignment : overrides) applyOverride(config, origins, assignment);
  checkLocal(config, origins);
  return config;
}

}  // namespace

NodeConfig readConfig(std::string_view text, const std::string& fileName,
                      const std::vector<std::string>& overrides, Origins* origins) {
  Origins local;
  return readTree(schema::parseYaml(text, fileName), fileName, overrides,
                  origins ? *origins : local);
}

NodeConfig reconfigure(const NodeConfig& running, const std::vector<std::string>& overrides,
                       std::size_t inDegree) {
  Origins origins;
  const std::string text = toYaml(running);
  NodeConfig config =
      readTree(schema::parseYaml(text, kRunningConfig), kRunningConfig, overrides, origins);
  checkDegree(config, inDegree, origins);
  return config;
}

AppliedTopology checkTopology(const NodeConfig& running, const topology::NodeSpec& self,
                              std::string_view text, const std::string& fileName) {
  topology::Topology graph = topology::parseTopology(text, fileName);
  const std::optional<std::size_t> index = graph.indexOf(running.node.id);
  if (!index) {
    throw InputError(fileName, {1, 1},
                     "node '" + running.node.id + "' is not in this topology (" +
                         std::to_string(graph.size()) + " nodes, " + graph.node(0).id + ".." +
                         graph.nodes().back().id +
                         "): a node leaves a cluster by stopping, not by applying a graph "
                         "without it",
                     "nodes");
  }
  const topology::NodeSpec& now = graph.node(*index);
  const auto fail = [&](const std::string& key, const std::string& message) {
    throw InputError(fileName, now.at, message,
                     "nodes[" + std::to_string(*index) + "]" + (key.empty() ? "" : "." + key));
  };
  if (running.node.bind.empty() && now.endpoint != self.endpoint)
    fail("endpoint", "node '" + running.node.id + "' runs at '" + self.endpoint +
                         "': its endpoint changes only with a restart");
  if (running.security.curve) {
    for (const topology::NodeSpec& node : graph.nodes()) {
      if (node.publicKey.empty())
        throw InputError(
            fileName, node.at,
            "security.curve needs a public_key for every node; '" + node.id + "' has none",
            "nodes[" + std::to_string(*graph.indexOf(node.id)) + "].public_key");
    }
    if (now.publicKey != self.publicKey)
      fail("public_key", "node '" + running.node.id +
                             "' runs with another key: its key changes only with a restart");
  }
  try {
    checkDegree(running, graph.inNeighbors(*index).size(), Origins{{"", {kRunningConfig, {}}}});
  } catch (const InputError& e) {
    fail("", "node '" + running.node.id + "' has " +
                 std::to_string(graph.inNeighbors(*index).size()) +
                 " in-neighbours here, too few for its running config: " + e.message() + " (" +
                 e.keyPath() + ")");
  }
  return {std::move(graph), *index};
}

namespace {

// security.curve: the node's key pair, checked against the topology's public keys.
std::optional<CurveKeyPair> curveOf(const NodeConfig& config, const topology::Topology& graph,
                                    std::size_t index, const Origins& origins) {
  namespace fs = std::filesystem;
  std::error_code error;
  std::optional<CurveKeyPair> curve;
  if (config.security.curve) {
    for (const topology::NodeSpec& node : graph.nodes()) {
      if (node.publicKey.empty()) {
        failAt(origins, "security.curve",
               "security.curve needs a public_key for every node; '" + node.id + "' in " +
                   config.topology.file + " has none");
      }
    }
    const std::string& keyFile = config.security.secretKeyFile;
    if (!fs::is_regular_file(keyFile, error)) {
      failAt(origins, "security.secret_key_file", "key file '" + keyFile + "' does not exist");
    }
    curve = readKeyFile(keyFile);
    if (curve->publicKey != graph.node(index).publicKey) {
      failAt(origins, "security.secret_key_file",
             "the key pair in '" + keyFile + "' does not belong to node '" + config.node.id +
                 "': its public key differs from the node's public_key in " + config.topology.file);
    }
  }
  return curve;
}

// The trainer's group and socket (beside the status socket unless set),
// checked where a trainer attaches (model.kind: external) before any bind.
std::optional<std::uint32_t> settleTrainer(NodeConfig& config, const Origins& origins) {
  namespace fs = std::filesystem;
  std::error_code error;
  std::optional<std::uint32_t> trainerGroup;
  if (!config.trainer.group.empty()) {
    const group* entry = ::getgrnam(config.trainer.group.c_str());
    if (entry == nullptr)
      failAt(origins, "trainer.group", "no group named '" + config.trainer.group + "'");
    trainerGroup = entry->gr_gid;
  }
  const bool defaultTrainerSocket = config.trainer.socket.empty();
  if (defaultTrainerSocket) {
    const std::string& status = config.status.socket;
    const bool dotSock = status.size() > 5 && status.ends_with(".sock");
    config.trainer.socket =
        (dotSock ? status.substr(0, status.size() - 5) : status) + ".trainer.sock";
  }
  if (isExternal(config)) {
    // Found here, not when the daemon binds it (that would be exit 69, after the ports).
    const std::string& trainerSocket = config.trainer.socket;
    const std::string key = defaultTrainerSocket ? "status.socket" : "trainer.socket";
    const std::string what = "trainer socket '" + trainerSocket + "'" +
                             (defaultTrainerSocket ? " (beside status.socket)" : "");
    const fs::path socketFolder = fs::path(trainerSocket).parent_path();
    if (!socketFolder.empty() && !fs::is_directory(socketFolder, error))
      failAt(origins, key, what + ": folder '" + socketFolder.string() + "' does not exist");
    if (trainerSocket.size() >= sizeof(sockaddr_un::sun_path))
      failAt(origins, key,
             what + ": a Unix socket path has at most " +
                 std::to_string(sizeof(sockaddr_un::sun_path) - 1) + " bytes");
  }
  return trainerGroup;
}

}  // namespace

LoadedConfig loadConfig(const std::string& path, const std::vector<std::string>& overrides) {
  namespace fs = std::filesystem;
  Origins origins;
  NodeConfig config = readTree(schema::loadYamlFile(path), path, overrides, origins);

  const fs::path folder = fs::path(path).parent_path();
  for (const Key& key : schemaKeys()) {
    if (!key.pathField) continue;
    std::string& value = key.pathField(config);
    if (!value.empty() && !fs::path(value).is_absolute())
      value = (folder / value).lexically_normal().string();
  }

  std::error_code error;
  if (!fs::is_regular_file(config.topology.file, error)) {
    failAt(origins, "topology.file", "topology file '" + config.topology.file + "' does not exist");
  }
  topology::Topology graph = topology::loadTopology(config.topology.file);
  const std::optional<std::size_t> index = graph.indexOf(config.node.id);
  if (!index) {
    failAt(origins, "node.id",
           "node '" + config.node.id + "' is not in topology " + config.topology.file + " (" +
               std::to_string(graph.size()) + " nodes, " + graph.node(0).id + ".." +
               graph.nodes().back().id + ")");
  }
  // What the topology file says of this node is reported at its entry there.
  const auto failInTopology = [&](const std::string& key, const std::string& message) {
    throw InputError(config.topology.file, graph.node(*index).at, message,
                     "nodes[" + std::to_string(*index) + "]." + key);
  };
  // An ipc:// endpoint this node binds needs its folder: found here, not at bind time.
  const std::string bindAt =
      config.node.bind.empty() ? graph.node(*index).endpoint : config.node.bind;
  if (bindAt.rfind("ipc://", 0) == 0) {
    const fs::path socketFolder = fs::path(bindAt.substr(6)).parent_path();
    if (!socketFolder.empty() && !fs::is_directory(socketFolder, error)) {
      const std::string why =
          "endpoint '" + bindAt + "': folder '" + socketFolder.string() + "' does not exist";
      if (config.node.bind.empty()) failInTopology("endpoint", why);
      failAt(origins, "node.bind", why);
    }
  }
  checkDegree(config, graph.inNeighbors(*index).size(), origins);
  std::optional<CurveKeyPair> curve = curveOf(config, graph, *index, origins);
  const bool statusFromTopology =
      config.status.socket.empty() && !graph.node(*index).status.empty();
  if (config.status.socket.empty()) {
    const std::string& fromTopology = graph.node(*index).status;
    config.status.socket =
        fromTopology.empty() ? "/run/consensusd/" + config.node.id + ".sock" : fromTopology;
  }

  const std::optional<std::uint32_t> trainerGroup = settleTrainer(config, origins);
  // The daemon makes the status socket's folder if it is missing: one it
  // cannot make is found here (78), not at bind time (69).
  if (const auto why = cannotMakeFolder(fs::path(config.status.socket).parent_path())) {
    const std::string message = "status socket '" + config.status.socket + "': " + *why;
    if (statusFromTopology) failInTopology("status", message);
    failAt(origins, "status.socket", message);
  }
  if (config.checkpoint.dir.empty())
    config.checkpoint.dir = "/var/lib/consensusd/" + config.node.id;
  return {std::move(config), std::move(graph), *index, std::move(curve), trainerGroup};
}

CurveKeyPair readKeyFile(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    throw InputError(path, {}, "cannot read the key file: " + std::string(std::strerror(errno)));
  }
  if ((info.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(info.st_mode & 07777));
    throw InputError(path, {},
                     std::string("the secret key is readable by other users (mode ") + mode +
                         "): chmod 600 " + path);
  }
  const Source source{path};
  const YamlNode tree = schema::loadYamlFile(path);
  const MapReader map(source, tree, "");
  map.rejectUnknown({"node", "public_key", "secret_key"});
  CurveKeyPair keys;
  for (auto [key, field] :
       {std::pair{"public_key", &keys.publicKey}, std::pair{"secret_key", &keys.secretKey}}) {
    const YamlNode& node = map.require(key);
    *field = schema::readString(source, node, key);
    if (!topology::isZ85Key(*field)) {
      schema::fail(source, node,
                   std::string(key) + " must be 40 Z85 characters (consensusctl keygen)", key);
    }
  }
  return keys;
}

std::string keyFileText(const std::string& node, const CurveKeyPair& keys) {
  return "# CurveZMQ key pair of consensusd node " + node +
         " (consensusctl keygen).\n"
         "# The secret key must stay secret: mode 0600, never in the topology file.\n"
         "node: \"" +
         node + "\"\npublic_key: \"" + keys.publicKey + "\"\nsecret_key: \"" + keys.secretKey +
         "\"\n";
}

std::string toYaml(const NodeConfig& config) {
  std::string out;
  std::string section;
  for (const Key& key : schemaKeys()) {
    if (sectionOf(key.path) != section) {
      section = sectionOf(key.path);
      out += section + ":\n";
    }
    out += "  " + leafOf(key.path) + ": " + key.show(config) + "\n";
  }
  return out;
}

}  // namespace consensusd::config
