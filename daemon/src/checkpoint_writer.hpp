#pragma once
// The node's checkpoints over a CheckpointStore: resume from the newest
// valid file (the rest set aside and logged), and saves that never stop
// training. A save that fails (full disk, I/O error, no file descriptors)
// costs that checkpoint only: logged, counted, shown in status and metrics;
// older generations stay. Owned by the engine thread.

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "consensusd/daemon/checkpoint.hpp"
#include "consensusd/daemon/status.hpp"
#include "owner_thread.hpp"

namespace consensusd::daemon {

class CheckpointWriter {
 public:
  // `identity`: topology hash, node, dtype and dimension every file must match.
  CheckpointWriter(std::string folder, std::size_t keep, Checkpoint identity);

  std::optional<Checkpoint> resume();
  // The path written, or nothing if the save failed.
  std::optional<std::string> trySave(std::int64_t round, std::span<const std::byte> params,
                                     std::span<const std::byte> velocity);

  std::int64_t lastRound() const { return lastRound_; }  // -1 before the first
  std::uint64_t failures() const { return failures_; }
  const std::string& lastError() const { return lastError_; }
  void fill(StatusSnapshot& status) const;

 private:
  OwnerThread owner_;
  CheckpointStore store_;
  Checkpoint identity_;
  std::int64_t lastRound_ = -1;
  std::uint64_t failures_ = 0;
  std::string lastError_;
};

}  // namespace consensusd::daemon
