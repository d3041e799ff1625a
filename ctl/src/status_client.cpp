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

std::optional<std::string> StatusConnection::exchange(
    const std::string& line, std::chrono::steady_clock::time_point deadline) {
  if (::send(fd_, line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size()))
    return std::nullopt;
  std::string answer;
  while (answer.find('\n') == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd item{fd_, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&item, 1, static_cast<int>(left.count())) <= 0)
      throw std::runtime_error(path_ + ": no answer");
    char buffer[65536];
    const ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
    if (n <= 0) {
      if (answer.empty()) return std::nullopt;  // closed before answering
      throw std::runtime_error(path_ + ": connection closed");
    }
    answer.append(buffer, static_cast<std::size_t>(n));
  }
  return answer;
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

nlohmann::json askDaemon(const std::string& socketPath, const nlohmann::json& request,
                         std::chrono::milliseconds timeout) {
  return StatusConnection(socketPath).ask(request, timeout);
}

}  // namespace consensusd::cli
