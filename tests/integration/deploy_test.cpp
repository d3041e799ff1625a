// Deployment: the systemd unit verifies, consensusd speaks the notification
// protocol (READY=1 once bound, WATCHDOG=1, STOPPING=1), the Debian package
// holds what it should, and generated docker-compose files validate.

#include <doctest/doctest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "cluster.hpp"

using consensusd::testing::Cluster;
using consensusd::testing::readText;
using consensusd::testing::runProcess;
using consensusd::testing::TempDir;
using namespace std::chrono_literals;

namespace {

// `consensusd --check` reads the node's whole data set, as the daemon would:
// seconds under the sanitizers, more beside other tests on a loaded machine.
constexpr auto kCheckLimit = std::chrono::seconds(120);

// A datagram socket standing in for systemd's notification socket.
class NotifySocket {
 public:
  explicit NotifySocket(std::string path) : path_(std::move(path)) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path_.c_str(), sizeof address.sun_path - 1);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    timeval timeout{0, 100000};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  }
  ~NotifySocket() { ::close(fd_); }
  NotifySocket(const NotifySocket&) = delete;
  NotifySocket& operator=(const NotifySocket&) = delete;

  // Every message received so far, in order.
  const std::vector<std::string>& poll() {
    char buffer[4096];
    for (ssize_t n; (n = ::recv(fd_, buffer, sizeof buffer, 0)) > 0;)
      messages_.emplace_back(buffer, static_cast<std::size_t>(n));
    return messages_;
  }
  bool got(const std::string& message) {
    const auto& all = poll();
    return std::find(all.begin(), all.end(), message) != all.end();
  }

 private:
  std::string path_;
  int fd_ = -1;
  std::vector<std::string> messages_;
};

}  // namespace

TEST_CASE("the systemd unit verifies without a warning") {
  const TempDir dir;
  // verify needs ExecStart to exist: point the unit at the binary under test.
  const std::string unit =
      std::regex_replace(readText(CONSENSUSD_SOURCE_DIR "/packaging/systemd/consensusd@.service"),
                         std::regex("/usr/bin/consensusd"), CONSENSUSD);
  dir.write("consensusd@.service", unit);
  const auto verify = runProcess(
      {"/usr/bin/systemd-analyze", "verify", dir.path() + "/consensusd@n0.service"}, {}, 60s);
  INFO(verify.out << verify.err);
  CHECK(verify.exitCode == 0);
  CHECK(verify.err.empty());
  // The sandbox keeps the exposure score low: "1.2 OK" when written (docs/deploy.md).
  const auto security = runProcess({"/usr/bin/systemd-analyze", "security", "--offline=yes",
                                    "--threshold=15", dir.path() + "/consensusd@n0.service"},
                                   {}, 60s);
  INFO(security.out << security.err);
  CHECK(security.exitCode == 0);
  for (const char* key : {"Type=notify", "WatchdogSec=", "Restart=on-failure", "User=consensusd",
                          "RuntimeDirectory=", "StateDirectory=", "NoNewPrivileges=yes",
                          "ProtectSystem=strict", "CapabilityBoundingSet=\n", "LimitNOFILE="}) {
    CAPTURE(key);
    CHECK(unit.find(key) != std::string::npos);
  }
}

TEST_CASE("consensusd notifies READY=1 once bound, feeds the watchdog, and says STOPPING=1") {
  Cluster cluster(1, {"data.dataset=synthetic-logistic", "model.kind=logistic", "train.rounds=0",
                      "train.eval_every_rounds=0"});
  NotifySocket notify(cluster.path("notify.sock"));
  ::setenv("NOTIFY_SOCKET", cluster.path("notify.sock").c_str(), 1);
  ::setenv("WATCHDOG_USEC", "200000", 1);  // a feed every 100 ms
  cluster.start(0);
  ::unsetenv("NOTIFY_SOCKET");
  ::unsetenv("WATCHDOG_USEC");
  REQUIRE(consensusd::testing::waitFor([&] { return notify.got("READY=1"); }, 30s));
  // Ready means bound: the port is taken now.
  CHECK(cluster.log(0).find("starting at round") != std::string::npos);
  const auto feeds = [&] {
    const auto& all = notify.poll();
    return std::count(all.begin(), all.end(), "WATCHDOG=1");
  };
  CHECK(consensusd::testing::waitFor([&] { return feeds() >= 5; }, 10s));
  cluster.child(0).signal(SIGTERM);
  CHECK(cluster.child(0).wait(10s) == 0);
  CHECK(notify.got("STOPPING=1"));
}

TEST_CASE("the Debian package holds binaries, unit, user and docs, and its consensusd runs") {
  const TempDir dir;
  const auto pack = runProcess({"/usr/bin/cpack", "-G", "DEB", "-B", dir.path() + "/out",
                                "--config", CONSENSUSD_BINARY_DIR "/CPackConfig.cmake"},
                               {}, 150s);
  INFO(pack.out << pack.err);
  REQUIRE(pack.exitCode == 0);
  std::string deb;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path() + "/out")) {
    if (entry.path().extension() == ".deb") deb = entry.path().string();
  }
  REQUIRE_FALSE(deb.empty());
  const auto info = runProcess({"/usr/bin/dpkg-deb", "--field", deb, "Depends"});
  CHECK(info.out.find("libzmq5") != std::string::npos);
  CHECK(info.out.find("python3-numpy") != std::string::npos);
  const std::string root = dir.path() + "/root";
  REQUIRE(runProcess({"/usr/bin/dpkg-deb", "-x", deb, root}).exitCode == 0);
  for (const char* file :
       {"/usr/bin/consensusd", "/usr/bin/consensusctl",
        "/usr/lib/systemd/system/consensusd@.service", "/usr/lib/sysusers.d/consensusd.conf",
        "/usr/share/doc/consensusd/README.md", "/usr/share/doc/consensusd/config.md",
        "/usr/share/doc/consensusd/examples/n0.yaml",
        "/usr/lib/python3/dist-packages/consensusd/__init__.py",
        "/usr/lib/python3/dist-packages/consensusd/torch.py"}) {
    CAPTURE(file);
    CHECK(std::filesystem::exists(root + file));
  }
  const auto version = runProcess({root + "/usr/bin/consensusd", "--version"});
  CHECK(version.exitCode == 0);
  CHECK(version.out.find("consensusd") != std::string::npos);
  const auto check = runProcess({root + "/usr/bin/consensusd", "--config",
                                 CONSENSUSD_SOURCE_DIR "/config/examples/n0.yaml", "--check"},
                                {}, kCheckLimit);
  INFO(check.out << check.err);
  CHECK(check.exitCode == 0);
}

TEST_CASE("consensusctl compose writes a testbed that docker-compose validates") {
  const TempDir dir;
  const std::string out = dir.path() + "/testbed";
  const auto compose =
      runProcess({CONSENSUSCTL, "compose", CONSENSUSD_SOURCE_DIR "/config/examples/ring8.yaml",
                  "-o", out, "--image", "registry.example/consensusd:0.1", "--set",
                  "train.rounds=500", "--straggler", "n3=kind=bimodal,slow_factor=20"});
  INFO(compose.out << compose.err);
  REQUIRE(compose.exitCode == 0);
  // Each node's config checks with the endpoints rewritten to service names.
  for (const char* node : {"n0", "n3", "n7"}) {
    const auto check = runProcess(
        {CONSENSUSD, "--config", out + "/config/" + node + ".yaml", "--check"}, {}, kCheckLimit);
    INFO(check.out << check.err);
    CHECK(check.exitCode == 0);
  }
  CHECK(readText(out + "/config/topology.yaml").find("tcp://n3:7000") != std::string::npos);
  const auto config =
      runProcess({"/usr/bin/docker-compose", "-f", out + "/docker-compose.yml", "config"}, {}, 60s);
  INFO(config.out << config.err);
  REQUIRE(config.exitCode == 0);
  for (const char* expected : {"registry.example/consensusd:0.1", "straggler.kind=bimodal",
                               "straggler.slow_factor=20", "n7-state", "train.rounds=500"}) {
    CAPTURE(expected);
    CHECK(config.out.find(expected) != std::string::npos);
  }

  // Mistakes are caught before anything is written for docker.
  const auto unknownNode =
      runProcess({CONSENSUSCTL, "compose", CONSENSUSD_SOURCE_DIR "/config/examples/ring8.yaml",
                  "-o", dir.path() + "/bad1", "--straggler", "n42=kind=constant"});
  CHECK(unknownNode.exitCode == 64);
  CHECK(unknownNode.err.find("n42=kind=constant") != std::string::npos);
  const auto badKey =
      runProcess({CONSENSUSCTL, "compose", CONSENSUSD_SOURCE_DIR "/config/examples/ring8.yaml",
                  "-o", dir.path() + "/bad2", "--straggler", "n3=slow_facter=20"});
  CHECK(badKey.exitCode == 78);
  CHECK(badKey.err.find("straggler.slow_factor") != std::string::npos);  // did you mean
  const auto twice = runProcess(
      {CONSENSUSCTL, "compose", CONSENSUSD_SOURCE_DIR "/config/examples/ring8.yaml", "-o",
       dir.path() + "/bad3", "--straggler", "n3=kind=bimodal", "--straggler", "n3=slow_factor=20"});
  CHECK(twice.exitCode == 64);
  CHECK(twice.err.find("node n3 is named twice") != std::string::npos);
}

// Kubernetes: pod I of the StatefulSet runs node I; its peers are the other
// pods' stable DNS names; every manifest validates against the API schemas
// (kubernetes-models, offline: no cluster is reachable here).
TEST_CASE("consensusctl k8s writes manifests that validate against the Kubernetes API schemas") {
  const TempDir dir;
  const std::string out = dir.path() + "/k8s";
  const std::string validator = CONSENSUSD_SOURCE_DIR "/tests/k8s/validate.mjs";
  REQUIRE_MESSAGE(std::filesystem::exists(CONSENSUSD_SOURCE_DIR "/tests/k8s/node_modules"),
                  "the schemas are missing: run scripts/bootstrap");
  // Node ids that are not the pods' ordinals, and CurveZMQ keys.
  const std::string topology = dir.path() + "/star.yaml";
  REQUIRE(runProcess({CONSENSUSCTL, "topology", "gen", "star", "--nodes", "5", "-o", topology})
              .exitCode == 0);
  REQUIRE(runProcess(
              {CONSENSUSCTL, "keygen", "--topology", topology, "--dir", dir.path(), "-o", topology})
              .exitCode == 0);
  const auto k8s = runProcess({CONSENSUSCTL, "k8s", topology, "-o", out, "--namespace", "ml",
                               "--node-set", "gossip", "--image", "registry.example/consensusd:0.1",
                               "--set", "train.rounds=500", "--straggler",
                               "n3=kind=bimodal,slow_factor=20", "--curve-secret", "gossip-keys"});
  INFO(k8s.out << k8s.err);
  REQUIRE(k8s.exitCode == 0);
  CHECK(k8s.out.find("create secret generic gossip-keys --from-file=node-0.key=n0.key") !=
        std::string::npos);

  const std::string topologyText = readText(out + "/config/topology.yaml");
  for (int i = 0; i < 5; ++i) {
    CAPTURE(i);
    const std::string id = "n" + std::to_string(i);  // `topology gen` names node I nI
    CHECK(topologyText.find("{id: " + id + ", endpoint: \"tcp://gossip-" + std::to_string(i) +
                            ".gossip.ml.svc.cluster.local:7000\"") != std::string::npos);
    const std::string config = out + "/config/node-" + std::to_string(i) + ".yaml";
    CHECK(readText(config).find("node: {id: " + id + ",") != std::string::npos);
    // As the daemon reads it (the key file exists only in the pod).
    const auto check =
        runProcess({CONSENSUSD, "--config", config, "--set", "security.curve=false", "--check"}, {},
                   kCheckLimit);
    INFO(check.out << check.err);
    CHECK(check.exitCode == 0);
  }
  CHECK(readText(out + "/config/node-3.yaml").find("kind: bimodal") != std::string::npos);
  CHECK(readText(out + "/config/node-2.yaml").find("bimodal") == std::string::npos);

  const std::string manifest = readText(out + "/consensusd.yaml");
  for (const char* expected :
       {"replicas: 5", "podManagementPolicy: Parallel", "publishNotReadyAddresses: true",
        "clusterIP: None", "node-${HOSTNAME##*-}.yaml", "path: /healthz", "runAsNonRoot: true",
        "readOnlyRootFilesystem: true", "prometheus.io/scrape: \"true\"", "volumeClaimTemplates",
        "secretName: \"gossip-keys\"", "image: \"registry.example/consensusd:0.1\"",
        "consensusd/settings: \"train.rounds=500 straggler n3=kind=bimodal,slow_factor=20\""}) {
    CAPTURE(expected);
    CHECK(manifest.find(expected) != std::string::npos);
  }
  const auto valid = runProcess({"/usr/bin/env", "node", validator, out + "/consensusd.yaml"});
  INFO(valid.out << valid.err);
  CHECK(valid.exitCode == 0);
  for (const char* kind : {"Namespace", "ConfigMap", "Service", "NetworkPolicy", "StatefulSet"}) {
    CAPTURE(kind);
    CHECK(valid.out.find(std::string(kind) + " ") != std::string::npos);
  }

  // The validator does fail: an annotation that is not a string, a policy that does not exist.
  std::string broken = manifest;
  broken.replace(broken.find("podManagementPolicy: Parallel"), 29, "podManagementPolicy: Eager");
  {
    std::ofstream file(dir.path() + "/broken.yaml");
    file << broken;
  }
  const auto invalid = runProcess({"/usr/bin/env", "node", validator, dir.path() + "/broken.yaml"});
  CHECK(invalid.exitCode == 1);
  CHECK(invalid.err.find("podManagementPolicy") != std::string::npos);

  // Mistakes stop before anything is written.
  const auto badName = runProcess(
      {CONSENSUSCTL, "k8s", topology, "-o", dir.path() + "/bad1", "--node-set", "Gossip_1"});
  CHECK(badName.exitCode == 64);
  CHECK(badName.err.find("'Gossip_1' is not a Kubernetes name") != std::string::npos);
  const auto noKeys =
      runProcess({CONSENSUSCTL, "k8s", CONSENSUSD_SOURCE_DIR "/config/examples/ring8.yaml", "-o",
                  dir.path() + "/bad2", "--curve-secret", "keys"});
  CHECK(noKeys.exitCode == 64);
  CHECK(noKeys.err.find("has no public_key") != std::string::npos);
  const auto badKey = runProcess({CONSENSUSCTL, "k8s", topology, "-o", dir.path() + "/bad3",
                                  "--straggler", "n3=slow_facter=20"});
  CHECK(badKey.exitCode == 78);
  CHECK_FALSE(std::filesystem::exists(dir.path() + "/bad1"));
  CHECK_FALSE(std::filesystem::exists(dir.path() + "/bad2"));
}

TEST_CASE(
    "consensusctl k8s: a larger topology changes the ConfigMap and the replicas, not the pods") {
  // Scaling is regenerate + kubectl apply: the running pods must not be
  // rolled (their template is the same) but take the new topology in place.
  const TempDir dir;
  const auto generate = [&](int nodes, const std::vector<std::string>& extra) {
    const std::string topology = dir.path() + "/ring" + std::to_string(nodes) + ".yaml";
    REQUIRE(runProcess({CONSENSUSCTL, "topology", "gen", "ring", "--nodes", std::to_string(nodes),
                        "-o", topology})
                .exitCode == 0);
    std::vector<std::string> argv{CONSENSUSCTL, "k8s", topology, "-o", dir.path() + "/k8s"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const auto k8s = runProcess(argv);
    INFO(k8s.out << k8s.err);
    REQUIRE(k8s.exitCode == 0);
    const std::string manifest = readText(dir.path() + "/k8s/consensusd.yaml");
    const std::size_t set = manifest.find("kind: StatefulSet");
    REQUIRE(set != std::string::npos);
    return std::pair{manifest.substr(0, set), manifest.substr(set)};
  };
  const std::vector<std::string> settings{"--set", "train.rounds=500"};
  const auto [config8, set8] = generate(8, settings);
  const std::string node0 = readText(dir.path() + "/k8s/config/node-0.yaml");
  CHECK(node0.find("topology: {file: topology.yaml, watch: true}") != std::string::npos);
  const auto [config10, set10] = generate(10, settings);
  CHECK(config10 != config8);  // the ConfigMap: topology and two more node configs
  CHECK(config10.find("node-9.yaml: |") != std::string::npos);
  CHECK(readText(dir.path() + "/k8s/config/node-0.yaml") == node0);
  const auto withoutReplicas = [](std::string set) {
    const std::size_t at = set.find("replicas: ");
    return set.erase(at, set.find('\n', at) - at);
  };
  CHECK(set10.find("replicas: 10") != std::string::npos);
  CHECK(withoutReplicas(set10) == withoutReplicas(set8));
  // New settings are read at start: they change the template, which rolls the pods.
  const auto [config10b, set10b] = generate(10, {"--set", "train.rounds=900"});
  CHECK(withoutReplicas(set10b) != withoutReplicas(set10));
  CHECK(set10b.find("consensusd/settings: \"train.rounds=900\"") != std::string::npos);
}
