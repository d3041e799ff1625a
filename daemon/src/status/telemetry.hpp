#pragma once
// What a node tells about its training: the loss EWMA, the last test
// evaluation, rounds per second, the recent round records (status
// `history`) and the metrics file (log.metrics_file: one JSON line per
// round, a summary line at the end). Owned by the engine thread.

#include <cstdint>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "consensusd/consensus/round_engine.hpp"
#include "consensusd/daemon/status.hpp"
#include "consensusd/data/model.hpp"
#include "os/owner_thread.hpp"

namespace consensusd::daemon {

// What a node moved and trained on so far.
struct Traffic {
  std::uint64_t sentBytes = 0;      // estimate payload sent (frames and whole estimates)
  std::uint64_t receivedBytes = 0;  // estimate payload received
  std::uint64_t samples = 0;        // training samples behind the updates taken
};

class Telemetry {
 public:
  static constexpr std::size_t kHistory = 200;  // round records kept for `history`

  explicit Telemetry(std::string metricsFile);  // "": no file

  // A test evaluation at round `round`'s parameters: reported with that round's record.
  void onEvaluation(std::int64_t round, const data::Evaluation& evaluation);
  // `traffic`: what the node moved and trained on so far, in the round's line.
  void onRecord(const consensus::RoundRecord& record, const Traffic& traffic = {});
  // The evaluation of the final parameters, for status and the summary.
  void setFinal(const data::Evaluation& evaluation);
  void writeSummary(const nlohmann::json& summary);

  double loss() const { return lossEwma_; }      // EWMA of minibatch losses
  double accuracy() const { return accuracy_; }  // -1 before the first evaluation
  double testLoss() const { return testLoss_; }
  // Rounds per second over the history window, up to `now`: a node that
  // stalls sees it fall instead of keeping its last value.
  double roundsPerSecond(consensus::Time now) const;
  // The training fields of a status snapshot: loss, accuracy, rate, history...
  void fill(StatusSnapshot& status, consensus::Time now) const;

 private:
  void write(const nlohmann::json& line);

  OwnerThread owner_;
  std::string metricsFile_;
  std::unique_ptr<std::ofstream> metrics_;  // opened at the first line
  std::optional<std::pair<std::int64_t, data::Evaluation>> pendingEvaluation_;
  std::optional<consensus::RoundRecord> lastRecord_;
  std::uint64_t finishedRounds_ = 0;
  double lossEwma_ = 0;
  double accuracy_ = -1;
  double testLoss_ = -1;
  std::deque<std::shared_ptr<const nlohmann::json>> history_;
  std::map<std::string, std::uint64_t> cutoffs_;  // rounds ended, by cut-off reason
};

}  // namespace consensusd::daemon
