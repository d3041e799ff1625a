// The status socket's connections, in process over a real Unix socket (with
// a short idle limit): an idle client and one that never reads its answers
// are closed, and the socket serves others meanwhile.

#include "consensusd/daemon/status_server.hpp"

#include <doctest/doctest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>

#include "process.hpp"

using namespace consensusd;
using consensusd::testing::TempDir;
using consensusd::testing::waitFor;

namespace {

constexpr auto kIdle = std::chrono::milliseconds(300);

// A client connection, closed with the object.
class Client {
 public:
  explicit Client(const std::string& path) : fd_(::socket(AF_UNIX, SOCK_STREAM, 0)) {
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path.c_str(), sizeof address.sun_path - 1);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    timeval timeout{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  }
  ~Client() { ::close(fd_); }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Sends without blocking; false once the socket is full (EAGAIN) or gone.
  bool send(const std::string& bytes, int* error = nullptr) {
    const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (error != nullptr) *error = n < 0 ? errno : 0;
    return n == static_cast<ssize_t>(bytes.size());
  }

  // The next answer line, or "" at end of stream or after 5 s.
  std::string line() {
    while (pending_.find('\n') == std::string::npos) {
      char buffer[4096];
      const ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
      if (n <= 0) return "";
      pending_.append(buffer, static_cast<std::size_t>(n));
    }
    const std::string answer = pending_.substr(0, pending_.find('\n'));
    pending_.erase(0, answer.size() + 1);
    return answer;
  }

  // True when the server has closed its end: EOF once what it sent is read.
  bool closedByServer() {
    char buffer[65536];
    for (;;) {
      const ssize_t n = ::recv(fd_, buffer, sizeof buffer, MSG_DONTWAIT);
      if (n == 0) return true;
      if (n < 0) return false;  // nothing more yet: still open
    }
  }

 private:
  int fd_;
  std::string pending_;
};

struct Server {
  TempDir dir;
  daemon::StatusBoard board;
  std::unique_ptr<daemon::StatusServer> server;

  Server() {
    auto snapshot = std::make_shared<daemon::StatusSnapshot>();
    snapshot->node = "n0";
    snapshot->round = 7;
    board.publish(snapshot);
    server = std::make_unique<daemon::StatusServer>(path(), "", board, -1, kIdle);
  }
  std::string path() const { return dir.path() + "/status.sock"; }
};

const std::string kStatus = "{\"cmd\":\"status\",\"fields\":[\"round\"]}\n";

}  // namespace

TEST_CASE("an idle connection is closed, and one in use is not") {
  Server server;
  Client idle(server.path());
  Client busy(server.path());
  // The busy client asks every 20 ms or so (waitFor's pace), well inside
  // the idle limit, until the idle one is gone.
  CHECK(waitFor(
      [&] {
        REQUIRE(busy.send(kStatus));
        CHECK(busy.line() == R"({"ok":true,"round":7})");
        return idle.closedByServer();
      },
      std::chrono::seconds(10)));
  CHECK_FALSE(busy.closedByServer());
}

TEST_CASE("a client that never reads its answers is closed, and others are served meanwhile") {
  Server server;
  Client greedy(server.path());
  // Requests until both directions' buffers are full: the server's answer
  // write waits on a reader that never comes.
  int error = 0;
  bool full = false;
  for (int i = 0; i < 1'000'000 && !full; ++i) {
    if (!greedy.send(kStatus, &error)) full = error == EAGAIN || error == EWOULDBLOCK;
  }
  REQUIRE(full);
  Client other(server.path());
  REQUIRE(other.send(kStatus));
  CHECK(other.line() == R"({"ok":true,"round":7})");
  // Closed by the server: its end is gone, so a send fails with EPIPE.
  CHECK(waitFor(
      [&] {
        greedy.send(kStatus, &error);
        return error == EPIPE || error == ECONNRESET;
      },
      std::chrono::seconds(10)));
}
