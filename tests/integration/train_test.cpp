// The documented single-node baselines reach their targets on the real
// Fashion-MNIST test set (issue: data and models). Slow: real training.

#include <doctest/doctest.h>

#include <string>

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
