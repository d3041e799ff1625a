// The node's telemetry on its own: loss EWMA, rate, history bound, metrics file.

#include "status/telemetry.hpp"

#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "consensusd/daemon/status_server.hpp"
#include "process.hpp"

using namespace consensusd;
using consensusd::daemon::Telemetry;
using consensusd::testing::TempDir;

namespace {

consensus::RoundRecord record(std::int64_t round, double loss) {
  consensus::RoundRecord r;
  r.round = round;
  r.nextRound = round + 1;
  r.start = std::chrono::milliseconds(10 * round);
  r.end = std::chrono::milliseconds(10 * round + 10);  // 100 rounds per second
  r.loss = loss;
  r.responders = {1, 2};
  r.consensusDistance = 0.5;
  return r;
}

std::vector<nlohmann::json> lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace

TEST_CASE("telemetry: EWMA, rate and evaluations follow the records") {
  Telemetry telemetry("");
  telemetry.onRecord(record(0, 2.0));
  CHECK(telemetry.loss() == 2.0);  // the first loss as it is
  telemetry.onRecord(record(1, 1.0));
  CHECK(telemetry.loss() == doctest::Approx(2.0 - 0.05));
  CHECK(telemetry.roundsPerSecond(std::chrono::milliseconds(20)) == doctest::Approx(100.0));
  // No round for 0.98 s more: the rate falls with the silence.
  CHECK(telemetry.roundsPerSecond(std::chrono::seconds(1)) == doctest::Approx(1.0 / 0.99));
  CHECK(telemetry.accuracy() == -1);

  // An evaluation shows with its own round's record, not before.
  telemetry.onEvaluation(3, data::Evaluation{0.25, 0.75});
  telemetry.onRecord(record(2, 1.0));
  CHECK(telemetry.accuracy() == -1);
  telemetry.onRecord(record(3, 1.0));
  CHECK(telemetry.accuracy() == 0.75);
  CHECK(telemetry.testLoss() == 0.25);

  daemon::StatusSnapshot status;
  telemetry.fill(status, {});
  CHECK(status.responders == 2);
  CHECK(status.consensusDistance == 0.5);
  CHECK(status.history.size() == 4);
  CHECK((*status.history.back())["accuracy"] == 0.75);
}

TEST_CASE("telemetry: each round says what ended it, and the status counts the reasons") {
  Telemetry telemetry("");
  const auto ended = [&](std::int64_t round, consensus::CutoffReason reason) {
    consensus::RoundRecord r = record(round, 1.0);
    r.reason = reason;
    telemetry.onRecord(r);
  };
  ended(0, consensus::CutoffReason::Count);
  ended(1, consensus::CutoffReason::Deadline);
  ended(2, consensus::CutoffReason::Count);
  ended(3, consensus::CutoffReason::Timeout);
  daemon::StatusSnapshot status;
  telemetry.fill(status, {});
  CHECK(status.cutoffs ==
        std::map<std::string, std::uint64_t>{{"count", 2}, {"deadline", 1}, {"timeout", 1}});
  CHECK((*status.history[1])["cutoff"] == "deadline");
  CHECK(daemon::toJson(status)["cutoffs"]["count"] == 2);
  CHECK(daemon::prometheusText(status).find(
            "consensusd_round_cutoffs_total{node=\"\",reason=\"timeout\"} 1") != std::string::npos);
}

TEST_CASE("telemetry: the history is bounded and the metrics file gets every line") {
  TempDir dir;
  const std::string path = dir.path() + "/metrics.jsonl";
  {
    Telemetry telemetry(path);
    for (std::int64_t r = 0; r < 250; ++r) telemetry.onRecord(record(r, 1.0));
    daemon::StatusSnapshot status;
    telemetry.fill(status, {});
    CHECK(status.history.size() == Telemetry::kHistory);
    CHECK((*status.history.front())["round"] == 250 - Telemetry::kHistory);
    telemetry.writeSummary({{"final", true}});
  }
  const auto written = lines(path);
  REQUIRE(written.size() == 251);
  CHECK(written[0]["round"] == 0);
  CHECK(written[249]["duration_ms"] == doctest::Approx(10.0));
  CHECK(written[250]["final"] == true);
}

TEST_CASE("telemetry: without rounds no metrics file is created") {
  TempDir dir;
  { Telemetry telemetry(dir.path() + "/metrics.jsonl"); }
  CHECK_FALSE(std::ifstream(dir.path() + "/metrics.jsonl").good());
}

#ifndef NDEBUG
TEST_CASE("telemetry: a call from another thread than its owner's aborts (builds with asserts)") {
  Telemetry telemetry("");
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {                 // the child's only thread owns nothing: the check must fire
    std::signal(SIGABRT, SIG_DFL);  // not doctest's handler: the parent reads the signal
    std::thread intruder([&] { telemetry.onRecord(record(0, 1.0)); });
    intruder.join();
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGABRT);
  telemetry.onRecord(record(0, 1.0));  // the owner itself may
  CHECK(telemetry.loss() == 1.0);
}
#endif
