// Membership changes while a cluster of real daemons trains on loopback: a
// graph applied to running nodes (consensusctl apply, SIGHUP), nodes added
// and removed, bad files, a node down during the change.

#include <doctest/doctest.h>
#include <signal.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cluster.hpp"
#include "cluster_status.hpp"
#include "config_map_volume.hpp"
#include "consensusd/config/load.hpp"

using consensusd::testing::answers;
using consensusd::testing::ask;
using consensusd::testing::Cluster;
using consensusd::testing::ConfigMapVolume;
using consensusd::testing::kFast;
using consensusd::testing::roundOf;
using consensusd::testing::runProcess;
using consensusd::testing::waitFor;
using consensusd::testing::with;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

constexpr int kPeerTimeoutMs = 4000;
const std::vector<std::string> kTraining =
    with(kFast, {"train.rounds=0", "consensus.peer_timeout_ms=" + std::to_string(kPeerTimeoutMs),
                 "train.learning_rate=0.5", "checkpoint.every_rounds=100000"});

std::vector<std::size_t> range(std::size_t from, std::size_t to) {
  std::vector<std::size_t> out;
  for (std::size_t i = from; i < to; ++i) out.push_back(i);
  return out;
}

// The complete records of a node's metrics file (the last line may be half written).
std::vector<json> records(const Cluster& cluster, std::size_t i) {
  std::vector<json> out;
  std::ifstream in(cluster.path(Cluster::id(i) + ".jsonl"));
  for (std::string line; std::getline(in, line);) {
    json record = json::parse(line, nullptr, false);
    if (!record.is_discarded() && record.contains("duration_ms")) out.push_back(std::move(record));
  }
  return out;
}

json status(const Cluster& cluster, std::size_t i) {
  return ask(cluster, i, {{"cmd", "status"}});
}

std::vector<std::string> neighborIds(const Cluster& cluster, std::size_t i) {
  std::vector<std::string> ids;
  const json answer = ask(cluster, i, {{"cmd", "neighbors"}});
  for (const auto& n : answer["neighbors"]) ids.push_back(n["id"]);
  std::sort(ids.begin(), ids.end());
  return ids;
}

bool allAnswer(const Cluster& cluster, const std::vector<std::size_t>& nodes) {
  for (const std::size_t i : nodes)
    if (!answers(cluster, i)) return false;
  return true;
}

consensusd::testing::ProcessResult apply(const std::vector<std::string>& args) {
  std::vector<std::string> argv{CONSENSUSCTL, "apply"};
  argv.insert(argv.end(), args.begin(), args.end());
  return runProcess(argv, "", 150s);
}

// The longest round of `node` that ended after `since` (seconds of its clock).
json longestRoundSince(const Cluster& cluster, std::size_t node, double since) {
  json longest = {{"duration_ms", 0.0}};
  for (const json& r : records(cluster, node))
    if (r["t"].get<double>() > since && r["duration_ms"] > longest["duration_ms"]) longest = r;
  return longest;
}

double clockOf(const Cluster& cluster, std::size_t node) {
  const std::vector<json> all = records(cluster, node);
  return all.empty() ? 0 : all.back()["t"].get<double>();
}

}  // namespace

TEST_CASE("a ring of 8 grows to 10 while it trains: newcomers start from the cluster, none waits") {
  Cluster cluster(10, kTraining, 8);
  const std::vector<std::size_t> old = range(0, 8);
  for (const std::size_t i : old) cluster.start(i);
  REQUIRE(waitFor([&] { return allAnswer(cluster, old); }, 60s));
  REQUIRE(waitFor([&] { return roundOf(cluster, 3) > 300; }, 60s));
  std::vector<double> since;
  for (const std::size_t i : old) since.push_back(clockOf(cluster, i));

  // The running nodes first (n8 and n9 are not running yet: said so), then the newcomers.
  const std::string ring10 = cluster.writeRing("ring10.yaml", range(0, 10));
  const auto applied = apply({ring10});
  INFO(applied.out, applied.err);
  REQUIRE(applied.exitCode == 0);
  CHECK(applied.out.find("n8: not running") != std::string::npos);
  CHECK(applied.out.find("n0: applied at round") != std::string::npos);
  CHECK(applied.out.find("neighbours added [\"n9\"], removed [\"n7\"]") != std::string::npos);
  CHECK(applied.out.find("n3: applied at round") != std::string::npos);
  for (const std::size_t i : {std::size_t{8}, std::size_t{9}})
    cluster.start(i, {"topology.file=" + ring10});
  REQUIRE(waitFor([&] { return allAnswer(cluster, {8, 9}); }, 60s));

  INFO(cluster.logTails(20));
  // Each newcomer took its neighbours' state: its first mix jumped to the
  // cluster, and the rounds after it move it by far less.
  for (const std::size_t i : {std::size_t{8}, std::size_t{9}}) {
    CAPTURE(i);
    // (At the round the lead bound allows beside the other newcomer: the two climb together.)
    REQUIRE(waitFor([&] { return status(cluster, i)["joined_at_round"].get<std::int64_t>() > 0; },
                    60s));
    double jump = -1;
    std::vector<double> after;
    REQUIRE(waitFor(
        [&] {
          jump = -1;
          after.clear();
          for (const json& r : records(cluster, i)) {
            if (r["adopted"] == true)
              jump = r["distance"];
            else if (jump >= 0 && after.size() < 5)
              after.push_back(r["distance"]);
          }
          return jump > 0 && after.size() == 5;
        },
        30s));
    CAPTURE(jump);
    for (const double d : after) CHECK(d < 0.5 * jump);
  }
  // Every node runs the new graph; n0's neighbours are n1 and n9.
  const std::string hash = status(cluster, 8)["topology_hash"];
  for (std::size_t i = 0; i < 10; ++i) {
    CAPTURE(i);
    const json s = status(cluster, i);
    CHECK(s["topology_hash"] == hash);
    CHECK(s["degree"] == 2);
  }
  CHECK(neighborIds(cluster, 0) == std::vector<std::string>{"n1", "n9"});
  // The operator's table shows the newcomers' catch-up.
  const auto top = runProcess({CONSENSUSCTL, "top", ring10, "--once"});
  CHECK(top.exitCode == 0);
  CHECK(top.out.find("joined at") != std::string::npos);
  CHECK(waitFor(
      [&] {
        const json answer = ask(cluster, 0, {{"cmd", "neighbors"}});  // a local: no dangling
        for (const auto& n : answer["neighbors"])
          if (n["state"] != "fresh" || n["previous_graph"] == true) return false;
        return true;
      },
      30s));
  // The nodes whose edges did not change never waited out a peer timeout.
  REQUIRE(waitFor([&] { return roundOf(cluster, 3) > roundOf(cluster, 8) - 5; }, 30s));
  for (std::size_t i = 1; i < 7; ++i) {
    CAPTURE(i);
    const json longest = longestRoundSince(cluster, i, since[i]);
    CAPTURE(longest.dump());
    CHECK(longest["duration_ms"].get<double>() < kPeerTimeoutMs / 2.0);
  }
}

TEST_CASE(
    "a ring of 8 shrinks to 6: no round waits for the removed, one still running is refused") {
  Cluster cluster(8, kTraining);
  cluster.startAll();
  REQUIRE(waitFor([&] { return allAnswer(cluster, range(0, 8)); }, 60s));
  REQUIRE(waitFor([&] { return roundOf(cluster, 0) > 300; }, 60s));
  // n6 is stopped; n7 is forgotten and keeps running on the old graph.
  cluster.child(6).signal(SIGTERM);
  REQUIRE(cluster.child(6).wait(30s).has_value());
  const std::string ring6 = cluster.writeRing("ring6.yaml", range(0, 6));
  const auto applied = apply({ring6});
  INFO(applied.out, applied.err);
  REQUIRE(applied.exitCode == 0);
  CHECK(applied.out.find("n7:") == std::string::npos);  // not in the file: not asked
  const double since = clockOf(cluster, 0);

  INFO(cluster.logTails(20));
  CHECK(neighborIds(cluster, 0) == std::vector<std::string>{"n1", "n5"});
  CHECK(neighborIds(cluster, 5) == std::vector<std::string>{"n0", "n4"});
  const std::int64_t at = roundOf(cluster, 0);
  REQUIRE(waitFor([&] { return roundOf(cluster, 0) > at + 200; }, 60s));
  // n7 is still sending to n0, which refuses and counts it.
  REQUIRE(cluster.child(7).running());
  CHECK(waitFor([&] { return status(cluster, 0)["rejects"].value("not_neighbor", 0) > 0; }, 30s));
  // ... and tells it why: n7 counts n0 out as a neighbour that left.
  CHECK(waitFor([&] { return status(cluster, 7)["removed_by"].get<std::uint64_t>() > 0; }, 30s));
  CHECK(cluster.log(7).find("n0 removed this node from its graph") != std::string::npos);
  CHECK(waitFor(
      [&] {
        const json seen = ask(cluster, 7, {{"cmd", "neighbors"}});  // a local: no dangling
        for (const auto& n : seen["neighbors"])
          if (n["id"] == "n0") return n["state"] == "left";
        return false;
      },
      30s));
  for (const std::size_t i : {std::size_t{0}, std::size_t{5}}) {
    CAPTURE(i);
    const json longest = longestRoundSince(cluster, i, since);
    CAPTURE(longest.dump());
    CHECK(longest["duration_ms"].get<double>() < kPeerTimeoutMs / 2.0);
    const json s = status(cluster, i);
    CHECK(s["degree"] == 2);
    CHECK(s["suspects"] == 0);
  }
}

TEST_CASE("a bad topology applied is refused with its file and line, and nothing changes") {
  Cluster cluster(3, kTraining);
  cluster.startAll();
  REQUIRE(waitFor([&] { return allAnswer(cluster, range(0, 3)); }, 60s));
  const json before = status(cluster, 0);

  // Malformed: consensusctl finds it before any node hears of it.
  const std::string broken = cluster.path("broken.yaml");
  {
    std::ofstream out(broken);
    out << "nodes:\n  - {id: n0, endpoint: \"tcp://127.0.0.1:1\"}\nedges: [[n0, n9]]\n";
  }
  const auto malformed = apply({broken});
  CHECK(malformed.exitCode == 78);
  CHECK(malformed.err.find(broken + ":3:") != std::string::npos);

  // Well-formed, but without n0: n0 refuses it (78, the file and key).
  const std::string without = cluster.writeRing("without-n0.yaml", {1, 2});
  const auto refused = apply({without, "--socket", cluster.socket(0)});
  CHECK(refused.exitCode == 78);
  CHECK(refused.err.find(without + ":1:1") != std::string::npos);
  CHECK(refused.err.find("node 'n0' is not in this topology") != std::string::npos);

  // SIGHUP with a broken topology.file: logged, nothing changes, still training.
  {
    std::ofstream out(cluster.path("topology.yaml"));
    out << "nodes: [\n";
  }
  cluster.child(0).signal(SIGHUP);
  REQUIRE(waitFor(
      [&] {
        return cluster.log(0).find("topology not applied (nothing changed)") != std::string::npos;
      },
      30s));
  const json after = status(cluster, 0);
  CHECK(after["topology_hash"] == before["topology_hash"]);
  CHECK(after["topology_changes"] == 0);
  const std::int64_t at = after["round"];
  CHECK(waitFor([&] { return roundOf(cluster, 0) > at + 50; }, 30s));
  CHECK(cluster.child(0).running());
}

TEST_CASE(
    "SIGHUP applies the rewritten topology file; a node down during the change resumes with it") {
  // A ring of 4; n3 goes down, the file becomes a ring of 0, 1, 3, 2 (n3 and
  // n2 swap places), and the others reload it. n3 comes back from its checkpoint.
  Cluster cluster(4, with(kTraining, {"checkpoint.every_rounds=50"}));
  cluster.startAll();
  REQUIRE(waitFor([&] { return allAnswer(cluster, range(0, 4)); }, 60s));
  REQUIRE(waitFor([&] { return roundOf(cluster, 3) > 200; }, 60s));
  cluster.child(3).signal(SIGTERM);
  REQUIRE(cluster.child(3).wait(30s).has_value());
  cluster.writeRing("topology.yaml", {0, 1, 3, 2});
  for (const std::size_t i : range(0, 3)) cluster.child(i).signal(SIGHUP);
  INFO(cluster.logTails(20));
  REQUIRE(waitFor([&] { return status(cluster, 1)["topology_changes"] == 1; }, 30s));
  CHECK(neighborIds(cluster, 1) == std::vector<std::string>{"n0", "n3"});
  cluster.start(3);
  REQUIRE(waitFor([&] { return answers(cluster, 3); }, 60s));
  CHECK(cluster.log(3).find("resumed from") != std::string::npos);
  CHECK(status(cluster, 3)["joined_at_round"] == -1);
  CHECK(neighborIds(cluster, 3) == std::vector<std::string>{"n1", "n2"});
  for (const std::size_t i : range(0, 3)) {
    CAPTURE(i);
    CHECK(waitFor([&] { return status(cluster, i)["topology_changes"] == 1; }, 30s));
  }
  CHECK(waitFor([&] { return roundOf(cluster, 3) + 10 >= roundOf(cluster, 0); }, 30s));
  CHECK(waitFor(
      [&] {
        const json answer = ask(cluster, 1, {{"cmd", "neighbors"}});  // a local: no dangling
        for (const auto& n : answer["neighbors"])
          if (n["state"] != "fresh") return false;
        return true;
      },
      30s));
}

TEST_CASE(
    "with CURVE, a node added by a change is admitted with its key, and refused once removed") {
  Cluster cluster(4, kTraining, 3);
  // Keys for all four (consensusctl keygen over the larger graph); the
  // running graph of three carries its members' public keys.
  const std::string ring4 = cluster.writeRing("ring4.yaml", range(0, 4));
  const auto keygen = runProcess(
      {CONSENSUSCTL, "keygen", "--topology", ring4, "--dir", cluster.path("keys"), "-o", ring4});
  REQUIRE_MESSAGE(keygen.exitCode == 0, keygen.err);
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < 4; ++i)
    keys.push_back(
        consensusd::config::readKeyFile(cluster.path("keys/" + Cluster::id(i) + ".key")).publicKey);
  cluster.writeRing("topology.yaml", range(0, 3), {keys[0], keys[1], keys[2]});
  const auto curve = [](std::size_t i) {
    return std::vector<std::string>{"security.curve=true",
                                    "security.secret_key_file=keys/" + Cluster::id(i) + ".key"};
  };
  for (std::size_t i = 0; i < 3; ++i) cluster.start(i, curve(i));
  REQUIRE(waitFor([&] { return allAnswer(cluster, range(0, 3)); }, 60s));
  REQUIRE(waitFor([&] { return roundOf(cluster, 0) > 200; }, 60s));

  const auto grown = apply({ring4});
  INFO(grown.out, grown.err);
  REQUIRE(grown.exitCode == 0);
  std::vector<std::string> withN3 = curve(3);
  withN3.push_back("topology.file=" + ring4);
  cluster.start(3, withN3);
  INFO(cluster.logTails(20));
  REQUIRE(waitFor([&] { return answers(cluster, 3); }, 60s));
  CHECK(
      waitFor([&] { return status(cluster, 3)["joined_at_round"].get<std::int64_t>() > 0; }, 60s));
  // n0 and n2 mix n3's estimates: its key was admitted with the file.
  for (const std::size_t i : {std::size_t{0}, std::size_t{2}}) {
    CAPTURE(i);
    CHECK(waitFor(
        [&] {
          const json answer = ask(cluster, i, {{"cmd", "neighbors"}});  // a local: no dangling
          for (const auto& n : answer["neighbors"])
            if (n["id"] == "n3") return n["mixed"].get<std::uint64_t>() > 0;
          return false;
        },
        30s));
    CHECK(status(cluster, i)["rejects"].value("auth", 0) == 0);
  }

  // Back to three, n3 left running: refused (on the connection it has) and told.
  const std::string ring3 =
      cluster.writeRing("ring3.yaml", range(0, 3), {keys[0], keys[1], keys[2]});
  const auto shrunk = apply({ring3});
  INFO(shrunk.out, shrunk.err);
  REQUIRE(shrunk.exitCode == 0);
  CHECK(waitFor([&] { return status(cluster, 3)["removed_by"].get<std::uint64_t>() > 0; }, 30s));
  CHECK(waitFor([&] { return status(cluster, 0)["rejects"].value("not_neighbor", 0) > 0; }, 30s));
  const std::int64_t at = roundOf(cluster, 0);
  CHECK(waitFor([&] { return roundOf(cluster, 0) > at + 100; }, 30s));
}

TEST_CASE("a joiner whose only neighbour stops answering says so, trains alone, and joins later") {
  Cluster cluster(2, kTraining);
  cluster.start(0);
  REQUIRE(waitFor([&] { return answers(cluster, 0); }, 60s));
  REQUIRE(waitFor([&] { return roundOf(cluster, 0) > 300; }, 60s));
  cluster.child(0).signal(SIGSTOP);  // its port still accepts; nothing answers
  cluster.start(1);
  INFO(cluster.logTails(20));
  REQUIRE(waitFor([&] { return answers(cluster, 1); }, 60s));
  CHECK(waitFor([&] { return cluster.log(1).find("no neighbour answers") != std::string::npos; },
                30s));
  CHECK(status(cluster, 1)["joined_at_round"] == -1);
  const std::int64_t alone = roundOf(cluster, 1);
  CHECK(waitFor([&] { return roundOf(cluster, 1) > alone + 20; }, 30s));  // it trains meanwhile
  cluster.child(0).signal(SIGCONT);
  // Both go on together again.
  const std::int64_t at0 = roundOf(cluster, 0);
  CHECK(waitFor([&] { return roundOf(cluster, 0) > at0 + 200; }, 30s));
  CHECK(waitFor(
      [&] {
        const json answer = ask(cluster, 1, {{"cmd", "neighbors"}});  // a local: no dangling
        return answer["neighbors"][0]["mixed"].get<std::uint64_t>() > 0;
      },
      30s));
}

TEST_CASE("topology.watch: a ConfigMap volume's update grows and shrinks the ring in place") {
  // The nodes read their topology from a folder the kubelet's way of
  // updating a ConfigMap keeps current: no signal, no restart.
  Cluster cluster(5, kTraining, 4);
  const auto text = [&](const std::string& name, const std::vector<std::size_t>& members) {
    std::ifstream in(cluster.writeRing(name, members));
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  ConfigMapVolume volume(cluster.path("config"));
  volume.update({{"topology.yaml", text("ring4.yaml", range(0, 4))}});
  const std::vector<std::string> watched{"topology.file=" + cluster.path("config/topology.yaml"),
                                         "topology.watch=true"};
  const std::vector<std::size_t> old = range(0, 4);
  for (const std::size_t i : old) cluster.start(i, watched);
  REQUIRE(waitFor([&] { return allAnswer(cluster, old); }, 60s));
  REQUIRE(waitFor([&] { return roundOf(cluster, 0) > 100; }, 60s));
  const std::string before = status(cluster, 0)["topology_hash"];

  INFO(cluster.logTails(20));
  // Another file of the volume changes: nothing is applied.
  volume.update({{"topology.yaml", text("ring4.yaml", range(0, 4))}, {"note", "x\n"}});
  // Grown to five: every running node takes the file, then n4 starts on it.
  volume.update({{"topology.yaml", text("ring5.yaml", range(0, 5))}, {"note", "x\n"}});
  const auto onRing5 = [&](std::size_t i) {
    return status(cluster, i)["topology_changes"] == 1 &&
           status(cluster, i)["topology_hash"] != before;
  };
  for (const std::size_t i : old) {
    CAPTURE(i);
    CHECK(waitFor([&] { return onRing5(i); }, 30s));
    CHECK(cluster.log(i).find("topology file changed: reading topology") != std::string::npos);
  }
  CHECK(neighborIds(cluster, 0) == std::vector<std::string>{"n1", "n4"});
  cluster.start(4, watched);
  REQUIRE(waitFor([&] { return answers(cluster, 4); }, 60s));
  CHECK(
      waitFor([&] { return status(cluster, 4)["joined_at_round"].get<std::int64_t>() > 0; }, 60s));

  // A broken file: logged, nothing changes, training goes on.
  volume.update({{"topology.yaml", "nodes: [\n"}});
  CHECK(waitFor(
      [&] {
        return cluster.log(0).find("topology not applied (nothing changed)") != std::string::npos;
      },
      30s));
  const std::int64_t at = roundOf(cluster, 0);
  REQUIRE(waitFor([&] { return roundOf(cluster, 0) > at + 50; }, 30s));
  CHECK(status(cluster, 0)["topology_changes"] == 1);

  // Shrunk back to four: n4 stops, the others drop it.
  cluster.child(4).signal(SIGTERM);
  REQUIRE(cluster.child(4).wait(30s).has_value());
  volume.update({{"topology.yaml", text("ring4.yaml", range(0, 4))}});
  for (const std::size_t i : old) {
    CAPTURE(i);
    CHECK(waitFor([&] { return status(cluster, i)["topology_hash"] == before; }, 30s));
  }
  CHECK(neighborIds(cluster, 0) == std::vector<std::string>{"n1", "n3"});
  const std::int64_t shrunk = roundOf(cluster, 0);
  CHECK(waitFor([&] { return roundOf(cluster, 0) > shrunk + 50; }, 30s));
}
