#pragma once
// The systemd notification protocol (sd_notify(3)) without libsystemd: one
// datagram per state change to the socket in $NOTIFY_SOCKET. With
// Type=notify the unit is "started" once READY=1 arrives (after the ports are
// bound); with WatchdogSec the round loop sends WATCHDOG=1 every half period,
// so a hung engine thread gets the daemon restarted. Without $NOTIFY_SOCKET
// every call does nothing.

#include <chrono>
#include <string>

namespace consensusd::daemon {

class ServiceNotifier {
 public:
  using Clock = std::chrono::steady_clock;

  ServiceNotifier();  // reads NOTIFY_SOCKET and WATCHDOG_USEC
  ~ServiceNotifier();
  ServiceNotifier(const ServiceNotifier&) = delete;
  ServiceNotifier& operator=(const ServiceNotifier&) = delete;

  void ready() { send("READY=1"); }
  void stopping() { send("STOPPING=1"); }
  void status(const std::string& text) { send("STATUS=" + text); }
  // Still starting, on purpose (waiting for a trainer): systemd's start timeout
  // is pushed `seconds` from now.
  void extendStart(int seconds) {
    send("EXTEND_TIMEOUT_USEC=" + std::to_string(seconds * 1000000LL));
  }
  // Sends WATCHDOG=1 when half the watchdog period has passed since the last.
  void feedWatchdog(Clock::time_point now);
  // When feedWatchdog next has something to do (time_point::max() without a watchdog).
  Clock::time_point nextFeed() const { return nextFeed_; }

 private:
  void send(const std::string& message) const;

  int fd_ = -1;
  std::string address_;  // the socket path; a leading '\0' for the abstract namespace
  Clock::duration feedEvery_{};
  Clock::time_point nextFeed_ = Clock::time_point::max();
};

}  // namespace consensusd::daemon
