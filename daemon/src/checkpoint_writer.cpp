#include "checkpoint_writer.hpp"

#include <spdlog/spdlog.h>

namespace consensusd::daemon {

CheckpointWriter::CheckpointWriter(std::string folder, std::size_t keep, Checkpoint identity)
    : store_(std::move(folder), keep), identity_(std::move(identity)) {}

std::optional<Checkpoint> CheckpointWriter::resume() {
  owner_.check();
  CheckpointStore::Loaded loaded = store_.loadNewest(identity_);
  for (const auto& file : loaded.skipped)
    spdlog::warn("checkpoint folder: {} is not a regular file: skipped", file);
  for (const auto& file : loaded.rejected)
    spdlog::warn("checkpoint {} rejected ({}): renamed to .rejected", file.path, file.why);
  CheckpointStore::setAside(loaded.rejected);
  if (loaded.checkpoint) {
    lastRound_ = loaded.checkpoint->round;
    spdlog::info("resumed from {} (round {})", loaded.path, lastRound_);
  }
  return std::move(loaded.checkpoint);
}

std::optional<std::string> CheckpointWriter::trySave(std::int64_t round,
                                                     std::span<const std::byte> params,
                                                     std::span<const std::byte> velocity) {
  owner_.check();
  try {
    Checkpoint checkpoint = identity_;
    checkpoint.round = round;
    std::string path = store_.save(checkpoint, params, velocity);  // from the engine's buffers
    lastRound_ = round;
    spdlog::info("checkpoint {} (round {})", path, round);
    return path;
  } catch (const std::exception& e) {
    ++failures_;
    if (lastError_ != e.what()) spdlog::error("checkpoint at round {} failed: {}", round, e.what());
    lastError_ = e.what();
    return std::nullopt;
  }
}

void CheckpointWriter::fill(StatusSnapshot& status) const {
  owner_.check();
  status.lastCheckpointRound = lastRound_;
  status.checkpointFailures = failures_;
  status.lastCheckpointError = lastError_;
}

}  // namespace consensusd::daemon
