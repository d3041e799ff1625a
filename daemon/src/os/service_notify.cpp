#include "os/service_notify.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace consensusd::daemon {

ServiceNotifier::ServiceNotifier() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  if (socket == nullptr || (socket[0] != '/' && socket[0] != '@')) return;
  address_ = socket;
  if (address_[0] == '@') address_[0] = '\0';
  if (address_.size() >= sizeof(sockaddr_un::sun_path)) return;
  fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (const char* usec = std::getenv("WATCHDOG_USEC"); usec != nullptr && fd_ >= 0) {
    const long long period = std::atoll(usec);
    if (period > 0) {
      feedEvery_ = std::chrono::microseconds(period / 2);
      nextFeed_ = Clock::now();
    }
  }
}

ServiceNotifier::~ServiceNotifier() {
  if (fd_ >= 0) ::close(fd_);
}

void ServiceNotifier::feedWatchdog(Clock::time_point now) {
  if (now < nextFeed_) return;
  send("WATCHDOG=1");
  nextFeed_ = now + feedEvery_;
}

void ServiceNotifier::send(const std::string& message) const {
  if (fd_ < 0) return;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, address_.data(), address_.size());
  const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address_.size());
  // Best effort, as sd_notify: the service manager may be gone while we stop.
  [[maybe_unused]] const auto sent = ::sendto(fd_, message.data(), message.size(), MSG_NOSIGNAL,
                                              reinterpret_cast<const sockaddr*>(&address), length);
}

}  // namespace consensusd::daemon
