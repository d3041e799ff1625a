// The documented single-node baselines reach their targets on the real
// Fashion-MNIST test set (issue: data and models). Slow: real training.

#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>

#include "cluster.hpp"
#include "cluster_status.hpp"
#include "process.hpp"

using consensusd::testing::runProcess;

namespace {

double finalAccuracy(const std::string& example) {
  const auto result =
      runProcess({CONSENSUSCTL, "train", "-q", "--config",
                  std::string(CONSENSUSD_SOURCE_DIR) + "/config/examples/" + example},
                 {}, std::chrono::minutes(10));
  REQUIRE(result.exitCode == 0);
  const std::string marker = "test accuracy ";
  const std::size_t at = result.out.find(marker);
  REQUIRE(at != std::string::npos);
  return std::stod(result.out.substr(at + marker.size()));
}

}  // namespace

TEST_CASE("softmax regression reaches 0.83 on Fashion-MNIST") {
  CHECK(finalAccuracy("train-softmax.yaml") >= 0.83);
}

TEST_CASE("an MLP with 256 hidden units reaches 0.87 on Fashion-MNIST") {
  CHECK(finalAccuracy("train-mlp.yaml") >= 0.87);
}

TEST_CASE("8 daemons on a ring reach 0.80 on Fashion-MNIST, and their disagreement falls") {
  consensusd::testing::Cluster cluster(
      8,
      {"data.partition=iid", "model.kind=softmax", "train.rounds=2000", "train.learning_rate=0.1",
       "train.schedule=cosine", "train.eval_every_rounds=500", "consensus.policy=dynamic"});
  cluster.startAll();
  for (std::size_t i = 0; i < cluster.size(); ++i)
    REQUIRE(cluster.child(i).wait(std::chrono::minutes(5)) == 0);
  for (std::size_t i = 0; i < cluster.size(); ++i) {
    CAPTURE(i);
    std::ifstream metrics(cluster.path(consensusd::testing::Cluster::id(i) + ".jsonl"));
    std::vector<double> distances;
    nlohmann::json final;
    for (std::string line; std::getline(metrics, line);) {
      const auto record = nlohmann::json::parse(line);
      if (record.contains("final")) {
        final = record;
      } else {
        distances.push_back(record["distance"].get<double>());
      }
    }
    REQUIRE(distances.size() >= 1000);
    CHECK(final["round"] == 2000);
    CHECK(final["accuracy"].get<double>() >= 0.80);
    const auto mean = [&](std::size_t from, std::size_t to) {
      return std::accumulate(distances.begin() + static_cast<std::ptrdiff_t>(from),
                             distances.begin() + static_cast<std::ptrdiff_t>(to), 0.0) /
             static_cast<double>(to - from);
    };
    CHECK(mean(distances.size() - 100, distances.size()) < 0.5 * mean(10, 110));
  }
}

TEST_CASE(
    "4 daemons with PyTorch CNN trainers reach 0.85 on Fashion-MNIST, a straggler among them") {
  // examples/torch/train.py as each node's trainer: consensusd.torch.Optimizer
  // over Adam, delta updates; node 1 emulates a bimodal straggler (the daemon
  // holds its trainer's update).
  constexpr int kRounds = 600;
  consensusd::testing::Cluster cluster(
      4, {"model.kind=external", "model.dimension=215370",
          "train.rounds=" + std::to_string(kRounds), "consensus.policy=dynamic"});
  cluster.start(0);
  cluster.start(2);
  cluster.start(3);
  cluster.start(1, {"straggler.kind=bimodal", "straggler.base_compute_ms=20"});
  std::vector<std::unique_ptr<consensusd::testing::Child>> trainers;
  for (std::size_t i = 0; i < cluster.size(); ++i) {
    const std::string id = consensusd::testing::Cluster::id(i);
    trainers.push_back(std::make_unique<consensusd::testing::Child>(
        std::vector<std::string>{
            "/usr/bin/env", "PYTHONPATH=" + std::string(CONSENSUSD_SOURCE_DIR) + "/python",
            "OMP_NUM_THREADS=1", "/usr/bin/python3",
            std::string(CONSENSUSD_SOURCE_DIR) + "/examples/torch/train.py", "--socket",
            cluster.path(id + ".trainer.sock"), "--node", std::to_string(i), "--nodes", "4",
            "--rounds", std::to_string(kRounds), "--eval-every", "200"},
        cluster.path(id + ".trainer.log")));
  }
  for (std::size_t i = 0; i < cluster.size(); ++i) {
    CAPTURE(i);
    REQUIRE(cluster.child(i).wait(std::chrono::minutes(8)) == 0);
    REQUIRE(trainers[i]->wait(std::chrono::minutes(2)) == 0);
    std::ifstream metrics(cluster.path(consensusd::testing::Cluster::id(i) + ".jsonl"));
    nlohmann::json final;
    for (std::string line; std::getline(metrics, line);) {
      const auto record = nlohmann::json::parse(line);
      if (record.contains("final")) final = record;
    }
    CAPTURE(final);
    CHECK(final["round"] == kRounds);
    CHECK(final["accuracy"].get<double>() >=
          0.85);  // the trainer's test at round 599, all 10,000 (0.866 here)
    CHECK(final["test_loss"].get<double>() > 0);
  }
}

TEST_CASE("a ring of 8 grown to 10 mid-run ends within 1 point of a ring of 10 from the start") {
  // A round of at least 4 ms (3 ms of emulated compute on every node, both
  // runs): the eight are still early in the run when the newcomers, which
  // take seconds to load Fashion-MNIST, start (at 600 rounds a second they
  // had finished first, and the two trained on their own).
  constexpr int kRounds = 3000;
  const std::vector<std::string> settings{
      "data.partition=iid",        "model.kind=softmax",
      "train.learning_rate=0.1",   "train.schedule=cosine",
      "train.eval_every_rounds=0", "consensus.policy=dynamic",
      "checkpoint.every_rounds=0", "train.rounds=" + std::to_string(kRounds),
      "straggler.kind=constant",   "straggler.delay_ms=3"};
  using consensusd::testing::Cluster;
  const auto finalAccuracies = [&](Cluster& cluster) {
    std::vector<double> accuracies;
    for (std::size_t i = 0; i < cluster.size(); ++i) {
      CAPTURE(i);
      REQUIRE(cluster.child(i).wait(std::chrono::minutes(5)) == 0);
      std::ifstream metrics(cluster.path(Cluster::id(i) + ".jsonl"));
      nlohmann::json final;
      for (std::string line; std::getline(metrics, line);) {
        const auto record = nlohmann::json::parse(line);
        if (record.contains("final")) final = record;
      }
      REQUIRE(final["round"] == kRounds);
      accuracies.push_back(final["accuracy"].get<double>());
    }
    return accuracies;
  };

  // Ten nodes from the start.
  Cluster fromStart(10, settings);
  fromStart.startAll();
  const std::vector<double> baseline = finalAccuracies(fromStart);
  const double mean =
      std::accumulate(baseline.begin(), baseline.end(), 0.0) / static_cast<double>(baseline.size());

  // Eight, then ten from round 500: applied to the running eight, then n8
  // and n9 start fresh on the new file and take their neighbours' state.
  Cluster grown(10, settings, 8);
  for (std::size_t i = 0; i < 8; ++i) grown.start(i);
  REQUIRE(consensusd::testing::waitFor(
      [&] {
        return consensusd::testing::answers(grown, 0) &&
               consensusd::testing::roundOf(grown, 0) >= 500;
      },
      std::chrono::minutes(2)));
  std::vector<std::size_t> ten(10);
  std::iota(ten.begin(), ten.end(), 0);
  const std::string ring10 = grown.writeRing("ring10.yaml", ten);
  const auto applied = runProcess({CONSENSUSCTL, "apply", ring10}, {}, std::chrono::minutes(2));
  INFO(applied.out << applied.err);
  REQUIRE(applied.exitCode == 0);
  grown.start(8, {"topology.file=" + ring10});
  grown.start(9, {"topology.file=" + ring10});
  // Both newcomers take the cluster's state ...
  for (const std::size_t i : {std::size_t{8}, std::size_t{9}}) {
    CAPTURE(i);
    CHECK(consensusd::testing::waitFor(
        [&] { return grown.log(i).find("joined a running cluster at round") != std::string::npos; },
        std::chrono::minutes(1)));
  }
  // ... while the eight still train (not after they finished).
  CHECK(consensusd::testing::answers(grown, 0));
  const std::vector<double> after = finalAccuracies(grown);
  INFO(grown.logTails(20));
  MESSAGE("ten from the start: mean " << mean << "; grown from eight: " << after[0] << " .. n9 "
                                      << after[9]);
  for (std::size_t i = 0; i < after.size(); ++i) {
    CAPTURE(i);
    CHECK(std::abs(after[i] - mean) <= 0.01);
  }
}
