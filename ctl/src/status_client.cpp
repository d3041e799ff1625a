#include "consensusd/ctl/status_client.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <system_error>

namespace consensusd::cli {

nlohmann::json askDaemon(const std::string& socketPath, const nlohmann::json& request,
                         std::chrono::milliseconds timeout) {
  const auto fail = [&](const std::string& what) -> std::runtime_error {
    return std::runtime_error(socketPath + ": " + what);
  };
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (socketPath.size() >= sizeof address.sun_path) throw fail("path too long");
  std::memcpy(address.sun_path, socketPath.c_str(), socketPath.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw fail(std::generic_category().message(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
    throw fail(std::string("cannot connect (") + std::generic_category().message(errno) +
               "); is the daemon running?");
  }
  const std::string line = request.dump() + "\n";
  if (::send(fd, line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size())) {
    throw fail("send failed");
  }
  std::string answer;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (answer.find('\n') == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd item{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&item, 1, static_cast<int>(left.count())) <= 0)
      throw fail("no answer");
    char buffer[65536];
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) throw fail("connection closed");
    answer.append(buffer, static_cast<std::size_t>(n));
  }
  nlohmann::json parsed = nlohmann::json::parse(answer, nullptr, false);
  if (parsed.is_discarded()) throw fail("answer is not JSON");
  return parsed;
}

}  // namespace consensusd::cli
