// Four daemons on four "hosts" (network namespaces on one bridge, made by
// scripts/netns-testbed), real TCP between addresses. One node is cut off
// (its link down): both sides keep training; after the heal the network
// re-converges. Needs root; without it the test says so and passes nothing.

#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>

#include "hosts.hpp"

using consensusd::testing::Child;
using consensusd::testing::distance;
using consensusd::testing::Hosts;
using consensusd::testing::kScript;
using consensusd::testing::neighbors;
using consensusd::testing::parameters;
using consensusd::testing::readText;
using consensusd::testing::roundOf;
using consensusd::testing::runProcess;
using consensusd::testing::startIn;
using consensusd::testing::status;
using consensusd::testing::TempDir;
using consensusd::testing::waitFor;
using consensusd::testing::writeCluster;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t kNodes = 4;

// Each node's round and the end of its log (n<i>.log in `dir`).
std::string logTails(const TempDir& dir, std::size_t nodes) {
  std::string text;
  for (std::size_t i = 0; i < nodes; ++i) {
    const std::string log = readText(dir.path() + "/n" + std::to_string(i) + ".log");
    text += "n" + std::to_string(i) + " round " + std::to_string(roundOf(dir, i)) +
            ", log ends:\n" + log.substr(log.size() > 1500 ? log.size() - 1500 : 0) + "\n";
  }
  return text;
}

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
  INFO(logTails(dir, kNodes));  // shown only when a check fails
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

TEST_CASE("the netns testbed grows a running ring of 4 hosts to 6 and shrinks it to 3") {
  if (getuid() != 0) {
    MESSAGE("skipped: network namespaces need root");
    return;
  }
  const TempDir run;  // the testbed's run folder
  const std::string prefix = "cng" + std::to_string(getpid() % 100000);
  const std::string subnet = "10.79." + std::to_string(getpid() % 200);
  const std::string binaries =
      "CONSENSUSD_BIN=" + std::filesystem::path(CONSENSUSD).parent_path().string();
  struct Down {  // whatever happens: no namespace outlives the test
    std::string prefix;
    ~Down() { runProcess({kScript, "down", prefix}, {}, 60s); }
  } down{prefix};
  const auto namespaces = [&] {
    std::set<std::string> names;
    std::istringstream list(runProcess({"/usr/sbin/ip", "netns", "list"}).out);
    for (std::string name, rest; list >> name && std::getline(list, rest);)
      if (name.rfind(prefix, 0) == 0) names.insert(name.substr(prefix.size()));
    return names;
  };
  const auto testbed = [&](const std::string& command, const std::string& nodes) {
    const auto result =
        runProcess({"/usr/bin/env", binaries, kScript, command, run.path(), nodes}, {}, 120s);
    INFO(result.out << result.err);
    CHECK(result.exitCode == 0);
    return result.out;
  };
  const auto neighborIds = [&](std::size_t i) {
    std::set<std::string> ids;
    for (const json& n : neighbors(run.path() + "/n" + std::to_string(i) + ".sock"))
      ids.insert(n["id"].get<std::string>());
    return ids;
  };
  const auto allPast = [&](std::size_t nodes, std::int64_t round) {
    for (std::size_t i = 0; i < nodes; ++i)
      if (roundOf(run, i) <= round) return false;
    return true;
  };

  Child testbedRun({"/usr/bin/env", binaries,
                    kScript,        "run",
                    "--nodes",      "4",
                    "--run",        run.path(),
                    "--prefix",     prefix,
                    "--subnet",     subnet,
                    "--set",        "data.dataset=synthetic-logistic",
                    "--set",        "model.kind=logistic",
                    "--set",        "train.eval_every_rounds=0",
                    "--set",        "train.rounds=0",
                    "--set",        "consensus.peer_timeout_ms=1000"},
                   run.path() + "/testbed.log");
  // What the testbed and each daemon last logged, shown only when a check fails.
  INFO(readText(run.path() + "/testbed.log"));
  INFO(logTails(run, 6));
  REQUIRE(waitFor([&] { return allPast(4, 200); }, 60s));

  // Grown: two namespaces and daemons more; the running nodes took the graph first.
  const std::string grown = testbed("grow", "6");
  CHECK(grown.find("n0: applied at round") != std::string::npos);
  CHECK(grown.find("n4: not running") != std::string::npos);
  CHECK(namespaces() == std::set<std::string>{"0", "1", "2", "3", "4", "5"});
  for (const std::size_t i : {std::size_t{4}, std::size_t{5}}) {
    CAPTURE(i);
    CHECK(waitFor([&] { return status(run, i).value("joined_at_round", std::int64_t{-1}) > 0; },
                  60s));
  }
  CHECK(neighborIds(0) == std::set<std::string>{"n1", "n5"});
  const std::int64_t before = roundOf(run, 5);
  CHECK(waitFor([&] { return allPast(6, before + 200); }, 60s));
  const std::string hash = status(run, 5)["topology_hash"];
  for (std::size_t i = 0; i < 6; ++i) CHECK(status(run, i)["topology_hash"] == hash);

  // Shrunk: n3..n5 said goodbye and their namespaces are gone; the rest go on.
  testbed("shrink", "3");
  CHECK(namespaces() == std::set<std::string>{"0", "1", "2"});
  for (const std::size_t i : {std::size_t{3}, std::size_t{4}, std::size_t{5}})
    CHECK(readText(run.path() + "/n" + std::to_string(i) + ".log").find("stopped at round") !=
          std::string::npos);
  CHECK(neighborIds(0) == std::set<std::string>{"n1", "n2"});
  const std::int64_t shrunk = roundOf(run, 0);
  CHECK(waitFor([&] { return allPast(3, shrunk + 200); }, 60s));
  CHECK(status(run, 0).value("suspects", 9) == 0);

  // Stopped: the testbed takes everything down.
  testbedRun.signal(SIGTERM);
  CHECK(testbedRun.wait(90s).has_value());
  CHECK(namespaces().empty());
}
