#pragma once
// The dashboard's HTTP server (Boost.Beast on its own thread): GET only, one
// request per connection, a request's head at most 8 KiB and no body, 10 s
// to send it and 10 s to read the answer, at most 256 connections at once
// (more are closed at accept, and counted). The status server's HTTP
// treatment, for a page anyone on the listening address can open.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

namespace consensusd::cli {

// The address part of HOST:PORT as Asio reads it: "localhost" is
// 127.0.0.1, an IPv6 address loses its brackets.
std::string listenHost(const std::string& listen);

struct HttpAnswer {
  unsigned status = 200;
  std::string contentType;
  std::string body;
};

class DashboardServer {
 public:
  // Called on the server's thread with the request target ("/api/cluster?since=3").
  using Handler = std::function<HttpAnswer(const std::string& target)>;

  struct Limits {
    std::chrono::milliseconds timeout{10000};  // to send a request, and to read the answer
    std::size_t connections = 256;
  };

  // Listens on HOST:PORT (port 0: any free one). Throws std::runtime_error
  // if it cannot.
  DashboardServer(const std::string& listen, Handler handler, Limits limits);
  DashboardServer(const std::string& listen, Handler handler)
      : DashboardServer(listen, std::move(handler), Limits{}) {}
  ~DashboardServer();
  DashboardServer(const DashboardServer&) = delete;
  DashboardServer& operator=(const DashboardServer&) = delete;

  std::uint16_t port() const;
  // Connections closed at accept because the limit was open.
  std::uint64_t refused() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace consensusd::cli
