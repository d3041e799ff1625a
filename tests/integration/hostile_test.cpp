// One packet must not stop a cluster: well-formed lies about rounds, routing
// ids taken over, replays for absent neighbours, against real daemons on
// loopback. Each case failed before its fix (docs/protocol.md says what is
// and is not protected).

#include <doctest/doctest.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>

#include "cluster.hpp"
#include "cluster_status.hpp"
#include "peers.hpp"

using consensusd::testing::answers;
using consensusd::testing::ask;
using consensusd::testing::bytesOf;
using consensusd::testing::Child;
using consensusd::testing::Cluster;
using consensusd::testing::endpointOf;
using consensusd::testing::estimateFrames;
using consensusd::testing::Intruder;
using consensusd::testing::kFast;
using consensusd::testing::roundOf;
using consensusd::testing::runProcess;
using consensusd::testing::topologyHash;
using consensusd::testing::waitFor;
using consensusd::testing::with;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

constexpr std::uint64_t kDimension = 21;  // logistic regression on 20 synthetic features
constexpr std::int64_t kFar = std::int64_t{1} << 62;

std::vector<std::string> helloFrames(std::uint32_t sender, std::int64_t round, std::uint64_t hash) {
  consensusd::wire::Header header;
  header.kind = consensusd::wire::Kind::Hello;
  header.sender = sender;
  header.round = round;
  header.dimension = kDimension;
  header.topologyHash = hash;
  return {bytesOf(consensusd::wire::encode(header)), std::string()};
}

json neighborOf(const Cluster& cluster, std::size_t node, const std::string& id) {
  const json answer =
      ask(cluster, node, {{"cmd", "neighbors"}});  // a local: the loop must not dangle
  for (const json& n : answer["neighbors"]) {
    if (n["id"] == id) return n;
  }
  return json::object();
}

std::uint64_t rejectsOf(const Cluster& cluster, std::size_t node, const char* reason) {
  return ask(cluster, node, {{"cmd", "status"}})["rejects"].value(reason, std::uint64_t{0});
}

void startAndWait(Cluster& cluster) {
  cluster.startAll();
  REQUIRE(waitFor(
      [&] {
        for (std::size_t i = 0; i < cluster.size(); ++i) {
          if (!answers(cluster, i) || roundOf(cluster, i) < 20) return false;
        }
        return true;
      },
      30s));
}

// n1 is still averaged by n0: its mixed count grows.
bool stillMixes(const Cluster& cluster) {
  const std::uint64_t mixed = neighborOf(cluster, 0, "n1").value("mixed", std::uint64_t{0});
  return waitFor(
      [&] { return neighborOf(cluster, 0, "n1").value("mixed", std::uint64_t{0}) > mixed + 50; },
      20s);
}

}  // namespace

TEST_CASE("a far-future estimate under a live neighbour's id is refused and never mixed") {
  Cluster cluster(3, with(kFast, {"train.rounds=0", "consensus.peer_timeout_ms=500"}));
  startAndWait(cluster);
  Intruder liar(endpointOf(cluster, 0), "n1");
  for (const std::int64_t round : {kFar, std::numeric_limits<std::int64_t>::max()})
    REQUIRE(liar.send(
        estimateFrames(1, round, topologyHash(cluster), std::vector<float>(kDimension, 1000.0f))));
  CHECK(waitFor([&] { return rejectsOf(cluster, 0, "implausible_round") >= 2; }, 10s));
  const json n1 = neighborOf(cluster, 0, "n1");
  INFO(n1.dump());
  CHECK(n1.value("last_round", kFar) < roundOf(cluster, 0) + 100);
  CHECK(n1.value("rejected", 0) >= 2);
  CHECK(stillMixes(cluster));
}

TEST_CASE("a HELLO with the largest round freezes nobody, and one far ahead moves no counter") {
  SUBCASE("a ring") {
    Cluster cluster(3, with(kFast, {"train.rounds=0", "consensus.peer_timeout_ms=500"}));
    startAndWait(cluster);
    Intruder liar(endpointOf(cluster, 0), "n1");
    Intruder other(endpointOf(cluster, 0), "n2");
    REQUIRE(
        liar.send(helloFrames(1, std::numeric_limits<std::int64_t>::max(), topologyHash(cluster))));
    REQUIRE(other.send(helloFrames(2, kFar, topologyHash(cluster))));
    CHECK(waitFor([&] { return rejectsOf(cluster, 0, "implausible_round") >= 2; }, 10s));
    const std::int64_t round = roundOf(cluster, 0);
    CHECK(waitFor([&] { return roundOf(cluster, 0) > round + 200; }, 20s));
    // No skips inflated the rounds: each node still applied its gradients.
    CHECK(roundOf(cluster, 0) < round + 100'000);
    CHECK(stillMixes(cluster));
  }
  SUBCASE("a single neighbour") {
    Cluster cluster(2, with(kFast, {"train.rounds=100000", "consensus.peer_timeout_ms=500"}));
    startAndWait(cluster);
    Intruder liar(endpointOf(cluster, 0), "n1");
    REQUIRE(liar.send(helloFrames(1, kFar, topologyHash(cluster))));
    CHECK(waitFor([&] { return rejectsOf(cluster, 0, "implausible_round") >= 1; }, 10s));
    const std::int64_t round = roundOf(cluster, 0);
    CHECK(round < 100'000);  // did not jump to the end of training
    CHECK(waitFor([&] { return roundOf(cluster, 0) > round + 200; }, 20s));
    CHECK(cluster.child(0).running());
  }
}

TEST_CASE("a hundred takeovers of a live neighbour's routing id crash nothing") {
  Cluster cluster(3, with(kFast, {"train.rounds=0", "consensus.peer_timeout_ms=1000"}));
  startAndWait(cluster);
  // What an eavesdropper sees in the plaintext handshake: n1's routing id.
  std::smatch match;
  const std::string log = cluster.log(1);
  REQUIRE(std::regex_search(log, match, std::regex("routing id (n1/[0-9a-f]{16})")));
  const std::string stolen = match[1];
  const std::string endpoint = endpointOf(cluster, 0);
  for (int attempt = 0; attempt < 100; ++attempt) {
    Intruder thief(endpoint, stolen);
    thief.send(estimateFrames(1, roundOf(cluster, 0), topologyHash(cluster),
                              std::vector<float>(kDimension, 1000.0f)));
  }
  REQUIRE(answers(cluster, 0));
  CHECK(cluster.child(0).running());
  CHECK(stillMixes(cluster));
  CHECK(neighborOf(cluster, 0, "n1").value("state", "") != "suspect");
}

TEST_CASE("one replayed HELLO for an absent neighbour does not stall the node") {
  // n1 never starts; policy all: n0 would wait for a revived n1.
  Cluster cluster(
      2, with(kFast, {"train.rounds=0", "consensus.policy=all", "consensus.peer_timeout_ms=5000"}));
  cluster.start(0);
  REQUIRE(waitFor([&] { return answers(cluster, 0) && roundOf(cluster, 0) > 20; }, 30s));
  Intruder replay(endpointOf(cluster, 0), "n1");
  REQUIRE(replay.send(helloFrames(1, roundOf(cluster, 0), topologyHash(cluster))));
  const std::int64_t round = roundOf(cluster, 0);
  // A revived n1 would hold every round for the 5 s peer timeout.
  CHECK(waitFor([&] { return roundOf(cluster, 0) > round + 100; }, 3s));
  CHECK(neighborOf(cluster, 0, "n1").value("state", "") == "suspect");
}

TEST_CASE(
    "honest catch-up: restarted from an old checkpoint, a node rejoins a neighbour far ahead") {
  Cluster cluster(2, with(kFast, {"train.rounds=0", "consensus.peer_timeout_ms=300",
                                  "checkpoint.every_rounds=50"}));
  startAndWait(cluster);
  REQUIRE(waitFor([&] { return roundOf(cluster, 0) > 60; }, 30s));
  cluster.child(0).signal(SIGKILL);
  REQUIRE(cluster.child(0).wait(5s).has_value());
  // n1 goes on alone, much further than any horizon of n0's checkpoint.
  const std::int64_t gone = roundOf(cluster, 1);
  REQUIRE(waitFor([&] { return roundOf(cluster, 1) > gone + 2000; }, 60s));
  cluster.start(0);
  REQUIRE(waitFor([&] { return answers(cluster, 0); }, 30s));
  // The log line may reach the file after the status socket answers.
  CHECK(waitFor([&] { return cluster.log(0).find("resumed from") != std::string::npos; }, 10s));
  CHECK(waitFor([&] { return roundOf(cluster, 0) + 30 >= roundOf(cluster, 1); }, 20s));
  CHECK(waitFor([&] { return roundOf(cluster, 0) > gone + 2100; }, 20s));
  const std::uint64_t mixed = neighborOf(cluster, 0, "n1").value("mixed", std::uint64_t{0});
  CHECK(waitFor(
      [&] { return neighborOf(cluster, 0, "n1").value("mixed", std::uint64_t{0}) > mixed + 50; },
      20s));
}

TEST_CASE("a status request cut inside a UTF-8 character gets an error, not a crash") {
  Cluster cluster(1, with(kFast, {"train.rounds=0"}));
  cluster.start(0);
  REQUIRE(waitFor([&] { return answers(cluster, 0); }, 30s));
  const std::string name = std::string(63, 'a') + "\xc3\xa9";  // é across byte 64
  const json answer = ask(cluster, 0, {{"cmd", name}});
  CHECK(answer["ok"] == false);
  CHECK(answer["error"].get<std::string>().rfind("unknown command 'aaa", 0) == 0);
  CHECK(answers(cluster, 0));
  CHECK(cluster.child(0).running());
}

TEST_CASE("a second instance with a running node's config exits 69 and leaves its socket alone") {
  Cluster cluster(1, with(kFast, {"train.rounds=0"}));
  cluster.start(0);
  REQUIRE(waitFor([&] { return answers(cluster, 0); }, 30s));
  std::vector<std::string> argv{CONSENSUSD, "--config", cluster.path("n0.yaml")};
  for (const std::string& o : with(kFast, {"train.rounds=0"}))
    argv.insert(argv.end(), {"--set", o});
  const auto second = runProcess(argv);
  CHECK(second.exitCode == 69);
  CHECK((second.out + second.err).find("is held by a running daemon") != std::string::npos);
  CHECK(answers(cluster, 0));
}

TEST_CASE("checkpoints: a failed write is counted and training goes on, a directory is skipped") {
  Cluster cluster(1, with(kFast, {"train.rounds=0", "checkpoint.every_rounds=20"}));
  // A directory with a checkpoint's name must not stop the start.
  std::filesystem::create_directories(cluster.path("ckpt-n0/round-000000000999.ckpt"));
  cluster.start(0);
  REQUIRE(waitFor([&] { return answers(cluster, 0) && roundOf(cluster, 0) > 50; }, 30s));
  CHECK(cluster.log(0).find("is not a regular file: skipped") != std::string::npos);
  // The checkpoint folder becomes a file: every later write fails.
  std::filesystem::rename(cluster.path("ckpt-n0"), cluster.path("ckpt-moved"));
  { std::ofstream(cluster.path("ckpt-n0")) << "not a folder\n"; }
  CHECK(waitFor(
      [&] {
        return ask(cluster, 0, {{"cmd", "status"}})["checkpoint_failures"] >= 2;
      },
      20s));
  const std::int64_t round = roundOf(cluster, 0);
  CHECK(waitFor([&] { return roundOf(cluster, 0) > round + 100; }, 20s));
  const json status = ask(cluster, 0, {{"cmd", "status"}});
  CHECK(status["last_checkpoint_error"].get<std::string>().find("ckpt-n0") != std::string::npos);
  CHECK(cluster.child(0).running());
  // The older generations are still there.
  CHECK(std::filesystem::exists(cluster.path("ckpt-moved")));
}

TEST_CASE("out of file descriptors, the status socket retries and serves again") {
#if defined(__SANITIZE_ADDRESS__)
  // ASan/UBSan's runtime opens files of its own (/proc/self/maps) inside its
  // checks; with none left it reports errors the daemon does not have.
  MESSAGE("skipped under sanitizers: their runtime needs file descriptors too");
  return;
#endif
  Cluster cluster(1, with(kFast, {"train.rounds=0", "checkpoint.every_rounds=50"}));
  // env runs `prlimit --nofile=48:48 consensusd ...`: a daemon with few descriptors.
  cluster.start(0, {}, {"prlimit", "--nofile=48:48"});
  REQUIRE(waitFor([&] { return answers(cluster, 0); }, 30s));
  std::vector<int> held;
  for (int i = 0; i < 100; ++i) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    const std::string path = cluster.socket(0);
    std::strncpy(address.sun_path, path.c_str(), sizeof address.sun_path - 1);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) {
      held.push_back(fd);
    } else {
      ::close(fd);
    }
  }
  // Held open until the daemon has run out and said so (its log: the
  // socket cannot answer now); then freed.
  CHECK(waitFor([&] { return cluster.log(0).find("accept failed") != std::string::npos; }, 20s));
  for (const int fd : held) ::close(fd);
  std::int64_t round = -1;
  waitFor(
      [&] {
        try {
          round = roundOf(cluster, 0);
          return true;
        } catch (const std::exception&) {
          return false;
        }
      },
      10s);
  REQUIRE(round >= 0);
  CHECK(waitFor([&] { return roundOf(cluster, 0) > round + 100; }, 20s));
  CHECK(ask(cluster, 0, {{"cmd", "status"}})["accept_failures"].get<std::uint64_t>() > 0);
  CHECK(cluster.child(0).running());
}

TEST_CASE("a full disk costs checkpoints, not training, and leaves no partial file") {
  if (::getuid() != 0) {
    MESSAGE("skipped: mounting a small tmpfs needs root");
    return;
  }
  Cluster cluster(1, with(kFast, {"train.rounds=0", "checkpoint.every_rounds=20"}));
  const std::string folder = cluster.path("ckpt-n0");
  std::filesystem::create_directories(folder);
  REQUIRE(::mount("tmpfs", folder.c_str(), "tmpfs", 0, "size=64k") == 0);
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{folder};
  {  // Fill it up.
    std::ofstream filler(folder + "/filler", std::ios::binary);
    const std::string block(4096, 'x');
    while (filler.write(block.data(), static_cast<std::streamsize>(block.size())) &&
           filler.flush()) {
    }
  }
  cluster.start(0);
  REQUIRE(waitFor([&] { return answers(cluster, 0); }, 30s));
  CHECK(waitFor(
      [&] {
        return ask(cluster, 0, {{"cmd", "status"}})["checkpoint_failures"] >= 3;
      },
      20s));
  const json status = ask(cluster, 0, {{"cmd", "status"}});
  CHECK(status["last_checkpoint_error"].get<std::string>().find("No space left on device") !=
        std::string::npos);
  // No partial file stays: a save in progress has its temporary file for a
  // moment (the node keeps trying every 20 rounds), a failed one removes it.
  const auto noTemporary = [&] {
    for (const auto& entry : std::filesystem::directory_iterator(folder))
      if (entry.path().extension() == ".tmp") return false;
    return true;
  };
  CHECK(waitFor(noTemporary, 5s));
  const std::int64_t round = roundOf(cluster, 0);
  CHECK(waitFor([&] { return roundOf(cluster, 0) > round + 100; }, 20s));
  // Room again: the next checkpoint commits.
  std::filesystem::remove(folder + "/filler");
  CHECK(waitFor(
      [&] {
        return ask(cluster, 0, {{"cmd", "status"}})["last_checkpoint_round"] > round;
      },
      20s));
  CHECK(cluster.child(0).running());
}

TEST_CASE("a bug on the compute thread stops the node cleanly: a checkpoint, then exit 70") {
  Cluster cluster(1, with(kFast, {"train.rounds=0"}));
  Child& node = cluster.start(0, {}, {"CONSENSUSD_FAILPOINT=compute-throw@300"});
  const auto code = node.wait(60s);
  REQUIRE(code.has_value());
  CHECK(*code == 70);
  const std::string log = cluster.log(0);
  CHECK(log.find("internal error on the engine thread: failpoint compute-throw") !=
        std::string::npos);
  CHECK(log.find("checkpoint ") != std::string::npos);
  bool saved = false;
  for (const auto& entry : std::filesystem::directory_iterator(cluster.path("ckpt-n0")))
    saved = saved || entry.path().filename().string() == "round-000000000300.ckpt";
  CHECK(saved);
}

TEST_CASE("status shows a reject within a second or so even while no round completes") {
  Cluster cluster(1, with(kFast, {"train.rounds=0", "log.progress_every_s=600"}));
  cluster.start(0);
  REQUIRE(waitFor([&] { return answers(cluster, 0); }, 30s));
  REQUIRE(ask(cluster, 0, {{"cmd", "pause"}})["ok"] == true);
  Intruder stranger(endpointOf(cluster, 0), "n9");
  REQUIRE(stranger.send(estimateFrames(0, 1, topologyHash(cluster), {1.0f})));
  CHECK(waitFor([&] { return rejectsOf(cluster, 0, "not_neighbor") >= 1; }, 3s));
  CHECK(ask(cluster, 0, {{"cmd", "status"}})["phase"] == "paused");
}
