#pragma once
// The node's checkpoints over a CheckpointStore: resume from the newest
// valid file (the rest set aside and logged), and saves that never stop
// training. A save runs on a thread of its own (checksum, write, fsync of
// a model of gigabytes take seconds, in which the engine thread must keep
// serving its neighbours); it writes the parameters from the engine's
// buffer, held, never copied. A save that fails (full disk, I/O error, no
// file descriptors) costs that checkpoint only: logged, counted, shown in
// status and metrics; older generations stay. The public methods belong
// to the engine thread.

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "consensusd/daemon/checkpoint.hpp"
#include "consensusd/daemon/status.hpp"
#include "os/owner_thread.hpp"

namespace consensusd::daemon {

class CheckpointWriter {
 public:
  // `identity`: node, dtype and dimension every file must match (files of
  // the first format: also its index and topology hash). `doneFd`: an eventfd written when a save
  // ends.
  CheckpointWriter(std::string folder, std::size_t keep, Checkpoint identity, int doneFd);
  ~CheckpointWriter();  // waits for a save under way
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  std::optional<Checkpoint> resume();

  // The state to save: `params` is written from where it is and `owner`
  // keeps it alive (and unchanged) until takeOutcome() has the save's end;
  // the velocity, which its owner updates in place, is copied into a
  // buffer kept for the next save.
  struct State {
    std::int64_t round = 0;
    std::uint64_t topologyHash = 0;  // the graph it was trained in (a later one may read it)
    std::shared_ptr<const void> owner;
    std::span<const std::byte> params;
    std::span<const std::byte> velocity;
  };
  struct Outcome {
    std::int64_t round = 0;
    std::optional<std::string> path;  // none: the save failed (lastError() says why)
  };

  bool busy() const;
  // Starts a save; only when not busy().
  void start(const State& state);
  // The save that ended since the last call, if any (also updates lastRound,
  // failures, lastError).
  std::optional<Outcome> takeOutcome();
  // Until the save under way (if any) has ended; takeOutcome() then has it.
  void wait();

  std::int64_t lastRound() const { return lastRound_; }  // -1 before the first
  std::uint64_t failures() const { return failures_; }
  const std::string& lastError() const { return lastError_; }
  void fill(StatusSnapshot& status) const;

 private:
  struct Done {
    std::int64_t round = 0;
    std::optional<std::string> path;
    std::string error;
  };
  void loop();
  Outcome record(Done done);

  OwnerThread owner_;
  CheckpointStore store_;  // the writer thread's once it runs
  Checkpoint identity_;
  int doneFd_;
  std::vector<std::byte> velocity_;      // the copy a save writes
  std::shared_ptr<const void> holding_;  // the parameters of the save under way
  std::int64_t lastRound_ = -1;
  std::uint64_t failures_ = 0;
  std::string lastError_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::optional<State> job_;  // handed to the thread
  bool writing_ = false;      // a job taken and not yet done
  std::optional<Done> done_;  // its result, until taken
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace consensusd::daemon
