#include "status/telemetry.hpp"

namespace consensusd::daemon {
namespace {

double ms(consensus::Duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

}  // namespace

Telemetry::Telemetry(std::string metricsFile) : metricsFile_(std::move(metricsFile)) {}

void Telemetry::onEvaluation(std::int64_t round, const data::Evaluation& evaluation) {
  owner_.check();
  pendingEvaluation_ = {round, evaluation};
}

void Telemetry::onRecord(const consensus::RoundRecord& record, const Traffic& traffic) {
  owner_.check();
  ++finishedRounds_;
  lossEwma_ = finishedRounds_ == 1 ? record.loss : lossEwma_ + 0.05 * (record.loss - lossEwma_);
  lastRecord_ = record;
  ++cutoffs_[consensus::cutoffName(record.reason)];
  nlohmann::json line = {{"t", std::chrono::duration<double>(record.end).count()},
                         {"round", record.round},
                         {"next", record.nextRound},
                         {"loss", record.loss},
                         {"target", record.target},
                         {"cutoff", consensus::cutoffName(record.reason)},
                         {"responders", record.responders.size()},
                         {"live", record.live},
                         {"duration_ms", ms(record.end - record.start)},
                         {"compute_ms", ms(record.compute)},
                         {"blocked_ms", ms(record.blocked)},
                         {"distance", record.consensusDistance},
                         {"skipped", record.skipped},
                         {"adopted", record.adopted},
                         {"sent_bytes", traffic.sentBytes},
                         {"received_bytes", traffic.receivedBytes},
                         {"samples", traffic.samples}};
  if (pendingEvaluation_ && pendingEvaluation_->first == record.round) {
    accuracy_ = pendingEvaluation_->second.accuracy;
    testLoss_ = pendingEvaluation_->second.loss;
    line["accuracy"] = accuracy_;
    line["test_loss"] = testLoss_;
    pendingEvaluation_.reset();
  }
  write(line);
  history_.push_back(std::make_shared<const nlohmann::json>(std::move(line)));
  while (history_.size() > kHistory) history_.pop_front();
}

double Telemetry::roundsPerSecond(consensus::Time now) const {
  owner_.check();
  if (history_.empty()) return 0.0;
  // Skips count as rounds.
  const nlohmann::json& first = *history_.front();
  const nlohmann::json& last = *history_.back();
  const double until =
      std::max(last["t"].get<double>(), std::chrono::duration<double>(now).count());
  const double span = until - first["t"].get<double>();
  const auto rounds = last["next"].get<std::int64_t>() - first["next"].get<std::int64_t>();
  return span > 0 ? static_cast<double>(rounds) / span : 0.0;
}

void Telemetry::setFinal(const data::Evaluation& evaluation) {
  owner_.check();
  accuracy_ = evaluation.accuracy;
  testLoss_ = evaluation.loss;
}

void Telemetry::writeSummary(const nlohmann::json& summary) {
  owner_.check();
  write(summary);
}

void Telemetry::write(const nlohmann::json& line) {
  if (metricsFile_.empty()) return;
  if (!metrics_) metrics_ = std::make_unique<std::ofstream>(metricsFile_, std::ios::app);
  *metrics_ << line.dump() << '\n';
}

void Telemetry::fill(StatusSnapshot& status, consensus::Time now) const {
  owner_.check();
  status.responders = lastRecord_ ? lastRecord_->responders.size() : 0;
  status.loss = lossEwma_;
  status.accuracy = accuracy_;
  status.testLoss = testLoss_;
  status.consensusDistance = lastRecord_ ? lastRecord_->consensusDistance : 0;
  status.roundsPerSecond = roundsPerSecond(now);
  status.finishedRounds = finishedRounds_;
  status.history = history_;  // pointers: a snapshot every 50 ms copies no JSON
  status.cutoffs = cutoffs_;
}

}  // namespace consensusd::daemon
