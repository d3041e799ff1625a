#include "consensusd/ctl/status_client.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <system_error>
#include <utility>

namespace consensusd::cli {
namespace {
// Larger than any status answer (a full one with 64 neighbours is ~60 KB):
// a daemon that sends without end is cut off.
constexpr std::size_t kMaxAnswer = 16 * 1024 * 1024;
}  // namespace

StatusConnection::StatusConnection(std::string socketPath) : path_(std::move(socketPath)) {}

StatusConnection::~StatusConnection() {
  drop();
}

StatusConnection::StatusConnection(StatusConnection&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}

void StatusConnection::drop() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void StatusConnection::connect() {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path_.size() >= sizeof address.sun_path) throw std::runtime_error(path_ + ": path too long");
  std::memcpy(address.sun_path, path_.c_str(), path_.size() + 1);
  fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throw std::runtime_error(path_ + ": " + std::generic_category().message(errno));
  if (::connect(fd_, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
    const int error = errno;
    drop();
    throw std::runtime_error(path_ + ": cannot connect (" + std::generic_category().message(error) +
                             "); is the daemon running?");
  }
}

bool StatusConnection::sendLine(const std::string& line) {
  return ::send(fd_, line.data(), line.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(line.size());
}

StatusConnection::Read StatusConnection::readSome(std::string& answer) {
  char buffer[65536];
  const ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
  if (n <= 0) return Read::closed;
  answer.append(buffer, static_cast<std::size_t>(n));
  if (answer.find('\n', answer.size() - static_cast<std::size_t>(n)) != std::string::npos)
    return Read::line;
  if (answer.size() > kMaxAnswer) throw std::runtime_error(path_ + ": answer too large");
  return Read::more;
}

std::optional<std::string> StatusConnection::exchange(
    const std::string& line, std::chrono::steady_clock::time_point deadline) {
  if (!sendLine(line)) return std::nullopt;
  std::string answer;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd item{fd_, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&item, 1, static_cast<int>(left.count())) <= 0)
      throw std::runtime_error(path_ + ": no answer");
    switch (readSome(answer)) {
      case Read::line:
        return answer;
      case Read::closed:
        if (answer.empty()) return std::nullopt;  // closed before answering
        throw std::runtime_error(path_ + ": connection closed");
      case Read::more:
        break;
    }
  }
}

nlohmann::json StatusConnection::ask(const nlohmann::json& request,
                                     std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::string line = request.dump() + "\n";
  try {
    const bool kept = fd_ >= 0;
    if (!kept) connect();
    std::optional<std::string> answer = exchange(line, deadline);
    if (!answer && kept) {  // the daemon closed the kept connection: a new one, once
      drop();
      connect();
      answer = exchange(line, deadline);
    }
    if (!answer) throw std::runtime_error(path_ + ": connection closed");
    nlohmann::json parsed = nlohmann::json::parse(*answer, nullptr, false);
    if (parsed.is_discarded()) throw std::runtime_error(path_ + ": answer is not JSON");
    return parsed;
  } catch (const std::runtime_error&) {
    drop();
    throw;
  }
}

std::vector<std::optional<std::string>> askEach(std::vector<StatusConnection>& connections,
                                                const nlohmann::json& request,
                                                std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::string line = request.dump() + "\n";
  std::vector<std::optional<std::string>> answers(connections.size());
  std::vector<std::string> received(connections.size());
  std::vector<bool> kept(connections.size());
  std::vector<std::size_t> waiting;  // the connections whose answer is still to come
  for (std::size_t i = 0; i < connections.size(); ++i) {
    StatusConnection& c = connections[i];
    try {
      kept[i] = c.fd_ >= 0;
      if (!kept[i]) c.connect();
      bool sent = c.sendLine(line);
      if (!sent && kept[i]) {  // the daemon closed the kept connection: a new one, once
        c.drop();
        c.connect();
        kept[i] = false;
        sent = c.sendLine(line);
      }
      if (!sent) {
        c.drop();
        continue;
      }
      waiting.push_back(i);
    } catch (const std::runtime_error&) {
      // Not running: none.
    }
  }
  std::vector<pollfd> items;
  while (!waiting.empty()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    items.clear();
    for (const std::size_t i : waiting) items.push_back({connections[i].fd_, POLLIN, 0});
    if (::poll(items.data(), items.size(), static_cast<int>(left.count())) < 0 && errno != EINTR)
      break;
    std::vector<std::size_t> still;
    for (std::size_t k = 0; k < waiting.size(); ++k) {
      const std::size_t i = waiting[k];
      StatusConnection& c = connections[i];
      if (items[k].revents == 0) {
        still.push_back(i);
        continue;
      }
      try {
        switch (c.readSome(received[i])) {
          case StatusConnection::Read::more:
            still.push_back(i);
            break;
          case StatusConnection::Read::closed:
            c.drop();
            // A kept connection closed as the request came: once more on a new one.
            if (kept[i] && received[i].empty()) {
              c.connect();
              answers[i] = c.exchange(line, deadline);
              if (!answers[i]) c.drop();
            }
            break;
          case StatusConnection::Read::line:
            answers[i] = std::move(received[i]);
            break;
        }
      } catch (const std::runtime_error&) {
        c.drop();  // too large, or no answer on the new connection
      }
    }
    waiting = std::move(still);
  }
  // No answer in time: dropped, so a late one is never read as the next request's.
  for (const std::size_t i : waiting) connections[i].drop();
  return answers;
}

nlohmann::json askDaemon(const std::string& socketPath, const nlohmann::json& request,
                         std::chrono::milliseconds timeout) {
  return StatusConnection(socketPath).ask(request, timeout);
}

}  // namespace consensusd::cli
