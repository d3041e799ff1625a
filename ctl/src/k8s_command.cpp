#include "k8s_command.hpp"

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <sstream>

#include "consensusd/daemon/command_line.hpp"
#include "consensusd/topology/yaml_io.hpp"
#include "generated_files.hpp"
#include "straggler_flags.hpp"

namespace consensusd::cli {
namespace {

namespace fs = std::filesystem;

struct K8sOptions {
  std::string topology;
  std::string output = "k8s";
  std::string image = "consensusd:latest";
  std::string nameSpace = "consensusd";
  std::string nodeSet = "consensus";
  std::string clusterDomain = "cluster.local";
  int port = 7000;
  int metricsPort = 9100;
  std::string cpu = "1";
  std::string memory = "1Gi";
  std::string storage = "1Gi";
  std::string storageClass;             // "": the cluster's default class
  std::string curveSecret;              // "": no CurveZMQ
  std::int64_t uid = 10001;             // the daemon's user and group in every pod
  std::vector<std::string> sets;        // KEY=VALUE for every node
  std::vector<std::string> stragglers;  // NODE=KEY=VALUE[,KEY=VALUE...]
};

// Where a node's files sit inside its pod.
constexpr const char* kConfigDir = "/etc/consensusd";
constexpr const char* kRunDir = "/run/consensusd";
constexpr const char* kKeysDir = "/etc/consensusd-keys";

std::string configName(std::size_t index) {
  return "node-" + std::to_string(index) + ".yaml";
}

// RFC 1123 labels: the StatefulSet's pods are NAME-ORDINAL, its Service NAME.
void checkName(const std::string& flag, const std::string& value, std::size_t maxLength) {
  static const std::regex label("[a-z0-9]([-a-z0-9]*[a-z0-9])?");
  if (value.size() > maxLength || !std::regex_match(value, label)) {
    throw UsageError(flag + ": '" + value + "' is not a Kubernetes name (lowercase letters, " +
                     "digits and '-', at most " + std::to_string(maxLength) + " characters)");
  }
}

// Every pod reaches node i at its stable DNS name under the headless Service.
topology::Topology withPodEndpoints(const topology::Topology& given, const K8sOptions& o) {
  topology::TopologySpec spec = topology::toSpec(given);
  for (std::size_t i = 0; i < spec.nodes.size(); ++i) {
    topology::NodeSpec& node = spec.nodes[i];
    node.endpoint = "tcp://" + o.nodeSet + "-" + std::to_string(i) + "." + o.nodeSet + "." +
                    o.nameSpace + ".svc." + o.clusterDomain + ":" + std::to_string(o.port);
    node.status = std::string(kRunDir) + "/status.sock";
  }
  return topology::Topology::fromSpec(std::move(spec), given.name());
}

YAML::Node labelsOf(const K8sOptions& o) {
  YAML::Node labels;
  labels["app.kubernetes.io/name"] = "consensusd";
  labels["app.kubernetes.io/instance"] = str(o.nodeSet);
  return labels;
}

// An object of the node set: apiVersion, kind, and metadata with its labels.
YAML::Node object(const char* apiVersion, const char* kind, const std::string& name,
                  const K8sOptions& o) {
  YAML::Node node;
  node["apiVersion"] = apiVersion;
  node["kind"] = kind;
  node["metadata"]["name"] = str(name);
  node["metadata"]["namespace"] = str(o.nameSpace);
  node["metadata"]["labels"] = labelsOf(o);
  return node;
}

// A ConfigMap's files as literal blocks, so they read as the files they are.
std::string configMap(const K8sOptions& o, const std::map<std::string, std::string>& files) {
  const YAML::Node head = object("v1", "ConfigMap", o.nodeSet + "-config", o);
  std::string out = emit(head) + "data:\n";
  for (const auto& [name, text] : files) {
    out += "  " + name + ": |\n";
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);)
      out += line.empty() ? "\n" : "    " + line + "\n";
  }
  return out;
}

YAML::Node headlessService(const K8sOptions& o) {
  YAML::Node service = object("v1", "Service", o.nodeSet, o);
  service["spec"]["clusterIP"] = "None";
  // Peers resolve each other before they are ready: a node is ready only
  // once it trains, and it cannot train before it reaches its neighbours.
  service["spec"]["publishNotReadyAddresses"] = true;
  service["spec"]["selector"] = labelsOf(o);
  for (const auto& [name, number] : {std::pair{"consensus", o.port}, {"metrics", o.metricsPort}}) {
    YAML::Node port;
    port["name"] = name;
    port["port"] = number;
    port["targetPort"] = name;
    service["spec"]["ports"].push_back(port);
  }
  return service;
}

// Estimates come only from the node set's own pods; probes and Prometheus
// read the metrics port from anywhere in the cluster (read-only GETs).
YAML::Node networkPolicy(const K8sOptions& o) {
  YAML::Node policy = object("networking.k8s.io/v1", "NetworkPolicy", o.nodeSet, o);
  policy["spec"]["podSelector"]["matchLabels"] = labelsOf(o);
  policy["spec"]["policyTypes"].push_back("Ingress");
  YAML::Node peers;
  YAML::Node fromSet;
  fromSet["podSelector"]["matchLabels"] = labelsOf(o);
  peers["from"].push_back(fromSet);
  YAML::Node consensusPort;
  consensusPort["protocol"] = "TCP";
  consensusPort["port"] = o.port;
  peers["ports"].push_back(consensusPort);
  YAML::Node metrics;
  YAML::Node metricsPort;
  metricsPort["protocol"] = "TCP";
  metricsPort["port"] = o.metricsPort;
  metrics["ports"].push_back(metricsPort);
  policy["spec"]["ingress"].push_back(peers);
  policy["spec"]["ingress"].push_back(metrics);
  return policy;
}

YAML::Node probe(int periodSeconds, int failureThreshold) {
  YAML::Node p;
  p["httpGet"]["path"] = "/healthz";
  p["httpGet"]["port"] = "metrics";
  p["periodSeconds"] = periodSeconds;
  p["failureThreshold"] = failureThreshold;
  return p;
}

YAML::Node mount(const std::string& name, const std::string& path, bool readOnly) {
  YAML::Node m;
  m["name"] = name;
  m["mountPath"] = path;
  if (readOnly) m["readOnly"] = true;
  return m;
}

// The overrides every node's config was written with, as one line.
std::string settingsOf(const K8sOptions& o) {
  std::string out;
  for (const std::string& set : o.sets) out += (out.empty() ? "" : " ") + set;
  for (const std::string& straggler : o.stragglers)
    out += (out.empty() ? "straggler " : " straggler ") + straggler;
  return out;
}

YAML::Node statefulSet(const K8sOptions& o, std::size_t replicas) {
  YAML::Node set = object("apps/v1", "StatefulSet", o.nodeSet, o);
  YAML::Node spec;
  spec["serviceName"] = str(o.nodeSet);
  spec["replicas"] = replicas;
  spec["podManagementPolicy"] = "Parallel";  // every node at once: each waits for its neighbours
  spec["selector"]["matchLabels"] = labelsOf(o);

  YAML::Node meta;
  meta["labels"] = labelsOf(o);
  meta["annotations"]["prometheus.io/scrape"] = str("true");
  meta["annotations"]["prometheus.io/port"] = str(std::to_string(o.metricsPort));
  meta["annotations"]["prometheus.io/path"] = "/metrics";
  // A daemon reads its settings at start: new ones roll the pods. A new
  // topology does not: the pods apply it in place (topology.watch).
  meta["annotations"]["consensusd/settings"] = str(settingsOf(o));
  spec["template"]["metadata"] = meta;

  YAML::Node pod;
  pod["terminationGracePeriodSeconds"] = 30;  // the final checkpoint on SIGTERM
  pod["enableServiceLinks"] = false;
  // As the systemd unit: an unprivileged user, no privileges to gain.
  pod["securityContext"]["runAsNonRoot"] = true;
  pod["securityContext"]["runAsUser"] = o.uid;
  pod["securityContext"]["runAsGroup"] = o.uid;
  pod["securityContext"]["fsGroup"] = o.uid;
  pod["securityContext"]["seccompProfile"]["type"] = "RuntimeDefault";
  YAML::Node hardening;
  hardening["allowPrivilegeEscalation"] = false;
  hardening["readOnlyRootFilesystem"] = true;
  hardening["capabilities"]["drop"].push_back("ALL");

  // The pod's ordinal (HOSTNAME is NAME-ORDINAL) picks its node's config.
  const std::string config = std::string(kConfigDir) + "/node-${HOSTNAME##*-}.yaml";
  YAML::Node container;
  container["name"] = "consensusd";
  container["image"] = str(o.image);
  container["command"].push_back("/bin/sh");
  container["command"].push_back("-c");
  container["command"].push_back("exec consensusd --config " + config);
  for (const auto& [name, number] : {std::pair{"consensus", o.port}, {"metrics", o.metricsPort}}) {
    YAML::Node port;
    port["name"] = name;
    port["containerPort"] = number;
    container["ports"].push_back(port);
  }
  // /healthz: 503 until the node trains (resume, first trainer), and again
  // if its engine loop stops publishing for 30 s (the systemd watchdog's
  // limit). Startup may take minutes: a checkpoint to read, peers to find.
  container["startupProbe"] = probe(5, 120);
  container["readinessProbe"] = probe(5, 2);
  container["livenessProbe"] = probe(10, 3);
  container["resources"]["requests"]["cpu"] = str(o.cpu);
  container["resources"]["requests"]["memory"] = str(o.memory);
  container["resources"]["limits"]["memory"] = str(o.memory);
  container["securityContext"] = hardening;
  container["volumeMounts"].push_back(mount("config", kConfigDir, true));
  container["volumeMounts"].push_back(mount("state", "/var/lib/consensusd", false));
  container["volumeMounts"].push_back(mount("run", kRunDir, false));
  container["volumeMounts"].push_back(mount("tmp", "/tmp", false));

  YAML::Node configVolume;
  configVolume["name"] = "config";
  configVolume["configMap"]["name"] = str(o.nodeSet + "-config");
  YAML::Node run;
  run["name"] = "run";
  run["emptyDir"]["medium"] = "Memory";  // the status socket, and the secret key if any
  YAML::Node tmp;
  tmp["name"] = "tmp";
  tmp["emptyDir"] = YAML::Node(YAML::NodeType::Map);
  tmp["emptyDir"].SetStyle(YAML::EmitterStyle::Flow);
  pod["volumes"].push_back(configVolume);
  pod["volumes"].push_back(run);
  pod["volumes"].push_back(tmp);

  if (!o.curveSecret.empty()) {
    // A Secret's files are group-readable under fsGroup, and consensusd
    // refuses a key others can read: copy this pod's key, mode 600, to memory.
    YAML::Node keys;
    keys["name"] = "keys";
    keys["secret"]["secretName"] = str(o.curveSecret);
    keys["secret"]["defaultMode"] = 0440;
    pod["volumes"].push_back(keys);
    YAML::Node init;
    init["name"] = "secret-key";
    init["image"] = str(o.image);
    init["command"].push_back("/bin/sh");
    init["command"].push_back("-c");
    init["command"].push_back(std::string("install -m 600 ") + kKeysDir +
                              "/node-${HOSTNAME##*-}.key " + kRunDir + "/node.key");
    init["securityContext"] = hardening;
    init["volumeMounts"].push_back(mount("keys", kKeysDir, true));
    init["volumeMounts"].push_back(mount("run", kRunDir, false));
    pod["initContainers"].push_back(init);
  }
  pod["containers"].push_back(container);
  spec["template"]["spec"] = pod;

  YAML::Node claim;
  claim["metadata"]["name"] = "state";
  claim["spec"]["accessModes"].push_back("ReadWriteOnce");
  claim["spec"]["resources"]["requests"]["storage"] = str(o.storage);
  if (!o.storageClass.empty()) claim["spec"]["storageClassName"] = str(o.storageClass);
  spec["volumeClaimTemplates"].push_back(claim);
  set["spec"] = spec;
  return set;
}

int runK8s(const K8sOptions& o) {
  checkName("--node-set", o.nodeSet, 52);  // room for "-ORDINAL" and the Pod's hash label
  checkName("--namespace", o.nameSpace, 63);
  if (!o.curveSecret.empty()) checkName("--curve-secret", o.curveSecret, 253);
  const topology::Topology given = topology::loadTopology(o.topology);
  const topology::Topology graph = withPodEndpoints(given, o);
  if (!o.curveSecret.empty()) {
    for (std::size_t i = 0; i < graph.size(); ++i) {
      if (graph.node(i).publicKey.empty()) {
        throw UsageError("--curve-secret: node " + graph.node(i).id + " in " + o.topology +
                         " has no public_key (consensusctl keygen writes both halves)");
      }
    }
  }
  const auto stragglers = daemonStragglers(o.stragglers, graph);

  const fs::path out(o.output);
  const fs::path configDir = out / "config";
  fs::create_directories(configDir);
  std::map<std::string, std::string> files{{"topology.yaml", topology::toYaml(graph)}};
  writeFile(configDir / "topology.yaml", files["topology.yaml"]);
  for (std::size_t i = 0; i < graph.size(); ++i) {
    const std::string& id = graph.node(i).id;
    std::string base =
        "node: {id: " + id + ", bind: \"tcp://*:" + std::to_string(o.port) +
        "\"}\ntopology: {file: topology.yaml, watch: true}\nstatus: {http: \"0.0.0.0:" +
        std::to_string(o.metricsPort) + "\", http_remote: true}\n";
    if (!o.curveSecret.empty())
      base += "security: {curve: true, secret_key_file: " + std::string(kRunDir) + "/node.key}\n";
    std::vector<std::string> overrides = o.sets;
    if (const auto it = stragglers.find(i); it != stragglers.end())
      overrides.insert(overrides.end(), it->second.begin(), it->second.end());
    // The overrides go into the node's file: the pods share one command line.
    // The key file exists only in the pod, so the check here leaves CURVE out.
    files[configName(i)] =
        writeNodeConfig(configDir / configName(i),
                        "# Pod " + o.nodeSet + "-" + std::to_string(i) + " runs node " + id +
                            " (generated by consensusctl k8s).\n",
                        base, overrides,
                        o.curveSecret.empty() ? std::vector<std::string>{}
                                              : std::vector<std::string>{"security.curve=false"});
  }

  YAML::Node ns;
  ns["apiVersion"] = "v1";
  ns["kind"] = "Namespace";
  ns["metadata"]["name"] = str(o.nameSpace);
  const fs::path manifest = out / "consensusd.yaml";
  writeFile(manifest, "# " + std::to_string(graph.size()) + " consensusd nodes of '" +
                          graph.name() + "' (topology hash " + graph.hashHex() + "): pod " +
                          o.nodeSet +
                          "-I runs node I of the topology.\n"
                          "# Apply: kubectl apply -f " +
                          manifest.string() + "\n---\n" + emit(ns) + "---\n" + configMap(o, files) +
                          "---\n" + emit(headlessService(o)) + "---\n" + emit(networkPolicy(o)) +
                          "---\n" + emit(statefulSet(o, graph.size())));
  std::cout << "wrote " << manifest.string() << " (namespace " << o.nameSpace << ", StatefulSet "
            << o.nodeSet << " of " << graph.size() << " pods) and " << graph.size() + 1
            << " files in " << configDir.string() << "\n";
  if (!o.curveSecret.empty()) {
    std::cout << "before applying, create the keys' Secret, pod I's key as node-I.key:\n"
              << "  kubectl -n " << o.nameSpace << " create secret generic " << o.curveSecret;
    for (std::size_t i = 0; i < graph.size(); ++i)
      std::cout << " --from-file=node-" << i << ".key=" << graph.node(i).id << ".key";
    std::cout << "\n";
  }
  return kExitOk;
}

}  // namespace

void addK8sCommand(CLI::App& parent, std::function<int()>& action) {
  auto o = std::make_shared<K8sOptions>();
  CLI::App* cmd = parent.add_subcommand(
      "k8s",
      "Write Kubernetes manifests for TOPOLOGY: a StatefulSet (pod I = node I), a headless "
      "Service, a ConfigMap with every node's config, a NetworkPolicy");
  cmd->add_option("topology", o->topology, "Topology file")->required();
  cmd->add_option("-o,--output", o->output, "Folder for consensusd.yaml and config/ (created)")
      ->capture_default_str();
  cmd->add_option("--image", o->image, "Image with consensusd (docker/Dockerfile)")
      ->capture_default_str();
  cmd->add_option("--namespace", o->nameSpace, "Namespace of every object (created)")
      ->capture_default_str();
  cmd->add_option("--node-set", o->nodeSet, "Name of the StatefulSet and its Service")
      ->capture_default_str();
  cmd->add_option("--cluster-domain", o->clusterDomain, "The cluster's DNS domain")
      ->capture_default_str();
  cmd->add_option("--port", o->port, "Port every node listens on in its pod")
      ->capture_default_str()
      ->check(CLI::Range(1, 65535));
  cmd->add_option("--metrics-port", o->metricsPort, "HTTP port of /healthz, /status, /metrics")
      ->capture_default_str()
      ->check(CLI::Range(1, 65535));
  cmd->add_option("--cpu", o->cpu, "CPU request per pod")->capture_default_str();
  cmd->add_option("--memory", o->memory, "Memory request and limit per pod")->capture_default_str();
  cmd->add_option("--storage", o->storage, "Checkpoint volume per pod")->capture_default_str();
  cmd->add_option("--storage-class", o->storageClass,
                  "StorageClass of the checkpoint volumes (default: the cluster's)");
  cmd->add_option("--curve-secret", o->curveSecret,
                  "Secret holding pod I's CurveZMQ key file as node-I.key: links are "
                  "authenticated and encrypted (the topology needs every public_key)");
  cmd->add_option("--uid", o->uid, "User and group id the daemon runs as")
      ->capture_default_str()
      ->check(CLI::Range(1, 2147483647));
  cmd->add_option("--set", o->sets, "KEY=VALUE for every node's config");
  cmd->add_option("--straggler", o->stragglers,
                  "NODE=KEY=VALUE[,KEY=VALUE]: straggler.* keys of one node, e.g. "
                  "n3=kind=bimodal,slow_factor=20");
  cmd->callback([o, &action] { action = [o] { return runK8s(*o); }; });
}

}  // namespace consensusd::cli
