// Four daemons on four "hosts" (network namespaces on one bridge, made by
// scripts/netns-testbed), real TCP between addresses. One node is cut off
// (its link down): both sides keep training; after the heal the network
// re-converges. Needs root; without it the test says so and passes nothing.

#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>

#include "hosts.hpp"

using consensusd::testing::Child;
using consensusd::testing::distance;
using consensusd::testing::Hosts;
using consensusd::testing::parameters;
using consensusd::testing::roundOf;
using consensusd::testing::startIn;
using consensusd::testing::status;
using consensusd::testing::TempDir;
using consensusd::testing::waitFor;
using consensusd::testing::writeCluster;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t kNodes = 4;

}  // namespace

TEST_CASE(
    "four hosts on a bridge: a cut-off node and the rest both train, and after the heal they "
    "agree") {
  if (getuid() != 0) {
    MESSAGE("skipped: network namespaces need root");
    return;
  }
  const Hosts hosts(kNodes);
  const TempDir dir;
  writeCluster(dir, hosts, kNodes);
  std::vector<std::unique_ptr<Child>> daemons;
  for (std::size_t i = 0; i < kNodes; ++i) {
    // Label shards: a node cut off drifts towards its own two classes.
    daemons.push_back(
        startIn(hosts, dir, i,
                {"data.dataset=synthetic-logistic", "model.kind=logistic", "data.partition=shards",
                 "train.eval_every_rounds=0", "train.rounds=0", "consensus.peer_timeout_ms=500",
                 "checkpoint.every_rounds=0"}));
  }
  const auto allPast = [&](std::int64_t round) {
    for (std::size_t i = 0; i < kNodes; ++i)
      if (roundOf(dir, i) <= round) return false;
    return true;
  };
  REQUIRE(waitFor([&] { return allPast(200); }, 60s));
  const double together = distance(parameters(dir, 3), parameters(dir, 1));

  hosts.link(3, false);  // n3 alone | n0, n1, n2
  const auto suspectOf3 = [&] {
    const json seen = status(dir, 0);  // a local: the loop must not dangle
    for (const auto& n : seen.value("neighbors", json::array()))
      if (n["id"] == "n3") return n["state"] == "suspect";
    return false;
  };
  REQUIRE(waitFor(suspectOf3, 10s));
  const std::int64_t cutAt3 = roundOf(dir, 3);
  const std::int64_t cutAt1 = roundOf(dir, 1);
  CHECK(waitFor([&] { return roundOf(dir, 3) > cutAt3 + 300 && roundOf(dir, 1) > cutAt1 + 300; },
                30s));  // both sides keep training
  const double apart = distance(parameters(dir, 3), parameters(dir, 1));
  INFO("distance n3-n1: together " << together << ", cut " << apart);
  CHECK(apart > 2 * together);

  hosts.link(3, true);
  CHECK(waitFor([&] { return !suspectOf3() && status(dir, 3).value("suspects", 9) == 0; }, 20s));
  // Whichever side ran more rounds while cut (thousands, alone n3 waits for
  // nobody), the other catches up: the one ahead waits at the lead bound
  // while the rest mix its newest estimate, or the one behind skips.
  CHECK(waitFor([&] { return std::abs(roundOf(dir, 3) - roundOf(dir, 1)) < 50; }, 60s));
  const std::int64_t caughtUp = roundOf(dir, 1);
  REQUIRE(waitFor([&] { return roundOf(dir, 3) > caughtUp + 300; }, 30s));
  const double healed = distance(parameters(dir, 3), parameters(dir, 1));
  MESSAGE("distance n3-n1: together " << together << ", cut " << apart << ", healed " << healed);
  CHECK(healed < 0.5 * apart);
}
