#include "consensusd/daemon/status.hpp"

#include <string_view>

namespace consensusd::daemon {

namespace {

// Bytes per round or per sample; null before the first.
nlohmann::json perUnit(std::uint64_t bytes, std::uint64_t units) {
  if (units == 0) return nullptr;
  return static_cast<double>(bytes) / static_cast<double>(units);
}

}  // namespace

namespace {

// Sets key to value when `wanted` has it, or always without a list: only
// the fields a poller asked for are built (a status is built for every
// request, and building the rest only to drop it was most of the cost).
class FieldWriter {
 public:
  FieldWriter(nlohmann::json& out, const std::set<std::string, std::less<>>* wanted)
      : out_(out), wanted_(wanted) {}

  bool wants(std::string_view key) const { return wanted_ == nullptr || wanted_->contains(key); }

  template <typename Value>
  void put(std::string_view key, const Value& value) {
    if (wants(key)) out_[std::string(key)] = value;
  }

 private:
  nlohmann::json& out_;
  const std::set<std::string, std::less<>>* wanted_;
};

nlohmann::json neighborJson(const NeighborStatus& n,
                            const std::set<std::string, std::less<>>* wanted) {
  nlohmann::json out = nlohmann::json::object();
  FieldWriter field(out, wanted);
  field.put("id", n.id);
  field.put("state", n.state);
  field.put("last_round", n.lastRound);
  field.put("median_arrival_ms", n.medianArrivalMs);
  field.put("p90_arrival_ms", n.p90ArrivalMs);
  field.put("on_time", n.onTime);
  field.put("late", n.late);
  field.put("stale", n.stale);
  field.put("duplicate", n.duplicate);
  field.put("rejected", n.rejected);
  field.put("mixed", n.mixed);
  field.put("frame_gaps", n.frameGaps);
  field.put("frame_corrupt", n.frameCorrupt);
  field.put("received_bytes", n.receivedBytes);
  field.put("sent_bytes", n.sentBytes);
  field.put("bytes_per_s", n.bytesPerSecond);
  field.put("transfer_ms", n.transferMs);
  field.put("previous_graph", n.previousGraph);
  return out;
}

nlohmann::json neighborsJson(const StatusSnapshot& status,
                             const std::set<std::string, std::less<>>* wanted) {
  nlohmann::json list = nlohmann::json::array();
  for (const NeighborStatus& n : status.neighbors) list.push_back(neighborJson(n, wanted));
  return list;
}

}  // namespace

nlohmann::json neighborsJson(const StatusSnapshot& status) {
  return neighborsJson(status, nullptr);
}

std::optional<StatusFields> StatusFields::parse(const nlohmann::json& names) {
  constexpr std::size_t kMaxFields = 128;
  constexpr std::size_t kMaxName = 64;
  if (!names.is_array() || names.size() > kMaxFields) return std::nullopt;
  constexpr std::string_view kPrefix = "neighbors.";
  StatusFields fields;
  for (const auto& name : names) {
    if (!name.is_string() || name.get_ref<const std::string&>().size() > kMaxName)
      return std::nullopt;
    const auto& text = name.get_ref<const std::string&>();
    if (text.starts_with(kPrefix)) {
      fields.neighborKeys.insert(text.substr(kPrefix.size()));
    } else {
      fields.keys.insert(text);
    }
  }
  return fields;
}

nlohmann::json toJson(const StatusSnapshot& status, const StatusFields* only) {
  nlohmann::json out = nlohmann::json::object();
  FieldWriter field(out, only == nullptr ? nullptr : &only->keys);
  field.put("node", status.node);
  field.put("version", status.version);
  field.put("round", status.round);
  field.put("phase", status.phase);
  field.put("policy", status.policy);
  field.put("target", status.target);
  field.put("backups", status.degree - std::min(status.target, status.degree));
  field.put("degree", status.degree);
  field.put("cutoffs", status.cutoffs);
  field.put("responders", status.responders);
  field.put("suspects", status.suspects);
  field.put("loss", status.loss);
  field.put("accuracy", status.accuracy);
  field.put("test_loss", status.testLoss);
  field.put("consensus_distance", status.consensusDistance);
  field.put("rounds_per_s", status.roundsPerSecond);
  field.put("last_checkpoint_round", status.lastCheckpointRound);
  field.put("joined_at_round", status.joinedAtRound);
  field.put("topology", status.topology);
  field.put("topology_hash", status.topologyHash);
  field.put("topology_changes", status.topologyChanges);
  field.put("removed_by", status.removedBy);
  field.put("checkpoint_failures", status.checkpointFailures);
  field.put("last_checkpoint_error", status.lastCheckpointError);
  field.put("accept_failures", status.acceptFailures);
  field.put("uptime_s", status.uptimeS);
  field.put("paused", status.paused);
  field.put("accepted", status.accepted);
  field.put("rejects", status.rejects);
  field.put("discarded", status.discarded);
  field.put("sends", status.sends);
  field.put("connections_closed", status.connectionsClosed);
  field.put("bytes_sent", status.bytesSent);
  field.put("bytes_received", status.bytesReceived);
  field.put("samples", status.samples);
  field.put("sent_bytes_per_round", perUnit(status.bytesSent, status.finishedRounds));
  field.put("sent_bytes_per_sample", perUnit(status.bytesSent, status.samples));
  field.put("class_histogram", status.classHistogram);
  if (field.wants("neighbors")) {
    out["neighbors"] = neighborsJson(status, nullptr);
  } else if (!only->neighborKeys.empty()) {
    out["neighbors"] = neighborsJson(status, &only->neighborKeys);
  }
  if (status.trainer && field.wants("trainer")) {
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
