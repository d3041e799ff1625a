#pragma once
// The trainer socket (model.kind: external, docs/trainers.md): a local
// process attaches over a Unix socket and computes the node's updates. The
// parameters are shared, not sent: the daemon creates a memfd region of three
// slots (x_k, the update, the gradient a delta came from), hands its
// descriptor over with SCM_RIGHTS, and the socket carries one short JSON
// line per event. One trainer at a
// time; a peer that is neither the daemon's user nor in trainer.group is
// refused. Owned by the engine thread, polled with the other descriptors.

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "consensusd/consensus/round_engine.hpp"
#include "consensusd/daemon/status.hpp"
#include "consensusd/daemon/wire.hpp"
#include "os/owner_thread.hpp"

namespace consensusd::daemon {

struct TrainerOptions {
  std::string socket;          // the Unix socket's path
  std::optional<gid_t> group;  // may attach besides the daemon's own user
  std::size_t dimension = 0;   // 0: the first trainer's (model.dimension: auto)
  std::optional<wire::Dtype> dtype = wire::Dtype::Float32;  // none: the first trainer's
};

// The parameter vector a node trains.
struct TrainerShape {
  std::size_t dimension = 0;
  wire::Dtype dtype = wire::Dtype::Float32;
};

// A validated update for the round the trainer was given; `values` point
// into the shared region (valid until the next publish).
struct TrainerUpdate {
  std::int64_t round = 0;
  consensus::UpdateKind kind = consensus::UpdateKind::Gradient;
  double loss = 0;
  std::optional<double> accuracy;                 // a test accuracy, in [0, 1]
  std::optional<double> testLoss;                 // a test loss, >= 0
  std::chrono::steady_clock::duration elapsed{};  // from publish to this update
  std::span<const std::byte> values;
  std::span<const std::byte> gradient;   // with a delta: the gradient at x_k (else empty)
  double gradVariance = 0;               // tr Cov of per-sample gradients, if reported
  std::optional<std::uint64_t> samples;  // training samples behind it, if reported
};

class TrainerEndpoint {
 public:
  // Binds the socket (mode 0660) and creates the shared region; throws
  // Unavailable if the path cannot be bound.
  explicit TrainerEndpoint(TrainerOptions options);
  ~TrainerEndpoint();
  TrainerEndpoint(const TrainerEndpoint&) = delete;
  TrainerEndpoint& operator=(const TrainerEndpoint&) = delete;

  // Round `round` starts at `params`: copied into the region's x slot and
  // announced to the trainer (now, or when one attaches).
  void publish(std::int64_t round, std::span<const std::byte> params);
  // The parameters a trainer offered on a fresh start (its own seeded
  // initialisation), taken once; none if it offered none.
  std::optional<std::vector<std::byte>> takeInitialParams();
  // Training is over: the node's final parameters (x after its last round)
  // go into the x slot and the trainer is told why (`reason`: rounds,
  // accuracy, time, stop, signal) before the socket closes.
  void end(std::int64_t round, std::span<const std::byte> params, const std::string& reason);
  // A fresh start waits for the first trainer's initialisation.
  void expectInitialParams() { wantInit_ = true; }
  // The shape, once known: from the options, or (auto) from the first
  // trainer's hello, whose welcome then waits for welcomeHeld(): the daemon
  // has to resume (fresh or not) before it can answer.
  std::optional<TrainerShape> shape() const;
  void welcomeHeld();

  void append(std::vector<zmq::pollitem_t>& items);
  // After zmq::poll: accepts, reads, answers; an update when one is complete.
  std::optional<TrainerUpdate> serve(std::span<const zmq::pollitem_t> items);

  TrainerStatus status() const;
  bool attached() const { return trainerFd_ >= 0 && welcomed_; }

 private:
  void accept();
  // The attached trainer's lines, read and handled; its end detaches it.
  std::optional<TrainerUpdate> read();
  // A connection turned away (counted as refused), or the attached trainer's end.
  void refuse(int fd, pid_t pid, const std::string& why);
  // The connected trainer's hello turned away: told why, counted, closed.
  void refuseAttached(const std::string& why);
  void detach(const std::string& why, const char* verb = "detached");
  std::optional<TrainerUpdate> handle(const std::string& line);
  std::optional<TrainerUpdate> handleMessage(const nlohmann::json& message);
  bool acceptHello(const nlohmann::json& message);
  void takeInit();
  std::optional<TrainerUpdate> takeUpdate(const nlohmann::json& message);
  void reject(const std::string& reason);
  void send(const std::string& line, int passFd = -1);
  void announce();
  bool finite(std::span<const std::byte> values) const;
  std::span<std::byte> slot(std::size_t index) const;
  void createRegion();
  void welcome();

  OwnerThread owner_;
  TrainerOptions options_;
  std::size_t slotBytes_ = 0;
  int listenFd_ = -1;
  int regionFd_ = -1;
  std::byte* region_ = nullptr;
  int trainerFd_ = -1;
  pid_t trainerPid_ = 0;
  bool welcomed_ = false;              // hello answered: updates may come
  bool holdWelcome_ = false;           // a shape learned from this hello: welcomeHeld() answers
  std::string input_;                  // a partial line
  std::optional<std::int64_t> round_;  // published, no update taken yet
  bool announced_ = false;
  std::chrono::steady_clock::time_point publishedAt_{};
  bool wantInit_ = false;
  std::optional<std::vector<std::byte>> initial_;
  std::deque<double> updateMs_;  // the recent window
  TrainerStatus counts_;
};

}  // namespace consensusd::daemon
