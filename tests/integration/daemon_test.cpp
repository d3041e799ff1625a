// consensusd as real processes on loopback: config errors, the status
// socket, clean stops, crash and resume. Synthetic data keeps start-up fast.

#include <doctest/doctest.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cluster.hpp"
#include "status_client.hpp"

using consensusd::cli::askDaemon;
using consensusd::testing::Cluster;
using consensusd::testing::runProcess;
using consensusd::testing::TempDir;
using consensusd::testing::waitFor;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

const std::vector<std::string> kFast{"data.dataset=synthetic-logistic", "model.kind=logistic",
                                     "train.eval_every_rounds=0", "log.progress_every_s=1"};

std::vector<std::string> with(std::vector<std::string> base, const std::vector<std::string>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

json ask(const Cluster& cluster, std::size_t i, const json& request) {
  return askDaemon(cluster.socket(i), request, 5s);
}

bool answers(const Cluster& cluster, std::size_t i) {
  try {
    return ask(cluster, i, {{"cmd", "status"}}).value("ok", false);
  } catch (const std::exception&) {
    return false;
  }
}

std::int64_t roundOf(const Cluster& cluster, std::size_t i) {
  return ask(cluster, i, {{"cmd", "status"}}).value("round", std::int64_t{-1});
}

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

  const json status = ask(cluster, 0, {{"cmd", "status"}});
  CHECK(status["node"] == "n0");
  CHECK(status["degree"] == 0);
  CHECK(status["policy"] == "dynamic");
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
