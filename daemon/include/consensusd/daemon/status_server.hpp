#pragma once
// The status socket (docs/design.md §7): a Unix stream socket speaking
// line-delimited JSON, served by Boost.Asio on its own thread. Reads come
// from the StatusBoard's snapshot; mutating commands (set-policy, apply,
// checkpoint, pause, resume, stop) are accepted only from the daemon's own
// uid (SO_PEERCRED) and answered by the engine thread. Requests are bounded
// (64 KiB); a connection idle, or with an answer unread, for 30 s is closed;
// a bad request gets a JSON error, never a crash.

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "consensusd/daemon/status.hpp"

namespace consensusd::daemon {

// The longest request line the status socket reads.
inline constexpr std::size_t kMaxStatusRequest = std::size_t{64} * 1024;

// An address this node must listen on cannot be had (in use, not bindable,
// or a status socket a live daemon holds): exit 69, nothing else touched.
class Unavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class StatusServer {
 public:
  // Binds `path` (replacing a stale socket file, but never one a live daemon
  // still answers on: Unavailable) with mode 0660, and when
  // `httpAddress` is "HOST:PORT" an HTTP server there (GET /status, /metrics
  // in Prometheus text format, /healthz); `wakeFd` is written after a command
  // is submitted; `idleTimeout` closes connections idle or unread that long.
  // Throws std::runtime_error on failure.
  StatusServer(std::string path, std::string httpAddress, StatusBoard& board, int wakeFd,
               std::chrono::milliseconds idleTimeout = std::chrono::seconds(30));
  ~StatusServer();  // stops the thread, removes the socket file
  StatusServer(const StatusServer&) = delete;
  StatusServer& operator=(const StatusServer&) = delete;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The snapshot in the Prometheus text exposition format.
std::string prometheusText(const StatusSnapshot& status);

// One request line (exposed for tests and fuzzing). Returns the answer for
// reads and errors; for an allowed mutating command returns none and fills
// `command` (name, args) for the engine. `trusted`: the peer is our uid.
std::optional<nlohmann::json> answerRequest(const std::string& line, const StatusSnapshot* snapshot,
                                            bool trusted, Command& command);

// A set-policy request's arguments as config overrides
// (consensus.policy=..., backups, timeout_ms, quantile): the engine reads
// them through the config schema, so they get the same checks as a file.
std::vector<std::string> setPolicyOverrides(const nlohmann::json& args);

}  // namespace consensusd::daemon
