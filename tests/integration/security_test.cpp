// CurveZMQ links (security.curve) with real daemons on loopback: neighbours
// train; a stranger's key, the NULL mechanism, a wrong server key and a
// neighbour using another's id deliver nothing and are counted; a TCP
// connection held open stalls nobody; key-file mistakes exit 78.

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <nlohmann/json.hpp>

#include "cluster.hpp"
#include "cluster_status.hpp"
#include "consensusd/config/load.hpp"
#include "peers.hpp"

using consensusd::testing::ask;
using consensusd::testing::Cluster;
using consensusd::testing::CurveClient;
using consensusd::testing::Intruder;
using consensusd::testing::kFast;
using consensusd::testing::roundOf;
using consensusd::testing::runProcess;
using consensusd::testing::waitFor;
using consensusd::testing::with;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

// A three-node ring with a key pair per node (consensusctl keygen) and the
// public keys written into its topology.
struct CurveRing {
  Cluster cluster{3, with(kFast, {"train.rounds=0", "consensus.peer_timeout_ms=500"})};

  CurveRing() {
    const auto keygen =
        runProcess({CONSENSUSCTL, "keygen", "--topology", cluster.path("topology.yaml"), "--dir",
                    cluster.path("keys"), "-o", cluster.path("topology.yaml")});
    REQUIRE_MESSAGE(keygen.exitCode == 0, keygen.err);
  }
  static std::vector<std::string> curveFor(std::size_t i) {
    return {"security.curve=true", "security.secret_key_file=keys/" + Cluster::id(i) + ".key"};
  }
  consensusd::config::CurveKeyPair keys(std::size_t i) const {
    return consensusd::config::readKeyFile(cluster.path("keys/" + Cluster::id(i) + ".key"));
  }
};

std::uint64_t counter(const json& status, const char* name) {
  return status["rejects"].value(name, std::uint64_t{0});
}

}  // namespace

TEST_CASE(
    "CURVE: neighbours train and a stranger key or NULL or a wrong server key or a stolen id "
    "delivers nothing") {
  CurveRing ring;
  Cluster& cluster = ring.cluster;
  for (std::size_t i = 0; i < 3; ++i) cluster.start(i, CurveRing::curveFor(i));
  const auto mixedFromBoth = [&] {
    const json status = ask(cluster, 0, {{"cmd", "status"}});
    const json neighbors = status.value("neighbors", json::array());
    return status.value("round", 0) > 20 && neighbors.size() == 2 &&
           neighbors[0]["mixed"].get<int>() > 0 && neighbors[1]["mixed"].get<int>() > 0;
  };
  REQUIRE(waitFor(
      [&] {
        try {
          return mixedFromBoth();
        } catch (const std::exception&) {
          return false;  // not listening yet
        }
      },
      30s));

  const std::string endpoint = consensusd::testing::endpointOf(cluster, 0);
  const auto n0 = ring.keys(0);
  const auto n1 = ring.keys(1);
  const auto n2 = ring.keys(2);
  // An estimate far in the future with huge values: if any got in, n0 would
  // report that round for a neighbour.
  const auto frames = [&](std::uint32_t sender) {
    return consensusd::testing::estimateFrames(sender, 1'000'000,
                                               consensusd::testing::topologyHash(ring.cluster),
                                               std::vector<float>(21, 1000.0f));
  };
  const auto waitCounter = [&](const char* name, std::uint64_t atLeast) {
    const bool seen = waitFor(
        [&] {
          return counter(ask(cluster, 0, {{"cmd", "status"}}), name) >= atLeast;
        },
        10s);
    INFO(name, " ", ask(cluster, 0, {{"cmd", "status"}})["rejects"].dump());
    CHECK(seen);
  };
  const json before = ask(cluster, 0, {{"cmd", "status"}});

  SUBCASE("a key that is no neighbour's: the ZAP handler refuses it") {
    std::array<char, 41> publicKey{};
    std::array<char, 41> secretKey{};
    REQUIRE(zmq_curve_keypair(publicKey.data(), secretKey.data()) == 0);
    Intruder stranger(endpoint, "n1",
                      CurveClient{publicKey.data(), secretKey.data(), n0.publicKey});
    stranger.send(frames(1));
    waitCounter("auth", counter(before, "auth") + 1);
  }
  SUBCASE("the NULL mechanism: no handshake") {
    Intruder plain(endpoint, "n1");
    plain.send(frames(1));
    waitCounter("handshake", counter(before, "handshake") + 1);
  }
  SUBCASE("n1's own keys but a wrong server key: no handshake") {
    Intruder confused(endpoint, "n1", CurveClient{n1.publicKey, n1.secretKey, n2.publicKey});
    confused.send(frames(1));
    waitCounter("handshake", counter(before, "handshake") + 1);
  }
  SUBCASE("n2's keys claiming to be n1: authenticated as n2, its messages dropped") {
    Intruder thief(endpoint, "n1", CurveClient{n2.publicKey, n2.secretKey, n0.publicKey});
    CHECK(thief.send(frames(1)));
    waitCounter("sender", counter(before, "sender") + 1);
  }
  SUBCASE("a raw TCP connection held open stalls nobody") {
    const int fd = consensusd::testing::connectRawTcp(endpoint);
    const std::int64_t round = roundOf(cluster, 0);
    CHECK(waitFor([&] { return roundOf(cluster, 0) > round + 100; }, 20s));
    CHECK(waitFor([&] { return roundOf(cluster, 1) > round + 100; }, 20s));
    ::close(fd);
  }

  const json after = ask(cluster, 0, {{"cmd", "status"}});
  INFO(after.dump());
  for (const json& neighbor : after["neighbors"]) CHECK(neighbor["last_round"] < 1'000'000);
  // The real neighbours were never displaced: both are still mixed.
  const std::int64_t round = after["round"].get<std::int64_t>();
  CHECK(waitFor([&] { return roundOf(cluster, 0) > round + 50; }, 20s));
  CHECK(mixedFromBoth());
}

TEST_CASE("CURVE: key-file mistakes exit 78 before binding anything") {
  CurveRing ring;
  Cluster& cluster = ring.cluster;
  const std::string keyFile = cluster.path("keys/n0.key");
  const auto check = [&](const std::vector<std::string>& curve) {
    // Synthetic data: --check reads the data set too, which takes seconds
    // under the sanitizers for Fashion-MNIST.
    std::vector<std::string> argv{CONSENSUSD,
                                  "--config",
                                  cluster.path("n0.yaml"),
                                  "--check",
                                  "--set",
                                  "data.dataset=synthetic-logistic",
                                  "--set",
                                  "model.kind=logistic"};
    for (const std::string& o : curve) argv.insert(argv.end(), {"--set", o});
    return runProcess(argv, {}, std::chrono::seconds(60));
  };
  REQUIRE(check(CurveRing::curveFor(0)).exitCode == 0);

  SUBCASE("readable by others") {
    REQUIRE(::chmod(keyFile.c_str(), 0644) == 0);
    const auto result = check(CurveRing::curveFor(0));
    CHECK(result.exitCode == 78);
    CHECK(result.err ==
          keyFile + ":1:1: the secret key is readable by other users (mode 0644): chmod 600 " +
              keyFile + "\n");
  }
  SUBCASE("another node's key pair") {
    const auto result = check({"security.curve=true", "security.secret_key_file=keys/n1.key"});
    CHECK(result.exitCode == 78);
    CHECK(result.err == "--set security.secret_key_file=keys/n1.key:1:26: the key pair in '" +
                            cluster.path("keys/n1.key") +
                            "' does not belong to node 'n0': its public key differs from the "
                            "node's public_key in " +
                            cluster.path("topology.yaml") + " (security.secret_key_file)\n");
  }
  SUBCASE("a secret key that is not the public key's") {
    auto keys = ring.keys(0);
    keys.secretKey = ring.keys(1).secretKey;
    REQUIRE(::unlink(keyFile.c_str()) == 0);
    {
      std::ofstream out(keyFile);
      out << consensusd::config::keyFileText("n0", keys);
    }
    REQUIRE(::chmod(keyFile.c_str(), 0600) == 0);
    const auto result = check(CurveRing::curveFor(0));
    CHECK(result.exitCode == 78);
    CHECK(result.err ==
          keyFile + ": secret_key does not belong to public_key (security.secret_key_file)\n");
  }
}
