#include <doctest/doctest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "consensusd/config/load.hpp"
#include "consensusd/config/params.hpp"
#include "expect_error.hpp"
#include "process.hpp"

using consensusd::config::loadConfig;
using consensusd::config::NodeConfig;
using consensusd::config::readConfig;
using consensusd::schema::InputError;

namespace {

const std::string kMinimal = "node:\n  id: n1\ntopology:\n  file: ring.yaml\n";

const std::string kRing4 =
    "name: ring4\nnodes:\n"
    "  - {id: n0, endpoint: \"tcp://127.0.0.1:7000\", status: /tmp/n0.sock}\n"
    "  - {id: n1, endpoint: \"tcp://127.0.0.1:7001\"}\n"
    "  - {id: n2, endpoint: \"tcp://127.0.0.1:7002\"}\n"
    "  - {id: n3, endpoint: \"tcp://127.0.0.1:7003\"}\n"
    "edges: [[n0, n1], [n1, n2], [n2, n3], [n3, n0]]\n";

template <class F>
std::string errorFrom(F&& body) {
  return consensusd::testing::errorText<InputError>(std::forward<F>(body));
}

std::string readError(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return errorFrom([&] { readConfig(text, "c.yaml", overrides); });
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

TEST_CASE("a minimal config gets every default") {
  const NodeConfig config = readConfig(kMinimal, "c.yaml");
  const NodeConfig defaults;
  CHECK(config.node.id == "n1");
  CHECK(config.topology.file == "ring.yaml");
  CHECK(config.train.batchSize == 32);
  CHECK(config.consensus.policy == "dynamic");
  CHECK(config.consensus.mixRound == "newest");
  CHECK(config.consensus.maxLead == 20);
  CHECK(config.consensus.roundSkipping);
  CHECK(config.checkpoint.keep == 2);
  CHECK(consensusd::config::toYaml(config) == consensusd::config::toYaml([&] {
          NodeConfig expected;
          expected.node.id = "n1";
          expected.topology.file = "ring.yaml";
          return expected;
        }()));
}

TEST_CASE("every key reads back what toYaml writes") {
  NodeConfig config = readConfig(
      kMinimal + "train:\n  learning_rate: 0.125\nmodel:\n  hidden: [64, 32]\n", "c.yaml");
  CHECK(config.train.learningRate == 0.125);
  CHECK(config.model.hidden == std::vector<std::int64_t>{64, 32});
  const NodeConfig again = readConfig(consensusd::config::toYaml(config), "dump.yaml");
  CHECK(consensusd::config::toYaml(again) == consensusd::config::toYaml(config));
}

TEST_CASE("--set overrides go through the same checks") {
  const NodeConfig config =
      readConfig(kMinimal, "c.yaml",
                 {"train.batch_size=64", "consensus.policy=static", "model.hidden=[128,64]",
                  "status.http=127.0.0.1:9100", "status.http="});
  CHECK(config.train.batchSize == 64);
  CHECK(config.consensus.policy == "static");
  CHECK(config.model.hidden == std::vector<std::int64_t>{128, 64});
  CHECK(config.status.http.empty());
  CHECK(readError(kMinimal, {"train.batch_size=0"}) ==
        "--set train.batch_size=0:1:18: value 0 is out of range [1, 65536] (train.batch_size)");
  CHECK(readError(kMinimal, {"train.batchsize=3"}) ==
        "--set train.batchsize=3:1:1: unknown key 'train.batchsize', did you mean "
        "'train.batch_size'? "
        "(train.batchsize)");
  CHECK(readError(kMinimal, {"train.batch_size"}) ==
        "--set train.batch_size:1:1: expected --set key.path=value");
  CHECK(readError(kMinimal, {"consensus.policy=dynamc"}) ==
        "--set consensus.policy=dynamc:1:18: unknown value 'dynamc', did you mean 'dynamic'? "
        "(one of: all static timeout quantile dynamic) (consensus.policy)");
}

TEST_CASE("schema errors: file:line:col, key path, suggestion") {
  CHECK(readError("") == "c.yaml:1:1: config file is empty");
  CHECK(readError(kMinimal + "trian:\n  rounds: 5\n") ==
        "c.yaml:5:1: unknown key 'trian', did you mean 'train'? (trian)");
  CHECK(readError(kMinimal + "train:\n  batchsize: 5\n") ==
        "c.yaml:6:3: unknown key 'batchsize', did you mean 'batch_size'? (train.batchsize)");
  CHECK(readError(kMinimal + "consensus:\n  batch_size: 5\n") ==
        "c.yaml:6:3: unknown key 'batch_size', did you mean 'train.batch_size'? "
        "(consensus.batch_size)");
  CHECK(readError(kMinimal + "train:\n  batch_size: \"32\"\n") ==
        "c.yaml:6:15: expected an integer, got a string (train.batch_size)");
  CHECK(readError(kMinimal + "train:\n  learning_rate: 0\n") ==
        "c.yaml:6:18: value 0 is out of range [1e-09, 100] (train.learning_rate)");
  CHECK(readError(kMinimal + "train: [1]\n") ==
        "c.yaml:5:8: expected a mapping, got a list (train)");
  CHECK(readError(kMinimal + "consensus:\n  round_skipping: on\n") ==
        "c.yaml:6:19: expected true or false, got a string (consensus.round_skipping)");
  CHECK(readError(kMinimal + "model:\n  hidden: [1, 2, 3]\n") ==
        "c.yaml:6:11: at most 2 entries (model.hidden)");
  CHECK(readError("node:\n  id: n1\n") == "c.yaml:1:1: missing key 'file' (topology.file)");
  CHECK(readError("topology:\n  file: x\nnode: {}\n") == "c.yaml:3:1: missing key 'id' (node.id)");
}

TEST_CASE("local cross-checks") {
  CHECK(readError(kMinimal + "consensus:\n  min_responders: 3\n  max_responders: 2\n") ==
        "c.yaml:6:19: min_responders (3) is greater than max_responders (2) "
        "(consensus.min_responders)");
  CHECK(readError(kMinimal + "straggler:\n  from_round: 10\n  to_round: 5\n") ==
        "c.yaml:6:15: from_round (10) is after to_round (5) (straggler.from_round)");
  CHECK(readError(kMinimal + "consensus:\n  policy: timeout\n  timeout_ms: 20000\n") ==
        "c.yaml:7:15: timeout_ms must be below consensus.hard_deadline_ms (consensus.timeout_ms)");
  CHECK(readError(kMinimal + "consensus:\n  compression: int8\n  robust: clip\n") ==
        "c.yaml:6:16: compression mixes public copies, which consensus.robust (clip) does not: "
        "choose one (consensus.compression)");
  CHECK(readError(kMinimal + "consensus:\n  compression: bf16\n  mix_round: same\n") ==
        "c.yaml:7:14: compression keeps one copy of each neighbour, its newest: mix_round: same "
        "needs consensus.compression: none (consensus.mix_round)");
  CHECK(readError(kMinimal + "train:\n  outer: nesterov\n  momentum: 0.9\n") ==
        "c.yaml:7:13: outer: nesterov keeps its own momentum (train.outer_momentum): "
        "train.momentum must be 0 (train.momentum)");
  CHECK(readError(kMinimal + "consensus:\n  publish: update\n") == "no error");
  CHECK(readError(kMinimal + "consensus:\n  compression: int4\n").find("bf16") !=
        std::string::npos);
  CHECK(readError(kMinimal + "model:\n  kind: mlp\n  hidden: []\n") ==
        "c.yaml:7:11: kind: mlp needs 1 or 2 hidden layer widths (model.hidden)");
  CHECK(readError(kMinimal + "model:\n  kind: none\n") ==
        "c.yaml:6:9: kind: none needs model.dimension >= 1 (model.kind)");
  CHECK(readError(kMinimal + "security:\n  curve: true\n") ==
        "c.yaml:6:10: security.curve needs security.secret_key_file (security.curve)");
  CHECK(readError(kMinimal + "status:\n  http: 0.0.0.0:9100\n") ==
        "c.yaml:6:9: the HTTP endpoint has no authentication: bind it to loopback (127.0.0.1), "
        "or set status.http_remote: true where a network policy restricts who reaches it "
        "(status.http)");
  CHECK(readError(kMinimal + "status:\n  http: 0.0.0.0:9100\n  http_remote: true\n") == "no error");
  CHECK(readError(kMinimal + "status:\n  http: localhost\n") ==
        "c.yaml:6:9: expected HOST:PORT, got 'localhost' (status.http)");
}

TEST_CASE("loading against the topology: paths, membership, degree, defaults") {
  const consensusd::testing::TempDir dir;
  dir.write("ring.yaml", kRing4);
  const std::string path = dir.write("n1.yaml", kMinimal);
  const auto loaded = loadConfig(path);
  CHECK(loaded.config.topology.file == dir.path() + "/ring.yaml");
  CHECK(loaded.topology.size() == 4);
  CHECK(loaded.nodeIndex == 1);
  CHECK(loaded.config.status.socket == "/run/consensusd/n1.sock");
  CHECK(loaded.config.checkpoint.dir == "/var/lib/consensusd/n1");
  CHECK(loadConfig(path, {"node.id=n0"}).config.status.socket == "/tmp/n0.sock");
  CHECK(loadConfig(path, {"log.metrics_file=m.jsonl"}).config.log.metricsFile ==
        dir.path() + "/m.jsonl");

  CHECK(errorFrom([&] { loadConfig(path, {"node.id=n9"}); }) ==
        "--set node.id=n9:1:9: node 'n9' is not in topology " + dir.path() +
            "/ring.yaml (4 nodes, n0..n3) (node.id)");
  CHECK(errorFrom([&] { loadConfig(path, {"consensus.min_responders=3"}); }) ==
        "--set consensus.min_responders=3:1:26: min_responders (3) exceeds this node's degree (2) "
        "(consensus.min_responders)");
  CHECK(errorFrom([&] {
          loadConfig(path, {"consensus.policy=static", "consensus.backups=2"});
        }) ==
        "--set consensus.backups=2:1:19: backups (2) leave fewer than min_responders (1) of this "
        "node's 2 "
        "neighbours (consensus.backups)");
  CHECK(errorFrom([&] { loadConfig(path, {"topology.file=missing.yaml"}); }) ==
        "--set topology.file=missing.yaml:1:15: topology file '" + dir.path() +
            "/missing.yaml' does not exist (topology.file)");
  CHECK(
      errorFrom([&] {
        loadConfig(path, {"security.curve=true", "security.secret_key_file=k"});
      }) ==
      "--set security.curve=true:1:16: security.curve needs a public_key for every node; 'n0' in " +
          dir.path() + "/ring.yaml has none (security.curve)");
  CHECK(errorFrom([&] { loadConfig(dir.path() + "/absent.yaml"); }) ==
        dir.path() + "/absent.yaml:1:1: cannot open file");
  // An external model's trainer socket: its folder and length are checked before anything binds.
  const std::vector<std::string> external{"model.kind=external", "model.dimension=8"};
  auto withSocket = [&](const std::string& socket) {
    std::vector<std::string> o = external;
    o.push_back("trainer.socket=" + socket);
    return o;
  };
  CHECK(loadConfig(path, withSocket(dir.path() + "/t.sock")).config.trainer.socket ==
        dir.path() + "/t.sock");
  CHECK(errorFrom([&] { loadConfig(path, withSocket("/nonexistent/t.sock")); }) ==
        "--set trainer.socket=/nonexistent/t.sock:1:16: trainer socket '/nonexistent/t.sock': "
        "folder '/nonexistent' does not exist (trainer.socket)");
  CHECK(errorFrom([&] {
          loadConfig(path, withSocket("/tmp/" + std::string(120, 'x')));
        }).find("a Unix socket path has at most 107 bytes (trainer.socket)") != std::string::npos);
  std::vector<std::string> beside = external;
  beside.push_back("status.socket=/nonexistent/n1.sock");
  CHECK(errorFrom([&] { loadConfig(path, beside); }) ==
        "--set status.socket=/nonexistent/n1.sock:1:15: trainer socket "
        "'/nonexistent/n1.trainer.sock' (beside status.socket): folder '/nonexistent' does not "
        "exist (status.socket)");
  // A status socket whose folder the daemon could not make: 78 at load, not 69 at bind.
  CHECK(errorFrom([&] { loadConfig(path, {"status.socket=/proc/nope/n1.sock"}); }) ==
        "--set status.socket=/proc/nope/n1.sock:1:15: status socket '/proc/nope/n1.sock': cannot "
        "make folder '/proc/nope' in '/proc', a kernel file system (status.socket)");
  // What the topology file says of the node is reported at its entry there.
  std::string ipc = kRing4;
  ipc.replace(ipc.find("tcp://127.0.0.1:7001"), 20, "ipc:///nonexistent/n1.ipc");
  dir.write("ring.yaml", ipc);
  CHECK(errorFrom([&] { loadConfig(path); }) ==
        dir.path() +
            "/ring.yaml:4:5: endpoint 'ipc:///nonexistent/n1.ipc': folder '/nonexistent' does not "
            "exist (nodes[1].endpoint)");
  std::string status = kRing4;
  status.replace(status.find("tcp://127.0.0.1:7001\""), 21,
                 "tcp://127.0.0.1:7001\", status: /proc/nope/n1.sock");
  dir.write("ring.yaml", status);
  CHECK(errorFrom([&] { loadConfig(path); }) ==
        dir.path() +
            "/ring.yaml:4:5: status socket '/proc/nope/n1.sock': cannot make folder '/proc/nope' "
            "in '/proc', a kernel file system (nodes[1].status)");
  // A broken topology is reported against the topology file.
  dir.write("ring.yaml", "nodes: []\nedges: []\n");
  CHECK(errorFrom([&] { loadConfig(path); }) ==
        dir.path() + "/ring.yaml:1:8: a topology needs at least one node (nodes)");
}

TEST_CASE("a change at run time gets the checks a file gets, the degree included") {
  const consensusd::testing::TempDir dir;
  dir.write("ring.yaml", kRing4);
  const auto loaded = loadConfig(dir.write("n1.yaml", kMinimal));
  const auto changed = consensusd::config::reconfigure(
      loaded.config, {"consensus.policy=static", "consensus.backups=1"}, 2);
  CHECK(changed.consensus.policy == "static");
  CHECK(changed.consensus.backups == 1);
  CHECK(changed.node.id == "n1");  // the rest as it ran
  CHECK(errorFrom([&] {
          consensusd::config::reconfigure(loaded.config,
                                          {"consensus.policy=static", "consensus.backups=2"}, 2);
        }) ==
        "--set consensus.backups=2:1:19: backups (2) leave fewer than min_responders (1) of this "
        "node's 2 neighbours (consensus.backups)");
  CHECK(errorFrom([&] {
          consensusd::config::reconfigure(loaded.config, {"consensus.policy=fastest"}, 2);
        }).find("unknown value 'fastest'") != std::string::npos);
}

TEST_CASE("model.dimension and model.dtype: auto, for an external trainer only") {
  const NodeConfig config = readConfig(
      kMinimal, "c.yaml", {"model.kind=external", "model.dimension=auto", "model.dtype=auto"});
  CHECK(config.model.dimension == consensusd::config::kAutoDimension);
  CHECK(consensusd::config::shapeFromTrainer(config));
  const std::string yaml = consensusd::config::toYaml(config);
  CHECK(yaml.find("dimension: auto") != std::string::npos);
  CHECK(consensusd::config::toYaml(readConfig(yaml, "again.yaml")) == yaml);
  CHECK_FALSE(consensusd::config::shapeFromTrainer(
      readConfig(kMinimal, "c.yaml", {"model.kind=external", "model.dimension=8"})));
  CHECK(readError(kMinimal, {"model.kind=none", "model.dimension=auto"}) ==
        "--set model.dimension=auto:1:17: dimension: auto needs model.kind: external (a trainer's) "
        "(model.dimension)");
  CHECK(readError(kMinimal, {"model.dtype=auto"}) ==
        "--set model.dtype=auto:1:13: dtype: auto needs model.kind: external (a trainer's) "
        "(model.dtype)");
  CHECK(readError(kMinimal, {"model.kind=external", "model.dimension=many"})
            .find("model.dimension") != std::string::npos);
}

TEST_CASE("the shipped examples pass") {
  for (const char* example : {"n0.yaml", "n3-straggler.yaml"}) {
    CAPTURE(example);
    const auto loaded =
        loadConfig(std::string(CONSENSUSD_SOURCE_DIR) + "/config/examples/" + example);
    CHECK(loaded.topology.size() == 8);
  }
}

TEST_CASE("config/README.md documents every key as the code defines it") {
  const std::string readme = slurp(std::string(CONSENSUSD_SOURCE_DIR) + "/config/README.md");
  INFO("after a schema change, run scripts/config-reference");
  CHECK(readme.find(consensusd::config::schemaTable()) != std::string::npos);
}

TEST_CASE("every choice the schema accepts maps onto its module's enum") {
  const NodeConfig defaults;
  for (const auto& key : consensusd::config::schemaKeys()) {
    if (key.type != "choice") continue;
    CAPTURE(key.path);
    std::string range = key.range;
    for (std::size_t start = 0; start < range.size();) {
      const std::size_t bar = range.find(" | ", start);
      const std::string value = range.substr(start, bar - start);
      CAPTURE(value);
      std::vector<std::string> overrides{key.path + "=" + value, "model.dimension=8"};
      if (value == consensusd::config::kAuto)
        overrides.insert(overrides.begin(), "model.kind=external");
      NodeConfig config = readConfig(kMinimal, "c.yaml", overrides);
      CHECK_NOTHROW(consensusd::config::dataSource(config));
      CHECK_NOTHROW(consensusd::config::partitionOptions(config, 4));
      CHECK_NOTHROW(consensusd::config::schedule(config));
      CHECK_NOTHROW(consensusd::config::engineOptions(config));
      CHECK_NOTHROW(consensusd::config::stragglerSpec(config));
      start = bar == std::string::npos ? range.size() : bar + 3;
    }
  }
  for (const auto& [kind, name] : consensusd::consensus::kPolicyKinds) {
    const NodeConfig config =
        readConfig(kMinimal, "c.yaml", {"consensus.policy=" + std::string(name)});
    CHECK(consensusd::config::policySpec(config).kind == kind);
  }
  for (const char* mix : {"consensus.mix_round=same", "consensus.mix=symmetric"}) {
    CHECK_NOTHROW(consensusd::config::engineOptions(readConfig(kMinimal, "c.yaml", {mix})));
  }
  const auto engine = consensusd::config::engineOptions(readConfig(
      kMinimal, "c.yaml", {"consensus.peer_timeout_ms=1500", "consensus.timeout_ms=2.5"}));
  CHECK(engine.peerTimeout == std::chrono::milliseconds(1500));
  CHECK(engine.policy.timeout == std::chrono::microseconds(2500));
  CHECK(engine.mixRound == consensusd::consensus::MixRound::Newest);
  CHECK(engine.maxLead == 20);
}

TEST_CASE("a model that does not fit the data is a clear error") {
  consensusd::data::Dataset labels;
  labels.features = Eigen::MatrixXf::Zero(3, 4);
  labels.labels = {0, 1, 2, 1};
  labels.classes = 3;
  NodeConfig config = readConfig(kMinimal, "c.yaml", {"model.kind=least-squares"});
  CHECK_THROWS_WITH_AS(
      consensusd::config::modelOptions(config, labels),
      "model.kind least-squares needs real-valued targets; fashion-mnist has class labels",
      consensusd::data::DataError);
  config = readConfig(kMinimal, "c.yaml", {"model.kind=logistic"});
  CHECK_THROWS_WITH_AS(consensusd::config::modelOptions(config, labels),
                       "model.kind logistic needs 2 classes; fashion-mnist has 3 (use softmax)",
                       consensusd::data::DataError);
  config = readConfig(kMinimal, "c.yaml",
                      {"model.kind=mlp", "model.hidden=[16]", "train.weight_decay=0.001"});
  const auto options = consensusd::config::modelOptions(config, labels);
  CHECK(options.inputs == 3);
  CHECK(options.classes == 3);
  CHECK(options.hidden == std::vector<std::size_t>{16});
  CHECK(options.l2 == 0.001);
}
