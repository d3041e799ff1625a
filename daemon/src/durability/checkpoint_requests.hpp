#pragma once
// Saves wanted (every checkpoint.every_rounds, a command, the end) and
// their answers, over the writer: one wanted while the writer is busy waits
// for it (the node starts no round meanwhile, so the save is of the round
// it was wanted at); each is answered when its save ends. Engine thread.

#include <functional>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "durability/checkpoint_writer.hpp"

namespace consensusd::daemon {

class CheckpointRequests {
 public:
  using Reply = std::function<void(nlohmann::json)>;
  // `state`: what to save now; `beforeAnswer`: runs before answers go out
  // (an answer must not race ahead of the state it describes).
  CheckpointRequests(CheckpointWriter& writer, std::function<CheckpointWriter::State()> state,
                     std::function<void()> beforeAnswer)
      : writer_(writer), state_(std::move(state)), beforeAnswer_(std::move(beforeAnswer)) {}

  void want(Reply reply = {}) {
    wanted_ = true;
    if (reply) wanting_.push_back(std::move(reply));
    serve();
  }
  bool wanted() const { return wanted_; }

  // Answers a save that ended; starts the one wanted once the writer is free.
  void serve() {
    if (const auto outcome = writer_.takeOutcome()) {
      beforeAnswer_();
      const nlohmann::json answer =
          outcome->path
              ? nlohmann::json{{"ok", true}, {"path", *outcome->path}, {"round", outcome->round}}
              : nlohmann::json{{"ok", false},
                               {"error", "checkpoint failed: " + writer_.lastError()}};
      for (auto& reply : saving_) reply(answer);
      saving_.clear();
    }
    if (!wanted_ || writer_.busy()) return;
    writer_.start(state_());
    wanted_ = false;
    saving_.swap(wanting_);
  }

  // At the end: the save under way, any wanted, and the final state's
  // (`round`, unless the last save was of it).
  void finish(std::int64_t round) {
    writer_.wait();
    serve();
    if (writer_.lastRound() != round) wanted_ = true;
    while (wanted_ || writer_.busy()) {
      writer_.wait();
      serve();
    }
  }

 private:
  CheckpointWriter& writer_;
  std::function<CheckpointWriter::State()> state_;
  std::function<void()> beforeAnswer_;
  bool wanted_ = false;
  std::vector<Reply> wanting_;  // answers for the save wanted
  std::vector<Reply> saving_;   // for the one under way
};

}  // namespace consensusd::daemon
