#pragma once
// Talking to a daemon's status socket: one JSON request line, one JSON
// answer line, as many as the caller likes on one connection (the daemon
// closes a connection idle for 30 s).

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace consensusd::cli {

// A connection kept open across requests: a poller asking every second
// saves a connect and a close on both sides each time.
class StatusConnection {
 public:
  explicit StatusConnection(std::string socketPath);
  ~StatusConnection();
  StatusConnection(const StatusConnection&) = delete;
  StatusConnection& operator=(const StatusConnection&) = delete;
  StatusConnection(StatusConnection&& other) noexcept;
  StatusConnection& operator=(StatusConnection&&) = delete;

  // Connects on first use and after any failure. A kept connection the
  // daemon closed (it restarted, or the idle limit passed) is replaced
  // once, at once. Throws std::runtime_error when the socket cannot be
  // reached or answers nothing within `timeout`; the connection is then
  // dropped, so a late answer is never read as the next one's.
  nlohmann::json ask(const nlohmann::json& request, std::chrono::milliseconds timeout);

 private:
  void connect();
  void drop();
  // The answer line, or none if a kept connection turned out closed.
  std::optional<std::string> exchange(const std::string& line,
                                      std::chrono::steady_clock::time_point deadline);

  friend std::vector<std::optional<std::string>> askEach(std::vector<StatusConnection>& connections,
                                                         const nlohmann::json& request,
                                                         std::chrono::milliseconds timeout);

  // The outcome of one read into an answer being received.
  enum class Read { more, line, closed };
  bool sendLine(const std::string& line);
  Read readSome(std::string& answer);

  std::string path_;
  int fd_ = -1;
};

// The same request on every connection at once, the answers collected as
// they come: a poller of N daemons waits once a round, not N times, and a
// slow daemon holds up no other's answer. answers[i] is connections[i]'s
// answer line as received (not parsed: the caller checks it), none where
// the socket cannot be reached or gives no whole line within `timeout` of
// the call.
std::vector<std::optional<std::string>> askEach(std::vector<StatusConnection>& connections,
                                                const nlohmann::json& request,
                                                std::chrono::milliseconds timeout);

// One request on a connection of its own. Throws as StatusConnection::ask.
nlohmann::json askDaemon(const std::string& socketPath, const nlohmann::json& request,
                         std::chrono::milliseconds timeout = std::chrono::seconds(3));

}  // namespace consensusd::cli
