// consensusd as real processes on loopback: config errors, the status
// socket, clean stops, crash and resume. Synthetic data keeps start-up fast.

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <zmq.hpp>

#include "cluster.hpp"
#include "cluster_status.hpp"
#include "consensusd/ctl/status_client.hpp"
#include "consensusd/daemon/wire.hpp"
#include "peers.hpp"

using consensusd::cli::askDaemon;
using consensusd::testing::answers;
using consensusd::testing::ask;
using consensusd::testing::bytesOf;
using consensusd::testing::Cluster;
using consensusd::testing::endpointOf;
using consensusd::testing::Intruder;
using consensusd::testing::kFast;
using consensusd::testing::readBytes;
using consensusd::testing::readText;
using consensusd::testing::roundOf;
using consensusd::testing::runProcess;
using consensusd::testing::sendRawTcp;
using consensusd::testing::TempDir;
using consensusd::testing::topologyHash;
using consensusd::testing::waitFor;
using consensusd::testing::with;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

// Sends raw bytes, returns the first answer line.
std::string rawRequest(const std::string& path, const std::string& bytes) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof address.sun_path - 1);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  std::string answer;
  char buffer[4096];
  timeval timeout{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  while (answer.find('\n') == std::string::npos) {
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) break;
    answer.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return answer.substr(0, answer.find('\n'));
}

}  // namespace

TEST_CASE("a config error exits 78 before binding anything") {
  Cluster cluster(2, kFast);
  const auto result =
      runProcess({CONSENSUSD, "--config", cluster.path("n0.yaml"), "--set", "consensus.polcy=all"});
  CHECK(result.exitCode == 78);
  CHECK(result.err ==
        "--set consensus.polcy=all:1:1: unknown key 'consensus.polcy', did you mean "
        "'consensus.policy'? (consensus.polcy)\n");
  CHECK_FALSE(std::filesystem::exists(cluster.socket(0)));
  const auto typo =
      runProcess({CONSENSUSD, "--config", cluster.path("n0.yaml"), "--set", "node.id=n7"});
  CHECK(typo.exitCode == 78);
  CHECK_FALSE(std::filesystem::exists(cluster.socket(0)));
}

TEST_CASE("status socket: every command, malformed and oversized requests") {
  Cluster cluster(1, with(kFast, {"train.rounds=0"}));
  auto& daemon = cluster.start(0);
  REQUIRE(waitFor([&] { return answers(cluster, 0); }, 30s));
  REQUIRE(waitFor([&] { return roundOf(cluster, 0) > 3; }, 30s));

  // ps, top and pgrep know the daemon by its file's name (it starts itself
  // again once at start), and top -H its threads by what they do.
  const std::string proc = "/proc/" + std::to_string(daemon.pid());
  CHECK(readText(proc + "/comm") == "consensusd\n");
  std::set<std::string> threads;
  for (const auto& task : std::filesystem::directory_iterator(proc + "/task"))
    threads.insert(readText(task.path().string() + "/comm"));
  CHECK(threads.count("status\n") == 1);
  CHECK(threads.count("compute\n") == 1);

  const json status = ask(cluster, 0, {{"cmd", "status"}});
  CHECK(status["node"] == "n0");
  CHECK(status["degree"] == 0);
  CHECK(status["policy"] == "dynamic");
  CHECK(status["cutoffs"]["count"].get<std::int64_t>() >= 3);  // no neighbour: nothing to wait for
  const auto histogram = status["class_histogram"].get<std::vector<std::size_t>>();
  CHECK(histogram.size() == 2);
  CHECK(std::accumulate(histogram.begin(), histogram.end(), std::size_t{0}) ==
        10000);  // a single node holds all
  CHECK(ask(cluster, 0, {{"cmd", "neighbors"}})["neighbors"].empty());
  CHECK(ask(cluster, 0, {{"cmd", "history"}, {"n", 2}})["history"].size() == 2);
  CHECK(ask(cluster, 0, {{"cmd", "config"}})["config"].get<std::string>().find(
            "  policy: dynamic\n") != std::string::npos);

  const json changed =
      ask(cluster, 0, {{"cmd", "set-policy"}, {"policy", "static"}, {"backups", 0}});
  CHECK(changed["ok"] == true);
  CHECK(changed["policy"] == "static");
  const json bad = ask(cluster, 0, {{"cmd", "set-policy"}, {"policy", "bogus"}});
  CHECK(bad["ok"] == false);
  CHECK(bad["error"].get<std::string>().find("unknown value 'bogus'") != std::string::npos);
  // Checked against the node's degree as a config file is (this one has no neighbours).
  const json tooMany =
      ask(cluster, 0, {{"cmd", "set-policy"}, {"policy", "static"}, {"backups", 1}});
  CHECK(tooMany["ok"] == false);
  CHECK(tooMany["error"].get<std::string>().find("backups (1) leave fewer") != std::string::npos);
  CHECK(ask(cluster, 0, {{"cmd", "status"}})["policy"] == "static");

  const json checkpoint = ask(cluster, 0, {{"cmd", "checkpoint"}});
  CHECK(checkpoint["ok"] == true);
  CHECK(std::filesystem::exists(checkpoint["path"].get<std::string>()));

  CHECK(ask(cluster, 0, {{"cmd", "pause"}})["ok"] == true);
  CHECK(waitFor([&] { return ask(cluster, 0, {{"cmd", "status"}})["phase"] == "paused"; }, 10s));
  const std::int64_t paused = roundOf(cluster, 0);
  CHECK(ask(cluster, 0, {{"cmd", "resume"}})["ok"] == true);
  CHECK(waitFor([&] { return roundOf(cluster, 0) > paused + 2; }, 10s));

  CHECK(rawRequest(cluster.socket(0), "{not json\n") == R"({"error":"malformed JSON","ok":false})");
  CHECK(json::parse(rawRequest(cluster.socket(0), "{\"cmd\": 5}\n"))["ok"] == false);
  CHECK(rawRequest(cluster.socket(0), "{\"cmd\": \"frobnicate\"}\n") ==
        R"({"error":"unknown command 'frobnicate'","ok":false})");
  CHECK(rawRequest(cluster.socket(0), std::string(70000, 'x')) ==
        R"({"error":"request larger than 64 KiB","ok":false})");
  CHECK(answers(cluster, 0));  // still serving

  CHECK(ask(cluster, 0, {{"cmd", "stop"}})["ok"] == true);
  CHECK(daemon.wait(10s) == 0);
  CHECK_FALSE(std::filesystem::exists(cluster.socket(0)));
}

TEST_CASE("a kept status connection answers request after request and rides out restarts") {
  Cluster cluster(1, with(kFast, {"train.rounds=0"}));
  cluster.start(0);
  REQUIRE(waitFor([&] { return answers(cluster, 0); }, 30s));
  consensusd::cli::StatusConnection connection(cluster.socket(0));
  const json status{{"cmd", "status"}};
  std::int64_t last = -1;
  for (int i = 0; i < 5; ++i) {
    const json answer = connection.ask(status, 5s);
    CHECK(answer["node"] == "n0");
    CHECK(answer["round"].get<std::int64_t>() >= last);
    last = answer["round"].get<std::int64_t>();
  }
  // Its daemon gone: an error; a new daemon on the same path answers.
  cluster.child(0).signal(SIGTERM);
  REQUIRE(cluster.child(0).wait(10s).has_value());
  CHECK_THROWS_AS(connection.ask(status, 5s), std::runtime_error);
  cluster.start(0);
  REQUIRE(waitFor([&] { return answers(cluster, 0); }, 30s));
  CHECK(connection.ask(status, 5s)["node"] == "n0");
  // Restarted between two requests: the kept connection is replaced at once.
  cluster.child(0).signal(SIGTERM);
  REQUIRE(cluster.child(0).wait(10s).has_value());
  cluster.start(0);
  REQUIRE(waitFor([&] { return answers(cluster, 0); }, 30s));
  CHECK(connection.ask(status, 5s)["node"] == "n0");
}

TEST_CASE("askEach asks every node at once: a silent socket, an absent node, a restart") {
  Cluster cluster(3, with(kFast, {"train.rounds=0"}));
  cluster.start(0);
  cluster.start(1);  // n2 never starts
  REQUIRE(waitFor([&] { return answers(cluster, 0) && answers(cluster, 1); }, 30s));
  // A socket that takes the request and never answers.
  const std::string silentPath = cluster.path("silent.sock");
  const int silent = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  silentPath.copy(address.sun_path, sizeof address.sun_path - 1);
  REQUIRE(::bind(silent, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0);
  REQUIRE(::listen(silent, 4) == 0);

  std::vector<consensusd::cli::StatusConnection> connections;
  connections.emplace_back(silentPath);
  for (std::size_t i = 0; i < 3; ++i) connections.emplace_back(cluster.socket(i));
  const json request{{"cmd", "status"}, {"fields", {"round"}}};
  const auto roundIn = [](const std::optional<std::string>& line) {
    return line ? json::parse(*line)["round"].get<std::int64_t>() : -1;
  };
  auto lines = consensusd::cli::askEach(connections, request, 3s);
  REQUIRE(lines.size() == 4);
  CHECK_FALSE(lines[0]);  // the silent one held up nobody's answer
  CHECK(roundIn(lines[1]) >= 0);
  CHECK(roundIn(lines[2]) >= 0);
  CHECK_FALSE(lines[3]);
  // n1 restarted between two polls: its kept connection is replaced at once.
  cluster.child(1).signal(SIGTERM);
  REQUIRE(cluster.child(1).wait(10s).has_value());
  cluster.start(1);
  REQUIRE(waitFor([&] { return answers(cluster, 1); }, 30s));
  ::close(silent);  // not listening now: refused at once rather than held to the end
  lines = consensusd::cli::askEach(connections, request, 10s);
  CHECK_FALSE(lines[0]);
  CHECK(roundIn(lines[1]) >= 0);
  CHECK(roundIn(lines[2]) >= 0);
  CHECK_FALSE(lines[3]);
}

TEST_CASE("SIGTERM stops cleanly with a checkpoint, even with the neighbour gone") {
  Cluster cluster(2, with(kFast, {"train.rounds=0", "consensus.policy=all"}));
  cluster.startAll();
  REQUIRE(waitFor(
      [&] { return answers(cluster, 0) && answers(cluster, 1) && roundOf(cluster, 0) > 5; }, 30s));
  cluster.child(1).signal(SIGKILL);
  REQUIRE(cluster.child(1).wait(5s).has_value());
  cluster.child(0).signal(SIGTERM);
  CHECK(cluster.child(0).wait(5s) == 0);
  CHECK(cluster.log(0).find("stopped at round") != std::string::npos);
  CHECK_FALSE(std::filesystem::is_empty(cluster.path("ckpt-n0")));
}

TEST_CASE("a node stopped by SIGTERM says goodbye: not waited for at once, waited for when back") {
  // A peer timeout of a minute: without the goodbye, n0's rounds would stop for that long.
  Cluster cluster(2, with(kFast, {"train.rounds=0", "consensus.policy=all",
                                  "consensus.peer_timeout_ms=60000"}));
  cluster.startAll();
  REQUIRE(waitFor([&] { return answers(cluster, 0) && answers(cluster, 1); }, 30s));
  REQUIRE(waitFor([&] { return roundOf(cluster, 0) > 5; }, 30s));
  const auto stateOfN1 = [&] {
    return ask(cluster, 0, {{"cmd", "neighbors"}})["neighbors"][0]["state"].get<std::string>();
  };
  cluster.child(1).signal(SIGTERM);
  REQUIRE(cluster.child(1).wait(10s) == 0);
  CHECK(waitFor([&] { return stateOfN1() == "left"; }, 10s));
  const std::int64_t before = roundOf(cluster, 0);
  CHECK(waitFor([&] { return roundOf(cluster, 0) > before + 20; }, 20s));
  CHECK(ask(cluster, 0, {{"cmd", "status"}})["suspects"] == 0);  // it left; it is not silent
  CHECK(cluster.log(0).find("n1 said goodbye") != std::string::npos);

  // Back (from its checkpoint): its hello makes it a neighbour to wait for
  // again (round_engine_test has the rounds that follow).
  cluster.start(1);
  REQUIRE(waitFor([&] { return answers(cluster, 1); }, 30s));
  CHECK(waitFor([&] { return stateOfN1() != "left"; }, 10s));
}

TEST_CASE("a node that starts fresh in a running cluster takes its neighbours' state, not x_0") {
  Cluster cluster(3, with(kFast, {"train.rounds=0", "consensus.peer_timeout_ms=500",
                                  "train.learning_rate=0.5"}));
  cluster.start(0);
  cluster.start(1);
  REQUIRE(waitFor([&] { return answers(cluster, 0) && answers(cluster, 1); }, 30s));
  REQUIRE(waitFor([&] { return roundOf(cluster, 0) > 1000; }, 60s));
  // n0 and n1 have trained: x_0 is far from where they are.
  // No checkpoint: fresh. Its own steps are next to nothing, so its x is x_0 until it
  // joins, however many rounds it runs alone first.
  cluster.start(2, {"train.learning_rate=1e-9"});
  REQUIRE(waitFor([&] { return answers(cluster, 2); }, 30s));
  const bool joinedYet = waitFor(
      [&] {
        return ask(cluster, 2, {{"cmd", "status"}})["joined_at_round"].get<std::int64_t>() > 1000;
      },
      30s);
  INFO(cluster.logTails(60));
  INFO(ask(cluster, 2, {{"cmd", "status"}}).dump());
  REQUIRE(joinedYet);
  CHECK(cluster.log(2).find("joined a running cluster at round") != std::string::npos);
  // The round that joined moved n2 from x_0 to the cluster (round_engine_test
  // checks the average exactly); the next ones move it by far less: no pull
  // back toward x_0 is left to wash out. Every round is in its metrics file
  // (the history keeps only the last ones).
  double jump = -1;
  std::vector<double> after;
  const auto readRounds = [&] {
    jump = -1;
    after.clear();
    std::ifstream in(cluster.path("n2.jsonl"));
    for (std::string line; std::getline(in, line);) {
      const json record = json::parse(line, nullptr, false);  // the last may be half written
      if (record.is_discarded() || !record.contains("adopted")) continue;
      if (record["adopted"] == true)
        jump = record["distance"];
      else if (jump >= 0 && after.size() < 5)
        after.push_back(record["distance"]);
    }
    return jump > 0 && after.size() == 5;
  };
  REQUIRE(waitFor(readRounds, 30s));
  CAPTURE(jump);
  for (const double d : after) CHECK(d < 0.5 * jump);
  // The nodes that started together did not adopt anything.
  CHECK(ask(cluster, 0, {{"cmd", "status"}})["joined_at_round"] == -1);
}

TEST_CASE("a killed node is marked suspect, the others go on, and it resumes from its checkpoint") {
  Cluster cluster(3, with(kFast, {"train.rounds=0", "consensus.policy=all",
                                  "consensus.peer_timeout_ms=500", "checkpoint.every_rounds=20"}));
  cluster.startAll();
  REQUIRE(waitFor([&] { return answers(cluster, 0) && answers(cluster, 1) && answers(cluster, 2); },
                  30s));
  REQUIRE(waitFor([&] { return roundOf(cluster, 2) > 60; }, 30s));
  cluster.child(2).signal(SIGKILL);
  REQUIRE(cluster.child(2).wait(5s).has_value());

  // Its neighbours see it as suspect and keep completing rounds without it.
  const auto suspectAt = [&](std::size_t i) {
    const json answer =
        ask(cluster, i, {{"cmd", "neighbors"}});  // a local: the loop must not dangle
    for (const auto& n : answer["neighbors"]) {
      if (n["id"] == "n2") return n["state"] == "suspect";
    }
    return false;
  };
  CHECK(waitFor([&] { return suspectAt(0) && suspectAt(1); }, 5s));
  const std::int64_t before = roundOf(cluster, 0);
  CHECK(waitFor([&] { return roundOf(cluster, 0) > before + 50; }, 20s));

  // Restarted, it resumes from its newest checkpoint and catches up.
  cluster.start(2);
  REQUIRE(waitFor([&] { return answers(cluster, 2); }, 30s));
  CHECK(cluster.log(2).find("resumed from") != std::string::npos);
  CHECK(ask(cluster, 2, {{"cmd", "status"}})["last_checkpoint_round"].get<std::int64_t>() >= 60);
  CHECK(waitFor([&] { return roundOf(cluster, 2) + 10 >= roundOf(cluster, 0); }, 20s));
}

TEST_CASE("hostile traffic is dropped and counted by reason, and the node keeps its pace") {
  Cluster cluster(2, with(kFast, {"train.rounds=0", "consensus.peer_timeout_ms=300"}));
  cluster.start(0);  // n1 never starts: the test speaks in its place
  REQUIRE(waitFor([&] { return answers(cluster, 0); }, 30s));
  const json first = ask(cluster, 0, {{"cmd", "status"}});
  const std::string topology = cluster.path("topology.yaml");
  const std::uint64_t hash = topologyHash(cluster);
  const std::uint64_t dimension = 21;  // logistic regression on 20 synthetic features

  std::ifstream endpoints(topology);
  std::string text((std::istreambuf_iterator<char>(endpoints)), std::istreambuf_iterator<char>());
  const std::size_t at = text.find("tcp://");
  const std::string endpoint = text.substr(at, text.find('"', at) - at);

  Intruder impostor(endpoint, "n1");
  Intruder stranger(endpoint, "n9");
  consensusd::wire::Header header;
  header.kind = consensusd::wire::Kind::Estimate;
  header.sender = 1;
  header.round = 1000000;
  header.dimension = dimension;
  header.topologyHash = hash;
  header.payloadBytes = dimension * 4;
  std::vector<float> values(dimension, 0.5f);
  const auto payloadOf = [](const std::vector<float>& v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  };
  header.checksum = consensusd::wire::checksum(values.data(), dimension * 4);

  impostor.send({"random bytes, one frame"});                // frames
  impostor.send({std::string(64, 'x'), payloadOf(values)});  // magic
  auto wrong = header;
  wrong.dimension = 7;
  impostor.send({bytesOf(consensusd::wire::encode(wrong)), payloadOf(values)});  // dimension
  wrong = header;
  wrong.sender = 0;
  impostor.send({bytesOf(consensusd::wire::encode(wrong)), payloadOf(values)});  // sender
  wrong = header;
  wrong.topologyHash = hash + 1;
  impostor.send({bytesOf(consensusd::wire::encode(wrong)), payloadOf(values)});  // topology
  std::vector<float> poisoned = values;
  poisoned[3] = std::nanf("");
  wrong = header;
  wrong.checksum = consensusd::wire::checksum(poisoned.data(), dimension * 4);
  impostor.send({bytesOf(consensusd::wire::encode(wrong)), payloadOf(poisoned)});  // non_finite
  wrong = header;
  wrong.checksum ^= 1;
  impostor.send({bytesOf(consensusd::wire::encode(wrong)), payloadOf(values)});   // checksum
  stranger.send({bytesOf(consensusd::wire::encode(header)), payloadOf(values)});  // not_neighbor
  auto replayed = header;  // a well-formed estimate of a long-gone round
  replayed.round = 0;
  REQUIRE(waitFor([&] { return roundOf(cluster, 0) > 10; }, 10s));
  impostor.send({bytesOf(consensusd::wire::encode(replayed)), payloadOf(values)});  // stale

  const auto counted = [&] {
    const json status = ask(cluster, 0, {{"cmd", "status"}});
    for (const char* reason : {"frames", "magic", "dimension", "sender", "topology", "non_finite",
                               "checksum", "not_neighbor"}) {
      if (!status["rejects"].contains(reason)) return false;
    }
    // A replay of a long-gone round is well-formed: discarded, not rejected.
    return status["discarded"].contains("stale") && !status["rejects"].contains("stale");
  };
  CHECK(waitFor(counted, 10s));
  const json status = ask(cluster, 0, {{"cmd", "status"}});
  INFO(status.dump());
  // Nothing malformed was averaged: n0 never mixed with "n1".
  CHECK(status["neighbors"][0]["mixed"] == 0);
  CHECK(status["neighbors"][0]["rejected"].get<int>() >= 7);
  const std::int64_t now = status["round"].get<std::int64_t>();
  CHECK(waitFor([&] { return roundOf(cluster, 0) > now + 100; }, 10s));  // still going
  CHECK(first["round"].get<std::int64_t>() < now);
}

TEST_CASE("a SIGSTOPped node does not stop the others and after SIGCONT it catches up") {
  Cluster cluster(
      3, with(kFast, {"train.rounds=0", "consensus.policy=all", "consensus.peer_timeout_ms=300"}));
  cluster.startAll();
  REQUIRE(waitFor([&] { return answers(cluster, 0) && answers(cluster, 1) && answers(cluster, 2); },
                  30s));
  REQUIRE(waitFor([&] { return roundOf(cluster, 2) > 50; }, 30s));
  cluster.child(2).signal(SIGSTOP);
  const std::int64_t before = roundOf(cluster, 0);
  CHECK(waitFor(
      [&] { return roundOf(cluster, 0) > before + 200 && roundOf(cluster, 1) > before + 200; },
      20s));
  cluster.child(2).signal(SIGCONT);
  CHECK(waitFor([&] { return roundOf(cluster, 2) + 20 >= roundOf(cluster, 0); }, 20s));
  // Caught up by skipping, it may not yet have heard each neighbour twice
  // (a suspect needs two messages to be live again): wait for that.
  CHECK(waitFor([&] { return ask(cluster, 2, {{"cmd", "status"}})["suspects"] == 0; }, 10s));
}

namespace {

// GET `path` from 127.0.0.1:`port`; returns the whole response (head and body).
std::string httpGet(int port, const std::string& path) {
  const int fd = consensusd::testing::connectLoopback(port);
  if (fd < 0) return {};
  const std::string request =
      "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  timeval timeout{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  std::string response;
  char buffer[65536];
  for (ssize_t n; (n = ::recv(fd, buffer, sizeof buffer, 0)) > 0;)
    response.append(buffer, static_cast<std::size_t>(n));
  ::close(fd);
  return response;
}

std::string bodyOf(const std::string& response) {
  return response.substr(response.find("\r\n\r\n") + 4);
}

}  // namespace

TEST_CASE("HTTP on loopback: /healthz, /status, and /metrics that promtool accepts") {
  Cluster probe(2, {});
  const int port = probe.sparePort();
  Cluster cluster(2, with(kFast, {"train.rounds=0", "train.eval_every_rounds=20",
                                  "status.http=127.0.0.1:" + std::to_string(port)}));
  cluster.start(0);
  REQUIRE(waitFor([&] { return answers(cluster, 0) && roundOf(cluster, 0) > 0; }, 30s));
  REQUIRE(
      waitFor([&] { return httpGet(port, "/healthz").find("200 OK") != std::string::npos; }, 10s));
  CHECK(bodyOf(httpGet(port, "/healthz")) == "ok\n");
  CHECK(json::parse(bodyOf(httpGet(port, "/status")))["node"] == "n0");
  CHECK(httpGet(port, "/nowhere").find("404 Not Found") != std::string::npos);
  const std::string metrics = bodyOf(httpGet(port, "/metrics"));
  CHECK(metrics.find("consensusd_round{node=\"n0\"}") != std::string::npos);
  CHECK(metrics.find("consensusd_round_cutoffs_total{node=\"n0\",reason=\"") != std::string::npos);
  const auto promtool = runProcess({"/usr/bin/promtool", "check", "metrics"}, metrics);
  INFO(promtool.out << promtool.err);
  CHECK(promtool.exitCode == 0);
}

TEST_CASE("HTTP on every address with status.http_remote (a pod's probes and Prometheus)") {
  Cluster probe(2, {});
  const int port = probe.sparePort();
  Cluster cluster(2, with(kFast, {"train.rounds=0", "status.http_remote=true",
                                  "status.http=0.0.0.0:" + std::to_string(port)}));
  cluster.start(0);
  REQUIRE(
      waitFor([&] { return httpGet(port, "/healthz").find("200 OK") != std::string::npos; }, 30s));
  CHECK(json::parse(bodyOf(httpGet(port, "/status")))["node"] == "n0");
}

namespace {

std::vector<json> metricsOf(const Cluster& cluster, std::size_t i) {
  std::ifstream in(cluster.path(Cluster::id(i) + ".jsonl"));
  std::vector<json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
  return lines;
}

}  // namespace

TEST_CASE("traffic from outside the topology changes nothing: parameters match a clean run") {
  // With policy all, mix_round same and no skipping every round averages exactly
  // the neighbour's estimate of that round: two runs end with identical bytes.
  // Long timeouts: n0 waits for n1 instead of marking it suspect. n0 is
  // paused until its round-0 estimate is out: its connection to n1 comes up
  // on a reconnect timer (up to 2 s), and a round 1 begun before then would
  // replace the round-0 estimate waiting for it (only the newest is sent).
  const auto options =
      with(kFast, {"train.rounds=400", "consensus.policy=all", "consensus.mix_round=same",
                   "consensus.round_skipping=false", "checkpoint.every_rounds=0",
                   "consensus.peer_timeout_ms=60000", "consensus.hard_deadline_ms=60000"});
  const auto finalParams = [&](bool hostile) {
    Cluster cluster(2, options);
    cluster.start(0);
    REQUIRE(waitFor([&] { return answers(cluster, 0); }, 30s));
    REQUIRE(ask(cluster, 0, {{"cmd", "pause"}})["ok"] == true);
    if (hostile) {
      const std::string endpoint = endpointOf(cluster, 0);
      // A well-formed estimate from a node that is not in the topology.
      const std::uint64_t dimension = 21;
      std::vector<float> values(dimension, 100.0f);
      consensusd::wire::Header header;
      header.kind = consensusd::wire::Kind::Estimate;
      header.sender = 1;
      header.dimension = dimension;
      header.payloadBytes = dimension * 4;
      header.checksum = consensusd::wire::checksum(values.data(), dimension * 4);
      const std::string payload(reinterpret_cast<const char*>(values.data()), dimension * 4);
      Intruder stranger(endpoint, "n9");
      for (std::int64_t round = 0; round < 5; ++round) {
        header.round = round;
        stranger.send({bytesOf(consensusd::wire::encode(header)), payload});
      }
      // Junk that is not ZeroMQ at all, and a ZMTP greeting with a bogus mechanism.
      sendRawTcp(endpoint, std::string(4096, '\x5a'));
      std::string greeting(64, '\0');
      greeting[0] = '\xff';
      greeting[9] = '\x7f';
      greeting[10] = '\x03';
      greeting.replace(12, 5, "BOGUS");
      sendRawTcp(endpoint, greeting);
      // An oversized frame: libzmq drops the connection before allocating it.
      Intruder giant(endpoint, "n8");
      giant.send({bytesOf(consensusd::wire::encode(header)), std::string(1 << 20, '\0')});
      const auto counted = [&] {
        const json status = ask(cluster, 0, {{"cmd", "status"}});
        return status["rejects"].value("not_neighbor", 0) >= 5 &&
               status["rejects"].value("handshake", 0) >= 1 &&
               status.value("connections_closed", 0) >= 1;
      };
      const bool seen = waitFor(counted, 10s);
      INFO(ask(cluster, 0, {{"cmd", "status"}}).dump());
      CHECK(seen);
    }
    cluster.start(1);
    const auto estimateOut = [&] {
      const json status = ask(cluster, 0, {{"cmd", "status"}});
      return status["neighbors"][0].value("sent_bytes", 0) > 0;
    };
    REQUIRE(waitFor(estimateOut, 30s));
    REQUIRE(ask(cluster, 0, {{"cmd", "resume"}})["ok"] == true);
    REQUIRE(cluster.child(0).wait(60s) == 0);
    REQUIRE(cluster.child(1).wait(10s) == 0);
    return readBytes(cluster.path("ckpt-n0/round-000000000400.ckpt"));
  };
  const std::string clean = finalParams(false);
  REQUIRE(clean.size() > 100);
  CHECK(finalParams(true) == clean);
}

TEST_CASE("symmetric mixing over the wire: decisions flow and the ring trains") {
  Cluster cluster(
      3, with(kFast, {"train.rounds=300", "consensus.mix=symmetric", "consensus.policy=static",
                      "consensus.backups=1", "train.eval_every_rounds=100"}));
  cluster.startAll();
  for (std::size_t i = 0; i < 3; ++i) REQUIRE(cluster.child(i).wait(60s) == 0);
  for (std::size_t i = 0; i < 3; ++i) {
    const std::vector<json> lines = metricsOf(cluster, i);
    REQUIRE(lines.size() > 2);
    const json& last = lines.back();
    INFO(last.dump());
    CHECK(last["round"] == 300);
    const auto evaluated = std::find_if(lines.begin(), lines.end(),
                                        [](const json& l) { return l.contains("test_loss"); });
    REQUIRE(evaluated != lines.end());
    CHECK(last["test_loss"].get<double>() < (*evaluated)["test_loss"].get<double>() - 0.01);
    // Only asynchrony (stale, duplicate estimates) may be discarded; a DECISION
    // is never a reject, and no round waited for a decision until the hard deadline.
    CHECK(last["rejects"].empty());
    double mixed = 0;
    for (const json& line : lines) {
      mixed += line.value("responders", 0.0);
      CHECK(line.value("duration_ms", 0.0) < 5000);
    }
    CHECK(mixed > 0.3 * static_cast<double>(lines.size()));
  }
}

TEST_CASE("straggler.link_delay_ms holds back a node's estimates") {
  // n0 cannot finish round k before n1's estimate of k arrives (>= 100 ms after
  // n1 started k), and n1 cannot start k before n0 finished k - 2: so two
  // rounds take at least 100 ms, whatever the machine's load.
  Cluster cluster(2, with(kFast, {"train.rounds=30", "consensus.policy=all"}));
  cluster.start(0);
  cluster.start(1, {"straggler.link_delay_ms=100"});
  REQUIRE(cluster.child(0).wait(60s) == 0);
  REQUIRE(cluster.child(1).wait(10s) == 0);
  const std::vector<json> lines = metricsOf(cluster, 0);
  REQUIRE(lines.size() >= 30);
  const double span = lines[lines.size() - 2]["t"].get<double>() - lines.front()["t"].get<double>();
  CHECK(span >= 1.3);
}

TEST_CASE(
    "estimates of several chunks: every round mixes every neighbour, and the transfers show") {
  // 1.5M float32 parameters: six chunks of 1 MiB per estimate, each sent
  // only once the neighbour's buffer is free (docs/protocol.md).
  Cluster cluster(3, {"data.dataset=synthetic-logistic", "model.kind=none",
                      "model.dimension=1500000", "train.rounds=0", "consensus.policy=all",
                      "checkpoint.every_rounds=0", "log.progress_every_s=1"});
  cluster.startAll();
  // 0.8 s in dev, 15 s under ASan, over 60 s under TSan beside the simulator's tests.
  REQUIRE(waitFor([&] { return answers(cluster, 0) && roundOf(cluster, 0) > 30; }, 150s));
  const json answer = ask(cluster, 0, {{"cmd", "neighbors"}});  // a local: the loop must not dangle
  for (const auto& n : answer["neighbors"]) {
    INFO(n.dump());
    CHECK(n["state"] != "suspect");
    CHECK(n["received_bytes"].get<double>() >= 20 * 6e6);  // the snapshot may lag a few rounds
    CHECK(n["transfer_ms"].get<double>() > 0);
    CHECK(n["rejected"] == 0);
  }
  for (std::size_t i = 0; i < 3; ++i) cluster.child(i).signal(SIGTERM);
  for (std::size_t i = 0; i < 3; ++i) REQUIRE(cluster.child(i).wait(20s) == 0);
  for (std::size_t i = 0; i < 3; ++i) {
    const std::vector<json> lines = metricsOf(cluster, i);
    REQUIRE(lines.size() > 30);
    INFO(lines.back().dump());
    CHECK(lines.back()["rejects"].empty());
    for (std::size_t k = 0; k + 1 < lines.size(); ++k) {  // the last line is the summary
      INFO(lines[k].dump());
      CHECK(lines[k].value("responders", 0.0) == 2);
    }
  }
}

TEST_CASE(
    "compressed estimates (int8): every round mixes, a quarter of the bytes, float32's accuracy") {
  // Four daemons on a ring, softmax on Fashion-MNIST: the same run with
  // whole float32 estimates and with int8 frames against public copies
  // (docs/protocol.md, "Compressed estimates"). Policy all, no skipping,
  // a cosine schedule: the final accuracy moves by about 0.001 from run to
  // run, by up to 0.006 under a sanitizer's timing (mix_round newest mixes
  // whichever estimate is newest at the cut-off).
  struct Outcome {
    double accuracy = 0;
    double bytesSent = 0;
  };
  const auto run = [](const std::string& compression) {
    Cluster cluster(4,
                    {"model.kind=softmax", "train.rounds=600", "train.learning_rate=0.1",
                     "train.schedule=cosine", "train.eval_every_rounds=0", "consensus.policy=all",
                     "consensus.mix_round=newest", "consensus.round_skipping=false",
                     "consensus.peer_timeout_ms=60000", "consensus.hard_deadline_ms=60000",
                     "checkpoint.every_rounds=0", "consensus.compression=" + compression});
    cluster.startAll();
    REQUIRE(waitFor([&] { return answers(cluster, 0) && roundOf(cluster, 0) >= 500; }, 120s));
    const json status = ask(cluster, 0, {{"cmd", "status"}});
    INFO(status.dump());
    CHECK(status["rejects"].empty());
    Outcome outcome;
    outcome.bytesSent = status["bytes_sent"].get<double>() / status["round"].get<double>();
    // Bytes by neighbour add up; per sample is per the updates taken (B = 32 each).
    double sentTo = 0;
    double receivedFrom = 0;
    for (const json& n : status["neighbors"]) {
      sentTo += n["sent_bytes"].get<double>();
      receivedFrom += n["received_bytes"].get<double>();
      CHECK(n["frame_gaps"] == 0);  // frames in step: no keyframe asked for
      CHECK(n["frame_corrupt"] == 0);
    }
    CHECK(sentTo == status["bytes_sent"].get<double>());
    CHECK(receivedFrom == status["bytes_received"].get<double>());
    const auto samples = status["samples"].get<std::int64_t>();
    CHECK(samples % 32 == 0);
    CHECK(std::abs(samples / 32 - status["round"].get<std::int64_t>()) <= 1);
    CHECK(status["sent_bytes_per_sample"].get<double>() ==
          doctest::Approx(status["bytes_sent"].get<double>() / static_cast<double>(samples)));
    for (std::size_t i = 0; i < 4; ++i) REQUIRE(cluster.child(i).wait(120s) == 0);
    for (std::size_t i = 0; i < 4; ++i) {
      const std::vector<json> lines = metricsOf(cluster, i);
      REQUIRE(lines.size() > 500);
      INFO(lines.back().dump());
      CHECK(lines.back()["final"] == true);
      for (std::size_t k = 0; k + 1 < lines.size(); ++k) {
        INFO(lines[k].dump());
        CHECK(lines[k].value("responders", 0.0) == 2);
        if (k > 0) {  // running totals
          CHECK(lines[k]["received_bytes"] >= lines[k - 1]["received_bytes"]);
          CHECK(lines[k]["samples"] > lines[k - 1]["samples"]);
        }
      }
      outcome.accuracy += lines.back()["accuracy"].get<double>() / 4;
    }
    return outcome;
  };
  const Outcome plain = run("none");
  const Outcome int8 = run("int8");
  MESSAGE("accuracy: float32 ", plain.accuracy, ", int8 ", int8.accuracy);
  CHECK(plain.accuracy > 0.75);
  CHECK(std::abs(int8.accuracy - plain.accuracy) < 0.01);
  // 7,850 values: 31,400 bytes whole, 7,974 as int8 frames (3.94x fewer).
  CHECK(int8.bytesSent < plain.bytesSent / 3.5);
}
