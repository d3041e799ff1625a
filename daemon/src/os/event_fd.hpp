#pragma once
// An eventfd as a doorbell: a worker thread rings it, the engine thread's
// poll wakes on it and drains it. And a signalfd's signal, read.

#include <sys/signalfd.h>
#include <unistd.h>

#include <cstdint>

namespace consensusd::daemon {

inline void notify(int fd) {
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(fd, &one, sizeof one);
}

inline void drainFd(int fd) {
  std::uint64_t value = 0;
  [[maybe_unused]] const ssize_t n = ::read(fd, &value, sizeof value);
}

// The signal a signalfd holds: SIGTERM, SIGINT or SIGHUP (0 if none).
inline std::uint32_t readSignal(int signalFd) {
  signalfd_siginfo info{};
  return ::read(signalFd, &info, sizeof info) == sizeof info ? info.ssi_signo : 0;
}

}  // namespace consensusd::daemon
