#include "status_server.hpp"

#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <filesystem>
#include <thread>

namespace consensusd::daemon {
namespace {

namespace asio = boost::asio;
using Local = asio::local::stream_protocol;

constexpr std::size_t kMaxRequest = std::size_t{64} * 1024;
constexpr auto kIdleTimeout = std::chrono::seconds(30);

nlohmann::json error(const std::string& message) {
  return {{"ok", false}, {"error", message}};
}

bool peerIsUs(Local::socket& socket) {
  ucred credentials{};
  socklen_t length = sizeof credentials;
  if (::getsockopt(socket.native_handle(), SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0)
    return false;
  return credentials.uid == ::geteuid();
}

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Local::socket socket, StatusBoard& board, int wakeFd)
      : socket_(std::move(socket)),
        timer_(socket_.get_executor()),
        buffer_(kMaxRequest),
        board_(board),
        wakeFd_(wakeFd),
        trusted_(peerIsUs(socket_)) {}

  void start() { readLine(); }

 private:
  void readLine() {
    timer_.expires_after(kIdleTimeout);
    timer_.async_wait([self = shared_from_this()](boost::system::error_code code) {
      if (!code) self->socket_.close();
    });
    asio::async_read_until(
        socket_, buffer_, '\n',
        [self = shared_from_this()](boost::system::error_code code, std::size_t bytes) {
          self->onLine(code, bytes);
        });
  }

  void onLine(boost::system::error_code code, std::size_t bytes) {
    timer_.cancel();
    if (code == asio::error::not_found) {  // the buffer filled without a newline
      write(error("request larger than 64 KiB"), true);
      return;
    }
    if (code) return;
    std::string line(asio::buffers_begin(buffer_.data()),
                     asio::buffers_begin(buffer_.data()) + static_cast<std::ptrdiff_t>(bytes));
    buffer_.consume(bytes);
    const auto snapshot = board_.current();
    Command command;
    if (auto answer = answerRequest(line, snapshot.get(), trusted_, command)) {
      write(*answer, false);
      return;
    }
    // The engine answers on its thread; the reply hops back to ours.
    command.reply = [self = shared_from_this()](nlohmann::json answer) {
      asio::post(self->socket_.get_executor(),
                 [self, answer = std::move(answer)] { self->write(answer, false); });
    };
    board_.submit(std::move(command));
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wakeFd_, &one, sizeof one);
  }

  void write(const nlohmann::json& answer, bool thenClose) {
    auto text = std::make_shared<std::string>(answer.dump() + "\n");
    asio::async_write(
        socket_, asio::buffer(*text),
        [self = shared_from_this(), text, thenClose](boost::system::error_code code, std::size_t) {
          if (code) {
            self->socket_.close();
          } else if (thenClose) {
            self->drainAndClose();
          } else {
            self->readLine();
          }
        });
  }

  // After refusing an oversized request: half-close and discard what the
  // client still sends, so it reads our answer instead of a reset.
  void drainAndClose() {
    boost::system::error_code ignored;
    socket_.shutdown(Local::socket::shutdown_send, ignored);
    timer_.expires_after(std::chrono::seconds(2));
    timer_.async_wait([self = shared_from_this()](boost::system::error_code code) {
      if (!code) self->socket_.close();
    });
    buffer_.consume(buffer_.size());
    socket_.async_read_some(
        buffer_.prepare(4096),
        [self = shared_from_this()](boost::system::error_code code, std::size_t) {
          self->timer_.cancel();
          if (code) {
            self->socket_.close();
            return;
          }
          self->drainAndClose();
        });
  }

  Local::socket socket_;
  asio::steady_timer timer_;
  asio::streambuf buffer_;
  StatusBoard& board_;
  int wakeFd_;
  bool trusted_;
};

}  // namespace

std::optional<nlohmann::json> answerRequest(const std::string& line, const StatusSnapshot* snapshot,
                                            bool trusted, Command& command) {
  const nlohmann::json request = nlohmann::json::parse(line, nullptr, false);
  if (request.is_discarded()) return error("malformed JSON");
  if (!request.is_object() || !request.contains("cmd") || !request["cmd"].is_string()) {
    return error(
        "expected {\"cmd\": \"status\" | \"neighbors\" | \"history\" | \"config\" | \"set-policy\" "
        "| "
        "\"checkpoint\" | \"pause\" | \"resume\" | \"stop\"}");
  }
  const std::string name = request["cmd"].get<std::string>();
  if (name == "status" || name == "neighbors" || name == "history" || name == "config") {
    if (snapshot == nullptr) return error("starting up");
    if (name == "status") {
      nlohmann::json answer = toJson(*snapshot);
      answer["ok"] = true;
      return answer;
    }
    if (name == "neighbors")
      return nlohmann::json{{"ok", true}, {"neighbors", neighborsJson(*snapshot)}};
    if (name == "config") return nlohmann::json{{"ok", true}, {"config", snapshot->configYaml}};
    std::size_t count = snapshot->history.size();
    if (request.contains("n") && request["n"].is_number_unsigned()) {
      count = std::min(count, request["n"].get<std::size_t>());
    }
    nlohmann::json rounds = nlohmann::json::array();
    for (auto it = snapshot->history.end() - static_cast<std::ptrdiff_t>(count);
         it != snapshot->history.end(); ++it) {
      rounds.push_back(*it);
    }
    return nlohmann::json{{"ok", true}, {"history", rounds}};
  }
  if (name == "set-policy" || name == "checkpoint" || name == "pause" || name == "resume" ||
      name == "stop") {
    if (!trusted) return error("permission denied: '" + name + "' only from the daemon's own user");
    command.name = name;
    command.args = request;
    return std::nullopt;
  }
  return error("unknown command '" + name.substr(0, 64) + "'");
}

struct StatusServer::Impl {
  asio::io_context io;
  Local::acceptor acceptor{io};
  std::string path;
  StatusBoard* board;
  int wakeFd;
  std::thread thread;

  void accept() {
    acceptor.async_accept([this](boost::system::error_code code, Local::socket socket) {
      if (code) return;  // closed
      std::make_shared<Session>(std::move(socket), *board, wakeFd)->start();
      accept();
    });
  }
};

StatusServer::StatusServer(std::string path, StatusBoard& board, int wakeFd)
    : impl_(std::make_unique<Impl>()) {
  impl_->path = std::move(path);
  impl_->board = &board;
  impl_->wakeFd = wakeFd;
  std::error_code ignored;
  std::filesystem::create_directories(std::filesystem::path(impl_->path).parent_path(), ignored);
  std::filesystem::remove(impl_->path, ignored);  // a stale socket from a crash
  const mode_t previous = ::umask(0117);          // rw for user and group only
  try {
    impl_->acceptor.open(Local());
    impl_->acceptor.bind(Local::endpoint(impl_->path));
    impl_->acceptor.listen();
  } catch (const boost::system::system_error& e) {
    ::umask(previous);
    throw std::runtime_error("status socket " + impl_->path + ": " + e.what());
  }
  ::umask(previous);
  impl_->accept();
  impl_->thread = std::thread([impl = impl_.get()] { impl->io.run(); });
}

StatusServer::~StatusServer() {
  asio::post(impl_->io, [impl = impl_.get()] {
    boost::system::error_code ignored;
    impl->acceptor.close(ignored);
    impl->io.stop();
  });
  impl_->thread.join();
  std::error_code ignored;
  std::filesystem::remove(impl_->path, ignored);
}

}  // namespace consensusd::daemon
