// Crash consistency of checkpoints with real daemons: killed at each point
// of a checkpoint write (CONSENSUSD_FAILPOINT), and by SIGKILL at random
// moments, a node always finds its last committed checkpoint, resumes from
// it, and reports it honestly; a truncated newest file is set aside and the
// older generation used.

#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <random>
#include <thread>

#include "cluster.hpp"
#include "cluster_status.hpp"

using consensusd::testing::answers;
using consensusd::testing::ask;
using consensusd::testing::Cluster;
using consensusd::testing::kFast;
using consensusd::testing::roundOf;
using consensusd::testing::waitFor;
using consensusd::testing::with;
using nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

struct Files {
  std::vector<std::int64_t> committed;  // rounds of round-*.ckpt, ascending
  std::size_t temporary = 0;            // .round-*.ckpt.tmp: being written, or left by a crash
};

Files filesIn(const std::string& folder) {
  Files files;
  for (const auto& entry : fs::directory_iterator(folder)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("round-", 0) == 0 && entry.path().extension() == ".ckpt")
      files.committed.push_back(std::stoll(name.substr(6)));
    if (entry.path().extension() == ".tmp") ++files.temporary;
  }
  std::sort(files.committed.begin(), files.committed.end());
  return files;
}

std::int64_t lastCheckpoint(const Cluster& cluster, std::size_t i) {
  return ask(cluster, i, {{"cmd", "status"}}).value("last_checkpoint_round", std::int64_t{-2});
}

std::string fileOf(const Cluster& cluster, std::int64_t round) {
  char name[40];
  std::snprintf(name, sizeof name, "round-%012lld.ckpt", static_cast<long long>(round));
  return cluster.path(std::string("ckpt-n0/") + name);
}

}  // namespace

TEST_CASE("killed at each point of a checkpoint write, a node resumes from its last commit") {
  for (const std::string point :
       {"checkpoint-before-fsync", "checkpoint-before-rename", "checkpoint-before-dir-fsync"}) {
    CAPTURE(point);
    Cluster cluster(1, with(kFast, {"train.rounds=0", "checkpoint.every_rounds=50"}));
    // The third save (round 150) dies half-way.
    consensusd::testing::Child& child =
        cluster.start(0, {}, {"CONSENSUSD_FAILPOINT=" + point + "@3"});
    REQUIRE(child.wait(60s) == -SIGKILL);
    const Files after = filesIn(cluster.path("ckpt-n0"));
    const bool renamed = point == "checkpoint-before-dir-fsync";
    // Renamed but killed before the folder fsync and the pruning: three generations.
    CHECK(after.committed ==
          (renamed ? std::vector<std::int64_t>{50, 100, 150} : std::vector<std::int64_t>{50, 100}));
    CHECK(after.temporary == (renamed ? 0u : 1u));

    // Restarted: it resumes from the newest committed file and says so.
    const std::int64_t committed = after.committed.back();
    cluster.start(0);
    REQUIRE(waitFor([&] { return answers(cluster, 0); }, 30s));
    CHECK(cluster.log(0).find("resumed from " + fileOf(cluster, committed)) != std::string::npos);
    CHECK(lastCheckpoint(cluster, 0) >= committed);
    // Its next commits clear what the crash left.
    REQUIRE(waitFor([&] { return lastCheckpoint(cluster, 0) > committed + 100; }, 30s));
    CHECK_FALSE(fs::exists(cluster.path("ckpt-n0/.round-000000000150.ckpt.tmp")));

    // A torn newest file (truncated by hand after a kill): set aside, the older one used.
    cluster.child(0).signal(SIGKILL);
    REQUIRE(cluster.child(0).wait(10s) == -SIGKILL);
    // (Two generations, or three if the kill fell between a rename and the pruning.)
    const Files kept = filesIn(cluster.path("ckpt-n0"));
    REQUIRE(kept.committed.size() >= 2);
    const std::int64_t newest = kept.committed.back();
    const std::int64_t older = kept.committed[kept.committed.size() - 2];
    fs::resize_file(fileOf(cluster, newest), 100);
    cluster.start(0);
    REQUIRE(waitFor([&] { return answers(cluster, 0); }, 30s));
    const std::string log = cluster.log(0);
    CHECK(log.find("resumed from " + fileOf(cluster, older)) != std::string::npos);
    CHECK(log.find("rejected (size 100, expected") != std::string::npos);
    CHECK(fs::exists(fileOf(cluster, newest) + ".rejected"));
  }
}

TEST_CASE("SIGKILL at random moments never loses a committed checkpoint") {
  Cluster cluster(2, with(kFast, {"train.rounds=0", "checkpoint.every_rounds=20",
                                  "consensus.peer_timeout_ms=300"}));
  cluster.startAll();
  std::mt19937 random(20261130);  // the kill moments are random, and the same every run
  std::uniform_int_distribution<int> delayMs(0, 300);
  for (int kill = 0; kill < 12; ++kill) {
    CAPTURE(kill);
    REQUIRE(waitFor([&] { return answers(cluster, 0) && lastCheckpoint(cluster, 0) >= 0; }, 30s));
    // Not a wait for a condition: the point is to land anywhere, mid-write included.
    std::this_thread::sleep_for(std::chrono::milliseconds(delayMs(random)));
    const std::int64_t reported = lastCheckpoint(cluster, 0);
    cluster.child(0).signal(SIGKILL);
    REQUIRE(cluster.child(0).wait(10s) == -SIGKILL);
    cluster.start(0);
    REQUIRE(waitFor([&] { return answers(cluster, 0); }, 30s));
    // Nothing it reported committed is lost, and no committed file is ever torn.
    CHECK(lastCheckpoint(cluster, 0) >= reported);
    CHECK(cluster.log(0).find("resumed from") != std::string::npos);
    CHECK(cluster.log(0).find("rejected") == std::string::npos);
  }
}

TEST_CASE("a checkpoint stuck on its disk holds no thread: the node goes on and keeps talking") {
  // A FIFO where the save of round 10 writes its temporary file: the write
  // hangs until somebody reads, as on a filesystem that stops answering.
  Cluster cluster(2, with(kFast, {"train.rounds=0", "checkpoint.every_rounds=10",
                                  "consensus.peer_timeout_ms=300"}));
  fs::create_directories(cluster.path("ckpt-n0"));
  const std::string fifo = cluster.path("ckpt-n0/.round-000000000010.ckpt.tmp");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // n0 starts alone, so it trains through round 10 itself: started beside
  // n1, it could join n1 past round 10 (a slow start) and never save there.
  cluster.start(0);

  // Past the stuck save, n0 trains on to round 20, where the next save it
  // wants waits for the writer: the round is held, the engine thread is not.
  REQUIRE(waitFor(
      [&] {
        return answers(cluster, 0) &&
               ask(cluster, 0, {{"cmd", "status"}})["phase"] == "checkpointing";
      },
      30s));
  CHECK(roundOf(cluster, 0) == 20);
  CHECK(lastCheckpoint(cluster, 0) == -1);
  // It keeps answering its neighbour: n1, started now, hears it and never
  // counts it out (five peer timeouts watched).
  cluster.start(1);
  REQUIRE(waitFor(
      [&] {
        if (!answers(cluster, 1)) return false;
        const json neighbors = ask(cluster, 1, {{"cmd", "neighbors"}});
        return neighbors["neighbors"].size() == 1 && neighbors["neighbors"][0]["last_round"] == 20;
      },
      30s));
  const auto watchedUntil = std::chrono::steady_clock::now() + 1500ms;
  while (std::chrono::steady_clock::now() < watchedUntil) {
    const json neighbors = ask(cluster, 1, {{"cmd", "neighbors"}});
    REQUIRE(neighbors["neighbors"].size() == 1);
    CHECK(neighbors["neighbors"][0]["state"] != "suspect");
    CHECK(roundOf(cluster, 0) == 20);
  }

  // The disk answers (a reader drains the FIFO); a FIFO cannot be fsynced,
  // so that save fails and is counted, and the one held at round 20 commits.
  const int fd = ::open(fifo.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  char buffer[4096];
  while (::read(fd, buffer, sizeof buffer) > 0) {
  }
  ::close(fd);
  REQUIRE(waitFor([&] { return lastCheckpoint(cluster, 0) >= 30; }, 30s));
  const json status = ask(cluster, 0, {{"cmd", "status"}});
  CHECK(status["checkpoint_failures"] == 1);
  CHECK(status["last_checkpoint_error"].get<std::string>().find("fsync") != std::string::npos);
  CHECK(cluster.log(0).find(fileOf(cluster, 20) + " (round 20)") != std::string::npos);
}
