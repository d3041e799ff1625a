#include "consensusd/daemon/status_server.hpp"

#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <filesystem>
#include <thread>

#include "os/thread_name.hpp"

namespace consensusd::daemon {
namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using Local = asio::local::stream_protocol;

constexpr std::size_t kMaxRequest = kMaxStatusRequest;
// After refusing an oversized request: how long the rest may keep coming.
constexpr auto kDrainTime = std::chrono::seconds(2);

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
  using Clock = asio::steady_timer::clock_type;

  Session(Local::socket socket, StatusBoard& board, int wakeFd, Clock::duration idleTimeout)
      : socket_(std::move(socket)),
        timer_(socket_.get_executor()),
        buffer_(kMaxRequest),
        board_(board),
        wakeFd_(wakeFd),
        idleTimeout_(idleTimeout),
        trusted_(peerIsUs(socket_)) {}

  void start() {
    moveDeadline();
    armTimer();
    readLine();
  }

 private:
  // One timer per connection, re-armed only when it fires: a request moves
  // the deadline (a store) rather than setting and cancelling a kernel timer
  // twice. A connection idle, or with an answer unread, past its deadline is
  // closed; one waiting for the engine's answer is not.
  void armTimer() {
    timer_.expires_at(deadline_);
    timer_.async_wait([self = shared_from_this()](boost::system::error_code code) {
      if (code) return;
      if (self->awaitingEngine_) self->moveDeadline();
      if (Clock::now() < self->deadline_) {
        self->armTimer();
      } else {
        self->close();
      }
    });
  }

  // The connection may stay `by` from now (a store: the timer checks it).
  void moveDeadline(Clock::duration by) { deadline_ = Clock::now() + by; }
  void moveDeadline() { moveDeadline(idleTimeout_); }

  void close() {
    boost::system::error_code ignored;
    socket_.close(ignored);
    timer_.cancel();  // so the session goes now, not when its timer would fire
  }

  void readLine() {
    moveDeadline();
    asio::async_read_until(
        socket_, buffer_, '\n',
        [self = shared_from_this()](boost::system::error_code code, std::size_t bytes) {
          self->onLine(code, bytes);
        });
  }

  void onLine(boost::system::error_code code, std::size_t bytes) {
    if (code == asio::error::not_found) {  // the buffer filled without a newline
      write(error("request larger than 64 KiB"), true);
      return;
    }
    if (code) {
      close();
      return;
    }
    moveDeadline();  // the answer's time to be read
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
    awaitingEngine_ = true;
    command.reply = [self = shared_from_this()](nlohmann::json answer) {
      asio::post(self->socket_.get_executor(), [self, answer = std::move(answer)] {
        self->awaitingEngine_ = false;
        self->moveDeadline();
        self->write(answer, false);
      });
    };
    board_.submit(std::move(command));
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wakeFd_, &one, sizeof one);
  }

  void write(const nlohmann::json& answer, bool thenClose) {
    auto text = std::make_shared<std::string>(serialize(answer) + "\n");
    asio::async_write(
        socket_, asio::buffer(*text),
        [self = shared_from_this(), text, thenClose](boost::system::error_code code, std::size_t) {
          if (code) {
            self->close();
          } else if (thenClose) {
            self->moveDeadline(kDrainTime);
            self->armTimer();  // an earlier deadline than the one armed
            self->drainAndClose();
          } else {
            self->readLine();
          }
        });
  }

  // After refusing an oversized request: half-close and discard what the
  // client still sends (2 s more after each piece), so it reads our answer
  // instead of a reset.
  void drainAndClose() {
    boost::system::error_code ignored;
    socket_.shutdown(Local::socket::shutdown_send, ignored);
    buffer_.consume(buffer_.size());
    socket_.async_read_some(
        buffer_.prepare(4096),
        [self = shared_from_this()](boost::system::error_code code, std::size_t) {
          if (code) {
            self->close();
            return;
          }
          self->moveDeadline(kDrainTime);
          self->drainAndClose();
        });
  }

  Local::socket socket_;
  asio::steady_timer timer_;
  asio::streambuf buffer_;
  StatusBoard& board_;
  int wakeFd_;
  Clock::duration idleTimeout_;
  bool trusted_;
  Clock::time_point deadline_;
  bool awaitingEngine_ = false;
};

// One HTTP request per connection: GET /status, /metrics, /healthz.
class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(asio::ip::tcp::socket socket, StatusBoard& board)
      : stream_(std::move(socket)), board_(board) {}

  void start() {
    stream_.expires_after(std::chrono::seconds(10));
    http::async_read(stream_, buffer_, request_,
                     [self = shared_from_this()](boost::system::error_code code, std::size_t) {
                       if (!code) self->respond();
                     });
  }

 private:
  void respond() {
    const auto snapshot = board_.current();
    auto response =
        std::make_shared<http::response<http::string_body>>(http::status::ok, request_.version());
    response->keep_alive(false);
    const std::string target(request_.target());
    if (request_.method() != http::verb::get) {
      response->result(http::status::method_not_allowed);
      response->body() = "GET only\n";
    } else if (target == "/healthz") {
      const bool live = board_.live();
      response->result(live ? http::status::ok : http::status::service_unavailable);
      response->body() = live ? "ok\n" : snapshot ? "engine loop stalled\n" : "starting\n";
    } else if (target == "/status" && snapshot) {
      response->set(http::field::content_type, "application/json");
      response->body() = serialize(toJson(*snapshot)) + "\n";
    } else if (target == "/metrics" && snapshot) {
      response->set(http::field::content_type, "text/plain; version=0.0.4");
      response->body() = prometheusText(*snapshot);
    } else {
      response->result(snapshot ? http::status::not_found : http::status::service_unavailable);
      response->body() = snapshot ? "try /status, /metrics or /healthz\n" : "starting\n";
    }
    response->prepare_payload();
    http::async_write(
        stream_, *response,
        [self = shared_from_this(), response](boost::system::error_code, std::size_t) {
          boost::system::error_code ignored;
          self->stream_.socket().shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
        });
  }

  boost::beast::tcp_stream stream_;
  boost::beast::flat_buffer buffer_{8192};
  http::request<http::string_body> request_;
  StatusBoard& board_;
};

}  // namespace

std::string prometheusText(const StatusSnapshot& status) {
  std::string out;
  const std::string node = "node=\"" + status.node + "\"";
  const auto metric = [&](const char* name, const char* type, const char* help,
                          const std::vector<std::pair<std::string, double>>& samples) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    for (const auto& [labels, value] : samples) {
      out +=
          std::string(name) + "{" + node + labels + "} " + serialize(nlohmann::json(value)) + "\n";
    }
  };
  const auto one = [](double value) {
    return std::vector<std::pair<std::string, double>>{{"", value}};
  };
  metric("consensusd_round", "gauge", "Round the node is in.",
         one(static_cast<double>(status.round)));
  metric("consensusd_rounds_per_second", "gauge", "Rounds per second over the recent history.",
         one(status.roundsPerSecond));
  metric("consensusd_train_loss", "gauge", "Minibatch loss, exponentially smoothed.",
         one(status.loss));
  if (status.accuracy >= 0) {
    metric("consensusd_test_accuracy", "gauge", "Test accuracy at the last evaluation.",
           one(status.accuracy));
  }
  if (const auto& trainer = status.trainer) {  // model.kind: external
    metric("consensusd_trainer_attached", "gauge", "1 while a trainer is attached.",
           one(trainer->attached ? 1.0 : 0.0));
    metric("consensusd_trainer_updates_total", "counter", "Updates taken from the trainer.",
           one(static_cast<double>(trainer->updates)));
    metric("consensusd_trainer_rejected_updates_total", "counter",
           "Trainer updates refused (NaN/Inf, wrong round or kind).",
           one(static_cast<double>(trainer->rejectedUpdates)));
    metric("consensusd_trainer_update_mean_seconds", "gauge",
           "From x_k published to the trainer's update: mean over the recent window.",
           one(trainer->meanUpdateMs / 1000));
    metric("consensusd_trainer_update_p95_seconds", "gauge",
           "From x_k published to the trainer's update: 95th percentile, recent window.",
           one(trainer->p95UpdateMs / 1000));
  }
  metric("consensusd_consensus_distance", "gauge",
         "Distance between the estimate and its mix, last round.", one(status.consensusDistance));
  metric("consensusd_wait_target", "gauge", "Neighbours the wait policy waits for (m).",
         one(static_cast<double>(status.target)));
  metric("consensusd_degree", "gauge", "Neighbours in the topology.",
         one(static_cast<double>(status.degree)));
  metric("consensusd_suspect_neighbors", "gauge",
         "Neighbours silent for longer than the peer timeout.",
         one(static_cast<double>(status.suspects)));
  metric("consensusd_last_checkpoint_round", "gauge",
         "Round of the last committed checkpoint (-1: none).",
         one(static_cast<double>(status.lastCheckpointRound)));
  metric("consensusd_checkpoint_failures_total", "counter",
         "Checkpoints that could not be written (full disk, I/O error).",
         one(static_cast<double>(status.checkpointFailures)));
  metric("consensusd_accept_failures_total", "counter",
         "Connections the status socket or HTTP could not accept (file descriptors ran out).",
         one(static_cast<double>(status.acceptFailures)));
  metric("consensusd_uptime_seconds", "gauge", "Seconds since the daemon started.",
         one(status.uptimeS));
  const auto labelled = [](const std::map<std::string, std::uint64_t>& counts, const char* label) {
    std::vector<std::pair<std::string, double>> samples;
    for (const auto& [name, count] : counts)
      samples.emplace_back("," + std::string(label) + "=\"" + name + "\"",
                           static_cast<double>(count));
    return samples;
  };
  metric("consensusd_accepted_messages_total", "counter",
         "Messages that passed validation and the round check (estimates and controls).",
         one(static_cast<double>(status.accepted)));
  metric("consensusd_rejected_messages_total", "counter",
         "Messages refused (malformed, foreign, implausible), by reason.",
         labelled(status.rejects, "reason"));
  metric("consensusd_discarded_estimates_total", "counter",
         "Well-formed estimates not kept (stale, duplicate), by reason.",
         labelled(status.discarded, "reason"));
  metric("consensusd_send_events_total", "counter",
         "Outgoing messages deferred, superseded or dropped, by event.",
         labelled(status.sends, "event"));
  metric("consensusd_round_cutoffs_total", "counter",
         "Rounds ended, by what ended them: count (the m waited for were in), timeout, deadline.",
         labelled(status.cutoffs, "reason"));
  metric("consensusd_connections_closed_total", "counter", "Connections to the ROUTER that closed.",
         one(static_cast<double>(status.connectionsClosed)));
  metric("consensusd_sent_bytes_total", "counter",
         "Estimate payload handed to the network (compressed frames and whole estimates).",
         one(static_cast<double>(status.bytesSent)));
  metric("consensusd_training_samples_total", "counter",
         "Training samples behind the updates the node took (bytes per sample: sent / this).",
         one(static_cast<double>(status.samples)));
  std::vector<std::pair<std::string, double>> received;
  std::vector<std::pair<std::string, double>> mixed;
  std::vector<std::pair<std::string, double>> bytes;
  std::vector<std::pair<std::string, double>> sentTo;
  std::vector<std::pair<std::string, double>> rate;
  std::vector<std::pair<std::string, double>> transfer;
  for (const NeighborStatus& n : status.neighbors) {
    const std::string neighbor = ",neighbor=\"" + n.id + "\"";
    received.emplace_back(neighbor + ",timing=\"on_time\"", static_cast<double>(n.onTime));
    received.emplace_back(neighbor + ",timing=\"late\"", static_cast<double>(n.late));
    mixed.emplace_back(neighbor, static_cast<double>(n.mixed));
    bytes.emplace_back(neighbor, static_cast<double>(n.receivedBytes));
    sentTo.emplace_back(neighbor, static_cast<double>(n.sentBytes));
    rate.emplace_back(neighbor, n.bytesPerSecond);
    transfer.emplace_back(neighbor, n.transferMs / 1000);
  }
  metric("consensusd_received_bytes_total", "counter",
         "Estimate bytes received from a neighbour (every valid chunk).", bytes);
  metric("consensusd_neighbor_sent_bytes_total", "counter",
         "Estimate bytes sent to a neighbour (compressed frames and whole estimates).", sentTo);
  metric("consensusd_received_bytes_per_second", "gauge",
         "Estimate bytes per second from a neighbour, over the last second or more.", rate);
  metric("consensusd_estimate_transfer_seconds", "gauge",
         "A neighbour's last estimate of several chunks, from its first chunk to its last.",
         transfer);
  metric("consensusd_estimates_received_total", "counter",
         "Estimates stored, by neighbour and timing.", received);
  metric("consensusd_estimates_mixed_total", "counter",
         "Rounds in which a neighbour's estimate was averaged.", mixed);
  return out;
}

std::optional<nlohmann::json> answerRequest(const std::string& line, const StatusSnapshot* snapshot,
                                            bool trusted, Command& command) {
  const nlohmann::json request = nlohmann::json::parse(line, nullptr, false);
  if (request.is_discarded()) return error("malformed JSON");
  if (!request.is_object() || !request.contains("cmd") || !request["cmd"].is_string()) {
    return error(
        "expected {\"cmd\": \"status\" | \"neighbors\" | \"history\" | \"config\" | \"set-policy\" "
        "| \"apply\" | \"checkpoint\" | \"pause\" | \"resume\" | \"stop\"}");
  }
  const std::string name = request["cmd"].get<std::string>();
  if (name == "status" || name == "neighbors" || name == "history" || name == "config") {
    if (snapshot == nullptr) return error("starting up");
    if (name == "status") {
      std::optional<StatusFields> fields;
      if (request.contains("fields")) {
        fields = StatusFields::parse(request["fields"]);
        if (!fields) return error("fields: expected an array of at most 128 field names");
      }
      nlohmann::json answer = toJson(*snapshot, fields ? &*fields : nullptr);
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
      rounds.push_back(**it);
    }
    return nlohmann::json{{"ok", true}, {"history", rounds}};
  }
  if (name == "set-policy" || name == "apply" || name == "checkpoint" || name == "pause" ||
      name == "resume" || name == "stop") {
    if (!trusted) return error("permission denied: '" + name + "' only from the daemon's own user");
    command.name = name;
    command.args = request;
    return std::nullopt;
  }
  return error("unknown command '" + name.substr(0, 64) + "'");
}

std::vector<std::string> setPolicyOverrides(const nlohmann::json& args) {
  std::vector<std::string> overrides;
  for (const char* key : {"policy", "backups", "timeout_ms", "quantile"}) {
    if (!args.contains(key)) continue;
    const auto& value = args[key];
    overrides.push_back(std::string("consensus.") + key + "=" +
                        (value.is_string() ? value.get<std::string>() : serialize(value)));
  }
  return overrides;
}

struct StatusServer::Impl {
  asio::io_context io;
  Local::acceptor acceptor{io};
  asio::ip::tcp::acceptor http{io};
  std::string path;
  StatusBoard* board;
  int wakeFd;
  std::chrono::milliseconds idleTimeout;
  std::thread thread;

  asio::steady_timer acceptPause{io};
  asio::steady_timer httpPause{io};

  // Out of file descriptors (EMFILE, ENFILE) or memory, accept fails: log it
  // once, count it, wait a little and accept again, so the socket serves as
  // soon as descriptors are free. Only closing the acceptor ends the loop.
  template <class Acceptor, class Start>
  void retryLater(const boost::system::error_code& code, Acceptor& listener,
                  asio::steady_timer& pause, Start start) {
    if (code == asio::error::operation_aborted || !listener.is_open()) return;
    if (board->countAcceptFailure() == 1)
      spdlog::warn("accept failed: {} (retrying)", code.message());
    pause.expires_after(std::chrono::milliseconds(100));
    pause.async_wait([start](boost::system::error_code waited) {
      if (!waited) start();
    });
  }

  void accept() {
    acceptor.async_accept([this](boost::system::error_code code, Local::socket socket) {
      if (code) return retryLater(code, acceptor, acceptPause, [this] { accept(); });
      std::make_shared<Session>(std::move(socket), *board, wakeFd, idleTimeout)->start();
      accept();
    });
  }

  void acceptHttp() {
    http.async_accept([this](boost::system::error_code code, asio::ip::tcp::socket socket) {
      if (code) return retryLater(code, http, httpPause, [this] { acceptHttp(); });
      std::make_shared<HttpSession>(std::move(socket), *board)->start();
      acceptHttp();
    });
  }
};

StatusServer::StatusServer(std::string path, std::string httpAddress, StatusBoard& board,
                           int wakeFd, std::chrono::milliseconds idleTimeout)
    : impl_(std::make_unique<Impl>()) {
  impl_->path = std::move(path);
  impl_->board = &board;
  impl_->wakeFd = wakeFd;
  impl_->idleTimeout = idleTimeout;
  std::error_code ignored;
  std::filesystem::create_directories(std::filesystem::path(impl_->path).parent_path(), ignored);
  if (std::filesystem::is_socket(impl_->path, ignored)) {
    // A socket file: stale after a crash, or another instance's (same config).
    Local::socket probe(impl_->io);
    boost::system::error_code refused;
    probe.connect(Local::endpoint(impl_->path), refused);
    if (!refused) {
      throw Unavailable("status socket " + impl_->path +
                        " is held by a running daemon; stop it first (consensusctl stop)");
    }
    std::filesystem::remove(impl_->path, ignored);
  }
  const mode_t previous = ::umask(0117);  // rw for user and group only
  try {
    impl_->acceptor.open(Local());
    impl_->acceptor.bind(Local::endpoint(impl_->path));
    impl_->acceptor.listen();
  } catch (const boost::system::system_error& e) {
    ::umask(previous);
    throw Unavailable("status socket " + impl_->path + ": " + e.what());
  }
  ::umask(previous);
  impl_->accept();
  if (!httpAddress.empty()) {
    const std::size_t colon = httpAddress.rfind(':');
    std::string host = httpAddress.substr(0, colon);
    if (host == "localhost") host = "127.0.0.1";
    if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
    try {
      const asio::ip::tcp::endpoint endpoint(
          asio::ip::make_address(host),
          static_cast<unsigned short>(std::stoi(httpAddress.substr(colon + 1))));
      impl_->http.open(endpoint.protocol());
      impl_->http.set_option(asio::socket_base::reuse_address(true));
      impl_->http.bind(endpoint);
      impl_->http.listen();
    } catch (const boost::system::system_error& e) {
      throw Unavailable("status.http " + httpAddress + ": " + e.what());
    }
    impl_->acceptHttp();
  }
  impl_->thread = std::thread([impl = impl_.get()] {
    nameThisThread("status");
    // No exception ends the process from this thread: a failed handler is
    // logged and the loop goes on (asio allows run() again after a throw).
    for (;;) {
      try {
        impl->io.run();
        return;
      } catch (const std::exception& e) {
        spdlog::error("status thread: {}", e.what());
      }
    }
  });
}

StatusServer::~StatusServer() {
  asio::post(impl_->io, [impl = impl_.get()] {
    boost::system::error_code ignored;
    impl->acceptor.close(ignored);
    impl->http.close(ignored);
    impl->acceptPause.cancel();
    impl->httpPause.cancel();
    impl->io.stop();
  });
  impl_->thread.join();
  std::error_code ignored;
  std::filesystem::remove(impl_->path, ignored);
}

}  // namespace consensusd::daemon
