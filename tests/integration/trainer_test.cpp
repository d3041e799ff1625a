// External trainers (model.kind: external): real daemons, each with a numpy
// trainer process (tests/integration/trainers/quadratic.py, the Python
// package from python/) attached over its trainer socket.

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cluster.hpp"
#include "cluster_status.hpp"
#include "process.hpp"

using consensusd::testing::answers;
using consensusd::testing::ask;
using consensusd::testing::Child;
using consensusd::testing::Cluster;
using consensusd::testing::readText;
using consensusd::testing::roundOf;
using consensusd::testing::runProcess;
using consensusd::testing::waitFor;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

constexpr int kDimension = 8;

std::vector<std::string> externalModel(std::int64_t rounds) {
  return {"model.kind=external", "model.dimension=" + std::to_string(kDimension),
          "train.learning_rate=0.1", "train.rounds=" + std::to_string(rounds),
          "consensus.peer_timeout_ms=1000"};
}

std::string trainerSocket(const Cluster& cluster, std::size_t i) {
  return cluster.path(Cluster::id(i) + ".trainer.sock");
}

// Debian's python3 running tests/integration/trainers/`script` with `args`,
// the package from python/ on its path.
std::vector<std::string> pythonArgv(const std::string& script,
                                    const std::vector<std::string>& args) {
  std::vector<std::string> argv{
      "/usr/bin/env", "PYTHONPATH=" + std::string(CONSENSUSD_SOURCE_DIR) + "/python",
      "/usr/bin/python3",
      std::string(CONSENSUSD_SOURCE_DIR) + "/tests/integration/trainers/" + script};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

std::vector<std::string> trainerArgv(const Cluster& cluster, std::size_t i,
                                     const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args{trainerSocket(cluster, i), std::to_string(i),
                                std::to_string(kDimension)};
  args.insert(args.end(), extra.begin(), extra.end());
  return pythonArgv("quadratic.py", args);
}

// The JSON lines a trainer printed (its log file).
std::vector<json> linesOf(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> lines;
  for (std::string line; std::getline(in, line);) {
    const json parsed = json::parse(line, nullptr, false);
    if (!parsed.is_discarded()) lines.push_back(parsed);
  }
  return lines;
}

json trainerStatus(const Cluster& cluster, std::size_t i) {
  const json status = ask(cluster, i, {{"cmd", "status"}});
  return status.value("trainer", json::object());
}

// A quadratic.py trainer for each node once its daemon answers; node i's
// lines go to the file "trainer<i>".
std::vector<std::unique_ptr<Child>> attachQuadraticTrainers(const Cluster& cluster) {
  std::vector<std::unique_ptr<Child>> trainers;
  for (std::size_t i = 0; i < cluster.size(); ++i) {
    REQUIRE(waitFor([&] { return answers(cluster, i); }, 30s));
    trainers.push_back(std::make_unique<Child>(trainerArgv(cluster, i),
                                               cluster.path("trainer" + std::to_string(i))));
  }
  return trainers;
}

// Node i's daemon and its torch_linear.py trainer (lines in "torch<i>")
// both ended well, the trainer at the last round: its one line.
json finishedTorchTrainer(Cluster& cluster, Child& trainer, std::size_t i) {
  REQUIRE(cluster.child(i).wait(120s) == std::optional<int>(0));
  REQUIRE(trainer.wait(60s) == std::optional<int>(0));
  const auto lines = linesOf(cluster.path("torch" + std::to_string(i)));
  REQUIRE(lines.size() == 1);
  CAPTURE(lines[0]);
  CHECK(lines[0]["finished"] == "rounds");
  return lines[0];
}

// Two daemons (`overrides`, 100 rounds of a 5-parameter model, every
// neighbour mixed) with a torch_linear.py trainer each taking 4 Adam steps
// a round (`extra` after its socket, node and steps): both trainers finish
// with `steps` steps at the true weights. Node 0's metrics lines.
std::vector<json> trainLinearPair(std::vector<std::string> overrides,
                                  const std::vector<std::string>& extra, int steps) {
  overrides.push_back("consensus.policy=all");
  overrides.push_back("model.dimension=5");
  Cluster cluster(2, overrides);
  cluster.startAll();
  std::vector<std::unique_ptr<Child>> trainers;
  for (std::size_t i = 0; i < 2; ++i) {
    REQUIRE(waitFor([&] { return answers(cluster, i); }, 30s));
    std::vector<std::string> args{trainerSocket(cluster, i), std::to_string(i), "4"};
    args.insert(args.end(), extra.begin(), extra.end());
    trainers.push_back(std::make_unique<Child>(pythonArgv("torch_linear.py", args),
                                               cluster.path("torch" + std::to_string(i))));
  }
  for (std::size_t i = 0; i < 2; ++i) {
    const json line = finishedTorchTrainer(cluster, *trainers[i], i);
    CAPTURE(line);
    CHECK(line["steps"] == steps);
    const std::vector<double> weight = line["weight"];
    const std::vector<double> truth{1.0, -2.0, 3.0, 0.5};
    for (std::size_t k = 0; k < 4; ++k) CHECK(weight[k] == doctest::Approx(truth[k]).epsilon(0.05));
  }
  return linesOf(cluster.path("n0.jsonl"));
}

}  // namespace

TEST_CASE("external trainers: a ring of three trains to the network's optimum") {
  // Waiting for every neighbour, the rounds are synchronous gradient descent
  // with mixing: the nodes' mean reaches the optimum exactly.
  auto overrides = externalModel(300);
  overrides.push_back("consensus.policy=all");
  Cluster cluster(3, overrides);
  cluster.startAll();
  const auto trainers = attachQuadraticTrainers(cluster);
  REQUIRE(waitFor([&] { return trainerStatus(cluster, 0).value("updates", 0) > 20; }, 60s));
  const json t = trainerStatus(cluster, 0);
  CHECK(t["attached"] == true);
  CHECK(t["pid"].get<int>() > 0);
  CHECK(t["rejected_updates"] == 0);
  CHECK(t["mean_update_ms"].get<double>() > 0);

  for (std::size_t i = 0; i < 3; ++i) {
    const auto code = cluster.child(i).wait(120s);
    REQUIRE(code.has_value());
    CHECK(*code == 0);
    // Told that the node finished, the trainer's loop ends and it exits 0.
    REQUIRE(trainers[i]->wait(30s) == std::optional<int>(0));
  }
  // Node i pulls toward t_i[0] = i; mixing pulls all toward the mean, 1,
  // and the network's objective (the sum of the nodes' losses) falls.
  double firstSum = 0;
  double lastSum = 0;
  double meanX0 = 0;
  for (std::size_t i = 0; i < 3; ++i) {
    const auto lines = linesOf(cluster.path("trainer" + std::to_string(i)));
    REQUIRE(lines.size() > 250);
    const json& last = lines[lines.size() - 2];  // the final line says why it ended
    CAPTURE(i);
    CAPTURE(last);
    CHECK(std::abs(last["x0"].get<double>() - 1.0) < 0.25);
    meanX0 += last["x0"].get<double>() / 3;
    CHECK(lines.back()["finished"] == "rounds");
    // The node's final parameters, a round past the last one given.
    CHECK(std::abs(lines.back()["x0"].get<double>() - last["x0"].get<double>()) < 0.05);
    firstSum += lines.front()["loss"].get<double>();
    lastSum += last["loss"].get<double>();
  }
  CHECK(lastSum < 0.5 * firstSum);
  CHECK(meanX0 == doctest::Approx(1.0).epsilon(0.01));
}

TEST_CASE("external trainers: a NaN update is refused and never applied, a new trainer resumes") {
  Cluster cluster(1, externalModel(0));
  cluster.start(0);
  REQUIRE(waitFor([&] { return answers(cluster, 0); }, 30s));
  const auto nan = runProcess(trainerArgv(cluster, 0, {"--nan-at", "5"}), {}, 60s);
  CHECK(nan.exitCode == 3);
  CHECK(nan.out.find("{\"rejected\": \"non_finite\"}") != std::string::npos);
  REQUIRE(waitFor([&] { return trainerStatus(cluster, 0).value("attached", true) == false; }, 10s));
  const json status = ask(cluster, 0, {{"cmd", "status"}});
  CHECK(status["round"] == 5);  // waiting for round 5's update: the NaN one was not taken
  CHECK(status["trainer"]["rejected_updates"] == 1);

  // Attached again, a trainer picks up the node's current round.
  const auto again = runProcess(trainerArgv(cluster, 0, {"--rounds", "10"}), {}, 60s);
  CHECK(again.exitCode == 0);
  const json first = json::parse(again.out.substr(0, again.out.find('\n')));
  CHECK(first["round"] == 5);
  CHECK(waitFor([&] { return ask(cluster, 0, {{"cmd", "status"}})["round"] == 15; }, 10s));
}

TEST_CASE("external trainers: a rejected update is submitted again and the loop goes on") {
  Cluster cluster(1, externalModel(12));
  cluster.start(0);
  REQUIRE(waitFor([&] { return answers(cluster, 0); }, 30s));
  // Round 3: a NaN loss, refused by the client (JSON cannot carry it); round
  // 7: a NaN in the update, refused by the daemon. Each time the same round
  // is submitted again, clean, in the same loop.
  const auto trainer = runProcess(
      trainerArgv(cluster, 0, {"--nan-loss-at", "3", "--nan-at", "7", "--recover"}), {}, 60s);
  CAPTURE(trainer.out);
  CAPTURE(trainer.err);
  CHECK(trainer.exitCode == 0);
  std::vector<json> lines;
  std::istringstream out(trainer.out);
  for (std::string line; std::getline(out, line);) lines.push_back(json::parse(line));
  REQUIRE(lines.size() == 12 + 2 + 1);  // 12 rounds, 2 rejections, the end
  CHECK(lines[3]["rejected"] == "`loss` is not finite (nan): JSON cannot carry it");
  CHECK(lines[4]["round"] == 3);
  CHECK(lines[8]["rejected"] == "non_finite");
  CHECK(lines[9]["round"] == 7);
  CHECK(lines.back()["finished"] == "rounds");
  REQUIRE(cluster.child(0).wait(30s) == std::optional<int>(0));
  const auto metrics = linesOf(cluster.path("n0.jsonl"));
  REQUIRE_FALSE(metrics.empty());
  CHECK(metrics.back()["round"] == 12);
}

TEST_CASE("external trainers: a second trainer and a wrong dimension get clear errors") {
  Cluster cluster(1, externalModel(0));
  cluster.start(0);
  REQUIRE(waitFor([&] { return answers(cluster, 0); }, 30s));
  Child first(trainerArgv(cluster, 0), cluster.path("first"));
  REQUIRE(waitFor([&] { return trainerStatus(cluster, 0).value("attached", false); }, 30s));

  const auto second = runProcess(trainerArgv(cluster, 0, {"--rounds", "1"}), {}, 60s);
  CHECK(second.exitCode == 2);
  CHECK(second.out.find("another trainer (pid " + std::to_string(first.pid())) !=
        std::string::npos);

  std::vector<std::string> nineParameters = trainerArgv(cluster, 0);
  nineParameters.back() = "9";
  const auto wrong = runProcess(nineParameters, {}, 60s);
  CHECK(wrong.exitCode == 2);
  CAPTURE(wrong.out);
  CAPTURE(wrong.err);
  CHECK(wrong.out.find("another trainer") != std::string::npos);  // the live one comes first
  first.signal(SIGKILL);
  REQUIRE(waitFor([&] { return trainerStatus(cluster, 0).value("attached", true) == false; }, 10s));
  const auto wrongAlone = runProcess(nineParameters, {}, 60s);
  CHECK(wrongAlone.exitCode == 2);
  CHECK(wrongAlone.out.find("this node trains 8 float32 parameters; the trainer has 9 float32") !=
        std::string::npos);
  CHECK(waitFor([&] { return trainerStatus(cluster, 0)["refused"].get<int>() == 3; }, 5s));
  CHECK(cluster.child(0).running());
}

TEST_CASE("external trainers: a process of another user is refused by its credentials") {
  if (::geteuid() != 0) {
    MESSAGE("skipped: needs root to run a trainer as another user");
    return;
  }
  Cluster cluster(1, externalModel(0));
  cluster.start(0);
  REQUIRE(waitFor([&] { return answers(cluster, 0); }, 30s));
  // Past the file permissions (opened up here), the daemon checks who connected.
  namespace fs = std::filesystem;
  fs::permissions(cluster.path(""), fs::perms::others_exec, fs::perm_options::add);
  fs::permissions(trainerSocket(cluster, 0), fs::perms::all, fs::perm_options::add);
  std::vector<std::string> argv = trainerArgv(cluster, 0, {"--rounds", "1"});
  // env PYTHONPATH=... setpriv --reuid=nobody ... python3 quadratic.py ...
  argv.insert(argv.begin() + 2,
              {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"});
  const auto stranger = runProcess(argv, {}, 60s);
  CAPTURE(stranger.err);
  CHECK(stranger.exitCode == 2);
  CHECK(stranger.out.find("uid 65534 may not attach") != std::string::npos);
  CHECK(waitFor([&] { return trainerStatus(cluster, 0)["refused"].get<int>() == 1; }, 5s));
}

TEST_CASE("external trainers: trainer.group's members attach, by primary or supplementary group") {
  if (::geteuid() != 0) {
    MESSAGE("skipped: needs root to run a trainer as another user");
    return;
  }
  // Debian's group `users` (gid 100); the trainer runs as nobody (65534).
  auto overrides = externalModel(0);
  overrides.push_back("trainer.group=users");
  Cluster cluster(1, overrides);
  cluster.start(0);
  REQUIRE(waitFor([&] { return answers(cluster, 0); }, 30s));
  struct stat socket {};
  REQUIRE(::stat(trainerSocket(cluster, 0).c_str(), &socket) == 0);
  CHECK(socket.st_gid == 100);  // the group's members reach it through the file's mode
  CHECK((socket.st_mode & 0777) == 0660);
  namespace fs = std::filesystem;
  fs::permissions(cluster.path(""), fs::perms::others_exec, fs::perm_options::add);
  for (const std::string groups : {"--regid=100 --clear-groups", "--regid=65534 --groups=100"}) {
    CAPTURE(groups);
    std::vector<std::string> argv = trainerArgv(cluster, 0, {"--rounds", "2"});
    std::vector<std::string> as{"/usr/bin/setpriv", "--reuid=65534"};
    std::istringstream words(groups);
    for (std::string word; words >> word;) as.push_back(word);
    argv.insert(argv.begin() + 2, as.begin(), as.end());
    const auto member = runProcess(argv, {}, 60s);
    CAPTURE(member.out);
    CAPTURE(member.err);
    CHECK(member.exitCode == 0);
  }
  const json status = trainerStatus(cluster, 0);
  CHECK(status["refused"] == 0);
  CHECK(status["attaches"] == 2);
}

TEST_CASE("external trainers: PyTorch models with Adam through consensusd.torch.Optimizer") {
  auto overrides = externalModel(300);
  overrides.push_back("consensus.policy=all");  // synchronous: the mean bias is the optimum's
  overrides.push_back("model.dimension=5");     // Linear(4, 1); the later --set wins
  Cluster cluster(2, overrides);
  cluster.startAll();
  std::vector<std::unique_ptr<Child>> trainers;
  for (std::size_t i = 0; i < 2; ++i) {
    REQUIRE(waitFor([&] { return answers(cluster, i); }, 30s));
    trainers.push_back(std::make_unique<Child>(
        pythonArgv("torch_linear.py", {trainerSocket(cluster, i), std::to_string(i)}),
        cluster.path("torch" + std::to_string(i))));
  }
  double biasSum = 0;
  for (std::size_t i = 0; i < 2; ++i) {
    // Finished at the last round: step() said so, the loop ended cleanly.
    const json line = finishedTorchTrainer(cluster, *trainers[i], i);
    CAPTURE(line);
    CHECK(line["steps"] == 300);
    const std::vector<double> weight = line["weight"];
    const std::vector<double> truth{1.0, -2.0, 3.0, 0.5};
    for (std::size_t k = 0; k < 4; ++k) CHECK(weight[k] == doctest::Approx(truth[k]).epsilon(0.05));
    biasSum += line["bias"].get<double>();
  }
  CHECK(biasSum / 2 == doctest::Approx(0.05).epsilon(0.5));
}

TEST_CASE("external trainers: a trainer whose node skipped rounds tells consensusd.torch.Adam") {
  // Node 2's trainer stops before its 10th step until the others have run
  // ahead to the lead bound; its node then skips to them, the round index
  // the trainer is given jumps, and the wrapper must call moved() (else the
  // optimizer takes the drift of the skipped rounds for gradient noise).
  // (A node whose trainer starts last may skip at its start too.)
  auto overrides = externalModel(300);
  overrides.push_back("model.dimension=5");
  overrides.push_back("consensus.max_lead=10");
  Cluster cluster(3, overrides);  // a ring of three: every node the others' neighbour
  cluster.startAll();
  const std::string go = cluster.path("go");
  std::vector<std::unique_ptr<Child>> trainers;
  for (std::size_t i = 0; i < 3; ++i) {
    REQUIRE(waitFor([&] { return answers(cluster, i); }, 30s));
    std::vector<std::string> args{trainerSocket(cluster, i), std::to_string(i), "--nodes", "3"};
    if (i == 2) args.insert(args.end(), {"--pause-at", "10", "--until", go});
    trainers.push_back(std::make_unique<Child>(pythonArgv("torch_linear.py", args),
                                               cluster.path("torch" + std::to_string(i))));
  }
  // Node 2 waits for its trainer's update (a round needs its own step); the
  // others stop at its round + max_lead.
  REQUIRE(waitFor(
      [&] {
        const std::int64_t paused = roundOf(cluster, 2);
        return roundOf(cluster, 0) >= paused + 8 && roundOf(cluster, 1) >= paused + 8;
      },
      60s));
  std::ofstream(go).put('\n');
  for (std::size_t i = 0; i < 3; ++i) {
    const json line = finishedTorchTrainer(cluster, *trainers[i], i);
    CAPTURE(line);
    CHECK(line["moved"] == line["jumps"]);  // told at every jump, and only then
    if (i == 2) CHECK(line["jumps"] >= 1);
    const std::vector<double> weight = line["weight"];
    const std::vector<double> truth{1.0, -2.0, 3.0, 0.5};
    for (std::size_t k = 0; k < 4; ++k) CHECK(weight[k] == doctest::Approx(truth[k]).epsilon(0.05));
  }
}

TEST_CASE("external trainers: local_steps=4, four Adam steps a round and one delta") {
  auto overrides = externalModel(100);
  // The delta taken as it is, and through an outer Nesterov step (lr and
  // mu such that a steady delta moves x as much as plain does: Adam's
  // near-constant steps would otherwise overshoot the optimum 7-fold).
  std::string outer = "plain";
  SUBCASE("outer: plain") {}
  SUBCASE("outer: nesterov") {
    outer = "nesterov";
    overrides.push_back("train.outer_learning_rate=0.5");
    overrides.push_back("train.outer_momentum=0.5");
  }
  SUBCASE("publish: update (the estimate leaves with the delta: x + d averaged)") {
    overrides.push_back("consensus.publish=update");
  }
  CAPTURE(overrides);
  overrides.push_back("train.outer=" + outer);
  const auto lines = trainLinearPair(overrides, {}, 4 * 100);  // 100 rounds of four steps
  // The daemon saw 100 rounds, not 400, of 4 x 32 samples each.
  REQUIRE(!lines.empty());
  CHECK(lines.back()["round"] == 100);
  for (std::size_t k = 0; k + 1 < lines.size(); ++k)
    CHECK(lines[k]["samples"] == 128 * (lines[k]["round"].get<std::int64_t>() + 1));
}

TEST_CASE("external trainers: mix_rounds=1, a round that only mixes after each delta") {
  // 4 Adam steps and a delta, then a round with a zero delta: the next
  // steps start from the two nodes' average (they agree exactly, both
  // mixing everything), plain or through the trainer's outer Nesterov step.
  std::vector<std::string> extra{"--mix-rounds", "1"};
  SUBCASE("no outer step") {}
  SUBCASE("outer step 0.5, 0.5") {
    extra.insert(extra.end(), {"--outer", "0.5", "0.5"});
  }
  CAPTURE(extra.size());
  // 100 rounds: 50 deltas of four steps.
  const auto lines = trainLinearPair(externalModel(100), extra, 4 * 50);
  // Every other round trained 4 x 32 samples; the mixing rounds none.
  REQUIRE(lines.size() > 100);
  for (std::size_t k = 0; k + 1 < lines.size(); ++k) {
    const auto round = lines[k]["round"].get<std::int64_t>();
    CHECK(lines[k]["samples"] == 128 * (round / 2 + 1));
  }
}

TEST_CASE(
    "external trainers: a reconnecting trainer rides out SIGKILL and SIGTERM restarts, ends with "
    "the node") {
  auto overrides = externalModel(0);
  overrides.push_back("checkpoint.every_rounds=10");
  Cluster cluster(1, overrides);
  cluster.start(0);
  REQUIRE(waitFor([&] { return answers(cluster, 0); }, 30s));
  Child trainer(trainerArgv(cluster, 0, {"--reconnect"}), cluster.path("trainer"));
  INFO("the trainer's last lines: " << [&] {
    const std::string lines = readText(cluster.path("trainer"));
    return lines.substr(lines.size() > 1500 ? lines.size() - 1500 : 0);
  }());
  REQUIRE(waitFor([&] { return roundOf(cluster, 0) > 30; }, 60s));
  // Killed: no word to the trainer, which attaches again when the daemon is back.
  cluster.child(0).signal(SIGKILL);
  REQUIRE(cluster.child(0).wait(10s).has_value());
  cluster.start(0);  // resumes from its last checkpoint; the trainer finds it again
  REQUIRE(waitFor([&] { return answers(cluster, 0); }, 30s));
  const std::int64_t resumed = roundOf(cluster, 0);
  CHECK(resumed >= 30);
  CHECK(waitFor([&] { return roundOf(cluster, 0) > resumed + 20; }, 60s));
  CHECK(trainer.running());
  CHECK(trainerStatus(cluster, 0)["attaches"] == 1);  // this daemon's count: once, after restart
  // SIGTERM: maybe a restart (systemctl restart); the trainer waits for it.
  cluster.child(0).signal(SIGTERM);
  REQUIRE(cluster.child(0).wait(10s) == std::optional<int>(0));
  cluster.start(0);
  REQUIRE(waitFor([&] { return answers(cluster, 0); }, 30s));
  const std::int64_t again = roundOf(cluster, 0);
  CHECK(waitFor([&] { return roundOf(cluster, 0) > again + 10; }, 60s));
  CHECK(trainer.running());
  // consensusctl stop: training is over, the trainer's loop ends at once.
  CHECK(ask(cluster, 0, {{"cmd", "stop"}})["ok"] == true);
  REQUIRE(cluster.child(0).wait(30s) == std::optional<int>(0));
  REQUIRE(trainer.wait(10s) == std::optional<int>(0));
  const auto lines = linesOf(cluster.path("trainer"));
  REQUIRE_FALSE(lines.empty());
  CHECK(lines.back()["finished"] == "stop");
}

TEST_CASE("external trainers: model.dimension and dtype auto take the first trainer's shape") {
  auto overrides = externalModel(100);
  overrides.insert(overrides.end(), {"model.dimension=auto", "model.dtype=auto"});
  Cluster cluster(2, overrides);
  cluster.startAll();
  // Waiting for its trainer, a node is starting: no status yet, no port bound.
  REQUIRE(waitFor(
      [&] { return cluster.log(0).find("waiting for a trainer at") != std::string::npos; }, 30s));
  CHECK_FALSE(answers(cluster, 0));
  CHECK(cluster.log(0).find("starting at round") == std::string::npos);

  std::vector<std::unique_ptr<Child>> trainers;
  for (std::size_t i = 0; i < 2; ++i) {
    trainers.push_back(std::make_unique<Child>(trainerArgv(cluster, i, {"--dtype", "float64"}),
                                               cluster.path("trainer" + std::to_string(i))));
  }
  REQUIRE(waitFor([&] { return answers(cluster, 0); }, 30s));
  const json status = ask(cluster, 0, {{"cmd", "config"}});
  CHECK(status["config"].get<std::string>().find("dimension: 8") != std::string::npos);
  CHECK(status["config"].get<std::string>().find("dtype: float64") != std::string::npos);
  for (std::size_t i = 0; i < 2; ++i) {
    REQUIRE(cluster.child(i).wait(120s) == std::optional<int>(0));
    REQUIRE(trainers[i]->wait(30s).has_value());
    CHECK(linesOf(cluster.path("trainer" + std::to_string(i))).size() > 90);
  }
  CHECK(cluster.log(0).find("the node trains 8 float64 parameters, as its first trainer") !=
        std::string::npos);
}

TEST_CASE("external trainers: a node waiting for its first trainer stops on SIGTERM") {
  auto overrides = externalModel(0);
  overrides.push_back("model.dimension=auto");
  Cluster cluster(1, overrides);
  cluster.start(0);
  REQUIRE(waitFor(
      [&] { return cluster.log(0).find("waiting for a trainer at") != std::string::npos; }, 30s));
  cluster.child(0).signal(SIGTERM);
  CHECK(cluster.child(0).wait(10s) == std::optional<int>(0));
  CHECK_FALSE(std::filesystem::exists(trainerSocket(cluster, 0)));  // removed on the way out
}

TEST_CASE("external trainers: a trainer killed mid-run leaves its node up, a new one finishes") {
  auto overrides = externalModel(1000);  // the others run on while n0 has no trainer
  overrides.push_back("consensus.max_lead=5");
  overrides.push_back("consensus.policy=all");  // waits for every neighbour that computes
  // 5 ms a round (the daemon holds each update): on an idle machine the
  // rounds would otherwise be over before the trainer is killed.
  overrides.insert(overrides.end(), {"straggler.kind=constant", "straggler.delay_ms=5"});
  Cluster cluster(3, overrides);
  cluster.startAll();
  const auto trainers = attachQuadraticTrainers(cluster);
  REQUIRE(waitFor([&] { return roundOf(cluster, 0) > 20; }, 60s));
  trainers[0]->signal(SIGKILL);
  REQUIRE(trainers[0]->wait(10s).has_value());
  REQUIRE(waitFor([&] { return trainerStatus(cluster, 0).value("attached", true) == false; }, 10s));
  // Without its trainer node 0 waits, serving status and keep-alives that say
  // it is idle; the others stop waiting for it at once (no hard deadline, no
  // lead bound: it computes nothing) and go on with each other.
  const std::int64_t stuck = roundOf(cluster, 0);
  const auto neighbourState = [&](std::size_t i) {
    const json status = ask(cluster, i, {{"cmd", "status"}});
    for (const json& n : status["neighbors"])
      if (n["id"] == "n0") return n["state"].get<std::string>();
    return std::string();
  };
  CHECK(waitFor([&] { return neighbourState(1) == "idle"; }, 10s));
  REQUIRE(waitFor([&] { return roundOf(cluster, 1) >= stuck + 20; }, 30s));
  CHECK(roundOf(cluster, 0) == stuck);
  const json rounds = ask(cluster, 1, {{"cmd", "status"}});
  CHECK(rounds["cutoffs"].value("deadline", 0) == 0);
  CHECK(cluster.child(0).running());

  Child again(trainerArgv(cluster, 0), cluster.path("again"));
  INFO(cluster.logTails() << "--- n0's trainer status\n"
                          << trainerStatus(cluster, 0).dump() << "\n--- the new trainer"
                          << (again.running() ? " (running)\n" : " (exited)\n")
                          << readText(cluster.path("again")));
  for (std::size_t i = 0; i < 3; ++i) REQUIRE(cluster.child(i).wait(120s) == std::optional<int>(0));
  const auto lines = linesOf(cluster.path("again"));
  REQUIRE_FALSE(lines.empty());
  CHECK(lines.front()["round"] == stuck);  // resumed at the node's round, its x
}

// The language-model example (examples/lm/train.py) through two daemons:
// 4 AdamW steps, then a round that only mixes (12 deltas, 24 rounds), int8
// estimates, dynamic backup neighbours.
TEST_CASE("external trainers: the language model's validation loss falls and the nodes agree") {
  // As scripts/compare-lm runs it: x + the outer step on each delta sent once it is in.
  Cluster cluster(
      2, {"model.kind=external", "model.dimension=auto", "train.rounds=12",
          "consensus.policy=dynamic", "consensus.compression=int8", "consensus.publish=update",
          "train.outer=nesterov", "consensus.peer_timeout_ms=5000"});
  cluster.startAll();
  std::vector<std::unique_ptr<Child>> trainers;
  const std::string script = std::string(CONSENSUSD_SOURCE_DIR) + "/examples/lm/train.py";
  for (std::size_t i = 0; i < 2; ++i) {
    // model.dimension auto: the daemon waits for its trainer before anything else.
    REQUIRE(waitFor(
        [&] { return cluster.log(i).find("waiting for a trainer at") != std::string::npos; }, 30s));
    trainers.push_back(std::make_unique<Child>(
        std::vector<std::string>{"/usr/bin/env",
                                 "PYTHONPATH=" + std::string(CONSENSUSD_SOURCE_DIR) + "/python",
                                 "OPENBLAS_NUM_THREADS=1",
                                 "/usr/bin/python3",
                                 script,
                                 "--socket",
                                 trainerSocket(cluster, i),
                                 "--node",
                                 std::to_string(i),
                                 "--nodes",
                                 "2",
                                 "--size",
                                 "tiny",
                                 "--steps",
                                 "48",
                                 "--local-steps",
                                 "4",
                                 "--eval-every",
                                 "8",
                                 "--eval-windows",
                                 "64",
                                 "--warmup",
                                 "8"},
        cluster.path("lm" + std::to_string(i))));
  }
  // "step S  loss L  val loss V  bpb B  T s": node 0 measures every 8 steps,
  // both nodes their final parameters on all the validation text.
  const auto validationLosses = [&](std::size_t i) {
    std::ifstream in(cluster.path("lm" + std::to_string(i)));
    std::vector<double> losses;
    for (std::string line; std::getline(in, line);) {
      const auto at = line.find("val loss ");
      if (line.rfind("step ", 0) == 0 && at != std::string::npos)
        losses.push_back(std::stod(line.substr(at + 9)));
    }
    return losses;
  };
  std::vector<double> finals;
  for (std::size_t i = 0; i < 2; ++i) {
    REQUIRE(cluster.child(i).wait(300s) == std::optional<int>(0));
    REQUIRE(trainers[i]->wait(60s) == std::optional<int>(0));
    const std::vector<double> losses = validationLosses(i);
    CAPTURE(readText(cluster.path("lm" + std::to_string(i))));
    REQUIRE(losses.size() == (i == 0 ? 6u : 1u));  // steps 8, 16, ..., 40, and the end
    finals.push_back(losses.back());
    // At x_0 every byte is about equally likely: ln 256 = 5.55 nats.
    CHECK(losses.back() < 0.8 * std::log(256.0));
  }
  CHECK(std::abs(finals[0] - finals[1]) < 0.02 * finals[0]);  // one model, near enough
}
