#include "dashboard_server.hpp"

// clang-format off
// Before Boost.Asio: its awaitable.hpp uses std::exchange without it (Boost 1.74, C++20).
#include <utility>
// clang-format on

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <iostream>
#include <stdexcept>
#include <thread>

namespace consensusd::cli {
namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;

constexpr std::uint32_t kMaxHead = 8 * 1024;

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(asio::ip::tcp::socket socket, const DashboardServer::Handler& handler,
          std::atomic<std::size_t>& open, std::chrono::milliseconds timeout)
      : stream_(std::move(socket)), handler_(handler), open_(open), timeout_(timeout) {
    ++open_;
  }
  ~Session() { --open_; }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  void start() {
    parser_.header_limit(kMaxHead);
    parser_.body_limit(0);
    stream_.expires_after(timeout_);
    http::async_read(stream_, buffer_, parser_,
                     [self = shared_from_this()](boost::system::error_code code, std::size_t) {
                       self->respond(code);
                     });
  }

 private:
  void respond(boost::system::error_code code) {
    if (code == http::error::end_of_stream || code == asio::error::operation_aborted ||
        code == boost::beast::error::timeout || code == asio::error::eof) {
      return;  // gone, or too slow: nothing to answer
    }
    auto response = std::make_shared<http::response<http::string_body>>();
    response->version(11);
    response->keep_alive(false);
    response->set(http::field::cache_control, "no-store");
    if (code) {  // a head over 8 KiB, a body, or not HTTP
      response->result(code == http::error::header_limit
                           ? http::status::request_header_fields_too_large
                           : http::status::bad_request);
      response->set(http::field::content_type, "text/plain");
      response->body() = code.message() + "\n";
    } else if (parser_.get().method() != http::verb::get) {
      response->result(http::status::method_not_allowed);
      response->set(http::field::content_type, "text/plain");
      response->body() = "the dashboard is read-only: GET only\n";
    } else {
      HttpAnswer answer;
      try {
        answer = handler_(std::string(parser_.get().target()));
      } catch (const std::exception& e) {
        answer = {500, "text/plain", std::string(e.what()) + "\n"};
      }
      response->result(answer.status);
      response->set(http::field::content_type, answer.contentType);
      response->body() = std::move(answer.body);
    }
    response->prepare_payload();
    stream_.expires_after(timeout_);
    http::async_write(
        stream_, *response,
        [self = shared_from_this(), response](boost::system::error_code, std::size_t) {
          boost::system::error_code ignored;
          self->stream_.socket().shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
        });
  }

  boost::beast::tcp_stream stream_;
  boost::beast::flat_buffer buffer_{kMaxHead};
  http::request_parser<http::empty_body> parser_;
  const DashboardServer::Handler& handler_;
  std::atomic<std::size_t>& open_;
  std::chrono::milliseconds timeout_;
};

}  // namespace

struct DashboardServer::Impl {
  // Before io: the sessions io still holds when it goes use them.
  Handler handler;
  Limits limits;
  std::atomic<std::size_t> open{0};
  std::atomic<std::uint64_t> refused{0};
  std::uint16_t port = 0;
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor{io};
  asio::steady_timer pause{io};
  std::thread thread;

  void accept() {
    acceptor.async_accept([this](boost::system::error_code code, asio::ip::tcp::socket socket) {
      if (code == asio::error::operation_aborted || !acceptor.is_open()) return;
      if (code) {  // out of descriptors: wait a little, accept again
        pause.expires_after(std::chrono::milliseconds(100));
        pause.async_wait([this](boost::system::error_code waited) {
          if (!waited) accept();
        });
        return;
      }
      if (open >= limits.connections) {
        ++refused;
        boost::system::error_code ignored;
        socket.close(ignored);
      } else {
        std::make_shared<Session>(std::move(socket), handler, open, limits.timeout)->start();
      }
      accept();
    });
  }
};

std::string listenHost(const std::string& listen) {
  std::string host = listen.substr(0, listen.rfind(':'));
  if (host == "localhost") return "127.0.0.1";
  if (host.size() > 2 && host.front() == '[') return host.substr(1, host.size() - 2);
  return host;
}

DashboardServer::DashboardServer(const std::string& listen, Handler handler, Limits limits)
    : impl_(std::make_unique<Impl>()) {
  impl_->handler = std::move(handler);
  impl_->limits = limits;
  const std::size_t colon = listen.rfind(':');
  if (colon == std::string::npos)
    throw std::runtime_error("--listen " + listen + ": not HOST:PORT");
  const std::string host = listenHost(listen);
  try {
    const int port = std::stoi(listen.substr(colon + 1));
    if (port < 0 || port > 65535) throw std::out_of_range("port");
    const asio::ip::tcp::endpoint endpoint(asio::ip::make_address(host),
                                           static_cast<std::uint16_t>(port));
    impl_->acceptor.open(endpoint.protocol());
    impl_->acceptor.set_option(asio::socket_base::reuse_address(true));
    impl_->acceptor.bind(endpoint);
    impl_->acceptor.listen();
    impl_->port = impl_->acceptor.local_endpoint().port();
  } catch (const std::exception& e) {
    throw std::runtime_error("--listen " + listen + ": " + e.what());
  }
  impl_->accept();
  impl_->thread = std::thread([impl = impl_.get()] {
    for (;;) {  // a failed handler is logged, the loop goes on
      try {
        impl->io.run();
        return;
      } catch (const std::exception& e) {
        std::cerr << "dashboard: " << e.what() << "\n";
      }
    }
  });
}

DashboardServer::~DashboardServer() {
  asio::post(impl_->io, [impl = impl_.get()] {
    boost::system::error_code ignored;
    impl->acceptor.close(ignored);
    impl->pause.cancel();
    impl->io.stop();
  });
  impl_->thread.join();
}

std::uint16_t DashboardServer::port() const {
  return impl_->port;
}

std::uint64_t DashboardServer::refused() const {
  return impl_->refused;
}

}  // namespace consensusd::cli
