#pragma once
// What the engine thread publishes for the status server: an immutable
// snapshot, replaced after every round (readers keep the one they hold), and
// the commands that flow back to the engine.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace consensusd::daemon {

struct NeighborStatus {
  std::string id;
  std::string state;  // "fresh", "late", "suspect", "idle" (no trainer)
  std::int64_t lastRound = -1;
  double medianArrivalMs = 0;
  double p90ArrivalMs = 0;
  std::uint64_t onTime = 0;
  std::uint64_t late = 0;
  std::uint64_t stale = 0;
  std::uint64_t duplicate = 0;
  std::uint64_t rejected = 0;
  std::uint64_t mixed = 0;
  // Compressed frames not applied (a keyframe was asked for): a gap in its
  // sequence, or one that does not decode.
  std::uint64_t frameGaps = 0;
  std::uint64_t frameCorrupt = 0;
  std::uint64_t receivedBytes = 0;  // estimate payload from it
  std::uint64_t sentBytes = 0;      // estimate payload to it (frames, keyframes)
  double bytesPerSecond = 0;        // over the last second or more
  // Its last estimate of several chunks, first chunk to last (0: none, or
  // estimates of one chunk).
  double transferMs = 0;
  // After a topology change: it still speaks the graph this node left.
  bool previousGraph = false;
};

// The attached trainer (model.kind: external).
struct TrainerStatus {
  bool attached = false;
  std::int64_t pid = 0;
  std::uint64_t attaches = 0;
  std::uint64_t updates = 0;
  std::uint64_t rejectedUpdates = 0;  // wrong round, kind or length, NaN/Inf
  std::uint64_t refused = 0;          // connections refused (second trainer, stranger, bad hello)
  double meanUpdateMs = 0;            // publish -> update, over the recent window
  double p95UpdateMs = 0;
};

struct StatusSnapshot {
  std::string node;
  std::string version;
  std::int64_t round = 0;
  std::string phase;
  std::string policy;
  std::size_t target = 0;  // m
  // Rounds ended by each cut-off: count (the m waited for were in), timeout
  // (the policy's time limit), deadline (consensus.hard_deadline_ms).
  std::map<std::string, std::uint64_t> cutoffs;
  std::size_t degree = 0;
  std::size_t responders = 0;
  std::size_t suspects = 0;
  double loss = 0;       // EWMA of minibatch losses
  double accuracy = -1;  // last test evaluation; -1 before the first
  double testLoss = -1;
  double consensusDistance = 0;
  double roundsPerSecond = 0;
  std::int64_t lastCheckpointRound = -1;
  // Started fresh in a running cluster: the round at which it took its
  // neighbours' estimates (-1: it did not).
  std::int64_t joinedAtRound = -1;
  // The graph it runs (its file, and the hash every message carries), and
  // how many were applied since it started.
  std::string topology;
  std::string topologyHash;  // 16 hex digits
  std::uint64_t topologyChanges = 0;
  // Times a neighbour said it removed this node from its graph (it still
  // runs one where they are neighbours).
  std::uint64_t removedBy = 0;
  std::uint64_t checkpointFailures = 0;  // periodic or asked-for checkpoints not written
  std::string lastCheckpointError;       // why the last one failed ("" if none has)
  std::uint64_t acceptFailures = 0;      // status/HTTP accepts that failed (EMFILE...)
  double uptimeS = 0;
  bool paused = false;
  std::vector<NeighborStatus> neighbors;
  std::optional<TrainerStatus> trainer;  // with model.kind: external
  std::uint64_t accepted = 0;            // messages that passed validation and the round check
  // Messages refused (malformed, foreign, implausible), by reason.
  std::map<std::string, std::uint64_t> rejects;
  // Well-formed estimates not kept (normal under asynchrony): stale, duplicate.
  std::map<std::string, std::uint64_t> discarded;
  // Outgoing: deferred (queue full, sent later), superseded (a newer round
  // replaced it before it left), dropped (a control message the bound let go).
  std::map<std::string, std::uint64_t> sends;
  std::uint64_t connectionsClosed = 0;      // by peers or by ZeroMQ (oversized frames)
  std::uint64_t bytesSent = 0;              // estimate payload (frames, keyframes) sent
  std::uint64_t bytesReceived = 0;          // estimate payload from all neighbours
  std::uint64_t samples = 0;                // training samples behind the updates taken
  std::uint64_t finishedRounds = 0;         // rounds this process finished (for per round)
  std::vector<std::size_t> classHistogram;  // this node's training samples per class
  // Recent round records, shared with the node (a snapshot copies pointers).
  std::deque<std::shared_ptr<const nlohmann::json>> history;
  std::string configYaml;  // the effective config
};

// The fields of a status a poller names: "key" a top-level field,
// "neighbors.key" that field of each neighbour (which then has only those;
// "neighbors" keeps them whole). Names the daemon does not know are left
// out, so a poller can ask an older daemon.
struct StatusFields {
  std::set<std::string, std::less<>> keys;
  std::set<std::string, std::less<>> neighborKeys;

  // None if `names` is not an array of at most 128 names of at most 64 bytes.
  static std::optional<StatusFields> parse(const nlohmann::json& names);
};

// The status as JSON: every field, or only those `only` names.
nlohmann::json toJson(const StatusSnapshot& status, const StatusFields* only = nullptr);
// JSON text that never throws: invalid UTF-8 (a peer's bytes cut anywhere)
// becomes U+FFFD. Every answer and body goes out through it.
std::string serialize(const nlohmann::json& value);
nlohmann::json neighborsJson(const StatusSnapshot& status);

// A request for the engine thread; `reply` is called there with the answer.
struct Command {     // NOLINT(bugprone-exception-escape): moves of std::function and json
  std::string name;  // set-policy, apply, checkpoint, pause, resume, stop
  nlohmann::json args;
  std::function<void(nlohmann::json)> reply;
};

// Thread-safe hand-over between the status thread and the engine thread.
class StatusBoard {
 public:
  using Clock = std::chrono::steady_clock;
  // The engine loop publishes at least every second, rounds or not; a
  // snapshot older than this means the loop hangs, and /healthz says so
  // (systemd's watchdog, WatchdogSec=30, would restart the daemon).
  static constexpr std::chrono::seconds kStallLimit{30};

  void publish(std::shared_ptr<const StatusSnapshot> snapshot,
               Clock::time_point now = Clock::now());
  std::shared_ptr<const StatusSnapshot> current() const;
  // True once a snapshot was published within kStallLimit before `now`.
  bool live(Clock::time_point now = Clock::now()) const;
  void submit(Command command);
  std::vector<Command> drain();
  // Failed accepts on the status socket and HTTP (file descriptors ran
  // out): counted by the status thread, shown by the engine's snapshot.
  std::uint64_t countAcceptFailure() { return ++acceptFailures_; }
  std::uint64_t acceptFailures() const { return acceptFailures_.load(); }

 private:
  std::atomic<std::uint64_t> acceptFailures_{0};
  mutable std::mutex mutex_;
  std::shared_ptr<const StatusSnapshot> snapshot_;
  Clock::time_point publishedAt_{};
  std::vector<Command> commands_;
};

}  // namespace consensusd::daemon
