#include "durability/checkpoint_writer.hpp"

#include <spdlog/spdlog.h>

#include "os/event_fd.hpp"
#include "os/thread_name.hpp"

namespace consensusd::daemon {

CheckpointWriter::CheckpointWriter(std::string folder, std::size_t keep, Checkpoint identity,
                                   int doneFd)
    : store_(std::move(folder), keep),
      identity_(std::move(identity)),
      doneFd_(doneFd),
      thread_([this] {
        nameThisThread("checkpoint");
        loop();
      }) {}

CheckpointWriter::~CheckpointWriter() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;  // a job already handed over is still written
  }
  wake_.notify_all();
  thread_.join();
}

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
    if (loaded.checkpoint->topologyHash != identity_.topologyHash)
      spdlog::info("the checkpoint was written in another graph (hash {:016x}; now {:016x})",
                   loaded.checkpoint->topologyHash, identity_.topologyHash);
  }
  return std::move(loaded.checkpoint);
}

bool CheckpointWriter::busy() const {
  owner_.check();
  const std::lock_guard lock(mutex_);
  return job_ || writing_ || done_;
}

void CheckpointWriter::start(const State& state) {
  owner_.check();
  State job = state;
  // The engine's side holds the parameters until it has taken the outcome
  // (under the mutex): the buffer is written again only after every read of
  // the save happened-before, as ThreadSanitizer can see.
  holding_ = std::move(job.owner);
  if (!state.velocity.empty()) {
    velocity_.assign(state.velocity.begin(), state.velocity.end());  // sized once, then reused
    job.velocity = velocity_;
  }
  {
    const std::lock_guard lock(mutex_);
    job_ = std::move(job);
  }
  wake_.notify_all();
}

void CheckpointWriter::loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return stopping_ || job_.has_value(); });
    if (!job_) return;
    State job = std::move(*job_);
    job_.reset();
    writing_ = true;
    lock.unlock();
    Done done{job.round, std::nullopt, {}};
    try {
      Checkpoint checkpoint = identity_;
      checkpoint.round = job.round;
      checkpoint.topologyHash = job.topologyHash;
      done.path = store_.save(checkpoint, job.params, job.velocity);
    } catch (const std::exception& e) {  // no exception leaves this thread (STYLE.md, errors)
      done.error = e.what();
    }
    lock.lock();
    writing_ = false;
    done_ = std::move(done);
    notify(doneFd_);
    wake_.notify_all();
  }
}

std::optional<CheckpointWriter::Outcome> CheckpointWriter::takeOutcome() {
  owner_.check();
  std::optional<Done> done;
  {
    const std::lock_guard lock(mutex_);
    done.swap(done_);
  }
  if (!done) return std::nullopt;
  holding_.reset();  // the engine may write that buffer again
  return record(std::move(*done));
}

CheckpointWriter::Outcome CheckpointWriter::record(Done done) {
  if (done.path) {
    lastRound_ = done.round;
    spdlog::info("checkpoint {} (round {})", *done.path, done.round);
  } else {
    ++failures_;
    if (lastError_ != done.error)
      spdlog::error("checkpoint at round {} failed: {}", done.round, done.error);
    lastError_ = done.error;
  }
  return {done.round, std::move(done.path)};
}

void CheckpointWriter::wait() {
  owner_.check();
  std::unique_lock lock(mutex_);
  wake_.wait(lock, [this] { return !job_ && !writing_; });
}

void CheckpointWriter::fill(StatusSnapshot& status) const {
  owner_.check();
  status.lastCheckpointRound = lastRound_;
  status.checkpointFailures = failures_;
  status.lastCheckpointError = lastError_;
}

}  // namespace consensusd::daemon
