#include "consensusd/daemon/status.hpp"

namespace consensusd::daemon {

namespace {

// Bytes per round or per sample; null before the first.
nlohmann::json perUnit(std::uint64_t bytes, std::uint64_t units) {
  if (units == 0) return nullptr;
  return static_cast<double>(bytes) / static_cast<double>(units);
}

}  // namespace

nlohmann::json neighborsJson(const StatusSnapshot& status) {
  nlohmann::json list = nlohmann::json::array();
  for (const NeighborStatus& n : status.neighbors) {
    list.push_back({{"id", n.id},
                    {"state", n.state},
                    {"last_round", n.lastRound},
                    {"median_arrival_ms", n.medianArrivalMs},
                    {"p90_arrival_ms", n.p90ArrivalMs},
                    {"on_time", n.onTime},
                    {"late", n.late},
                    {"stale", n.stale},
                    {"duplicate", n.duplicate},
                    {"rejected", n.rejected},
                    {"mixed", n.mixed},
                    {"frame_gaps", n.frameGaps},
                    {"frame_corrupt", n.frameCorrupt},
                    {"received_bytes", n.receivedBytes},
                    {"sent_bytes", n.sentBytes},
                    {"bytes_per_s", n.bytesPerSecond},
                    {"transfer_ms", n.transferMs},
                    {"previous_graph", n.previousGraph}});
  }
  return list;
}

nlohmann::json toJson(const StatusSnapshot& status) {
  nlohmann::json out = {{"node", status.node},
                        {"version", status.version},
                        {"round", status.round},
                        {"phase", status.phase},
                        {"policy", status.policy},
                        {"target", status.target},
                        {"backups", status.degree - std::min(status.target, status.degree)},
                        {"degree", status.degree},
                        {"cutoffs", status.cutoffs},
                        {"responders", status.responders},
                        {"suspects", status.suspects},
                        {"loss", status.loss},
                        {"accuracy", status.accuracy},
                        {"test_loss", status.testLoss},
                        {"consensus_distance", status.consensusDistance},
                        {"rounds_per_s", status.roundsPerSecond},
                        {"last_checkpoint_round", status.lastCheckpointRound},
                        {"joined_at_round", status.joinedAtRound},
                        {"topology", status.topology},
                        {"topology_hash", status.topologyHash},
                        {"topology_changes", status.topologyChanges},
                        {"removed_by", status.removedBy},
                        {"checkpoint_failures", status.checkpointFailures},
                        {"last_checkpoint_error", status.lastCheckpointError},
                        {"accept_failures", status.acceptFailures},
                        {"uptime_s", status.uptimeS},
                        {"paused", status.paused},
                        {"accepted", status.accepted},
                        {"rejects", status.rejects},
                        {"discarded", status.discarded},
                        {"sends", status.sends},
                        {"connections_closed", status.connectionsClosed},
                        {"bytes_sent", status.bytesSent},
                        {"bytes_received", status.bytesReceived},
                        {"samples", status.samples},
                        {"sent_bytes_per_round", perUnit(status.bytesSent, status.finishedRounds)},
                        {"sent_bytes_per_sample", perUnit(status.bytesSent, status.samples)},
                        {"class_histogram", status.classHistogram},
                        {"neighbors", neighborsJson(status)}};
  if (status.trainer) {
    const TrainerStatus& t = *status.trainer;
    out["trainer"] = {{"attached", t.attached},
                      {"pid", t.pid},
                      {"attaches", t.attaches},
                      {"updates", t.updates},
                      {"rejected_updates", t.rejectedUpdates},
                      {"refused", t.refused},
                      {"mean_update_ms", t.meanUpdateMs},
                      {"p95_update_ms", t.p95UpdateMs}};
  }
  return out;
}

std::string serialize(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void StatusBoard::publish(std::shared_ptr<const StatusSnapshot> snapshot, Clock::time_point now) {
  const std::lock_guard lock(mutex_);
  snapshot_ = std::move(snapshot);
  publishedAt_ = now;
}

bool StatusBoard::live(Clock::time_point now) const {
  const std::lock_guard lock(mutex_);
  return snapshot_ != nullptr && now - publishedAt_ <= kStallLimit;
}

std::shared_ptr<const StatusSnapshot> StatusBoard::current() const {
  const std::lock_guard lock(mutex_);
  return snapshot_;
}

void StatusBoard::submit(Command command) {
  const std::lock_guard lock(mutex_);
  commands_.push_back(std::move(command));
}

std::vector<Command> StatusBoard::drain() {
  const std::lock_guard lock(mutex_);
  std::vector<Command> out;
  out.swap(commands_);
  return out;
}

}  // namespace consensusd::daemon
