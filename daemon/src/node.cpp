#include "node.hpp"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "consensusd/config/params.hpp"
#include "consensusd/consensus/round_engine.hpp"
#include "consensusd/consensus/straggler.hpp"
#include "consensusd/daemon/checkpoint.hpp"
#include "consensusd/daemon/curve.hpp"
#include "consensusd/daemon/status_server.hpp"
#include "consensusd/daemon/wire.hpp"
#include "consensusd/data/partition.hpp"
#include "consensusd/version.hpp"
#include "service_notify.hpp"

namespace consensusd::daemon {
namespace {

using consensus::Duration;
using consensus::Time;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kHistory = 200;  // round records kept for `history`
// A snapshot copies the history: after rounds (1000/s here), publish at most this often.
constexpr auto kStatusEvery = std::chrono::milliseconds(50);
// Without rounds (a stalled or paused node), rejects and suspects still show within this.
constexpr auto kStatusRefresh = std::chrono::seconds(1);

void notify(int fd) {
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(fd, &one, sizeof one);
}

void drainFd(int fd) {
  std::uint64_t value = 0;
  [[maybe_unused]] const ssize_t n = ::read(fd, &value, sizeof value);
}

// Gradients (and test evaluations) on their own thread, one job at a time,
// so computing overlaps the wait for neighbours (DESIGN.md §2 step 2).
template <class Scalar>
class ComputeWorker {
 public:
  using Vector = Eigen::Matrix<Scalar, Eigen::Dynamic, 1>;
  struct Job {
    std::int64_t round = 0;
    Vector params;
    bool evaluate = false;
  };
  struct Result {
    std::int64_t round = 0;
    Vector gradient;
    double loss = 0;
    data::GradientStats stats;
    std::optional<data::Evaluation> evaluation;
    std::exception_ptr failure;  // a bug in the model code: rethrown on the engine thread
  };

  // Without a model (kind: none) gradients are zeros of `dimension`: rounds
  // measure the exchange alone.
  ComputeWorker(const data::TrainTest& data, data::Dataset share,
                const std::optional<data::ModelOptions>& model, std::size_t dimension,
                std::size_t batchSize, std::uint64_t seed, consensus::StragglerSpec straggler)
      : data_(data),
        share_(std::move(share)),
        model_(model ? std::optional<data::Model<Scalar>>(*model) : std::nullopt),
        dimension_(model_ ? model_->dimension() : dimension),
        sampler_(share_.size(), batchSize, seed),
        straggler_(straggler),
        readyFd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
        failAtRound_(failpointRound()),
        thread_([this] { loop(); }) {}

  ~ComputeWorker() {
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
    ::close(readyFd_);
  }
  ComputeWorker(const ComputeWorker&) = delete;
  ComputeWorker& operator=(const ComputeWorker&) = delete;

  int readyFd() const { return readyFd_; }
  std::size_t dimension() const { return dimension_; }
  Vector initialParams(std::uint64_t seed) const {
    Vector params = Vector::Zero(static_cast<Eigen::Index>(dimension_));
    if (model_) model_->initialize(params, seed);
    return params;
  }

  void submit(std::int64_t round, const Vector& params, bool evaluate) {
    {
      const std::lock_guard lock(mutex_);
      job_.emplace();
      job_->round = round;
      job_->params = params;
      job_->evaluate = evaluate;
    }
    wake_.notify_all();
  }

  std::optional<Result> take() {
    drainFd(readyFd_);
    const std::lock_guard lock(mutex_);
    std::optional<Result> out;
    out.swap(result_);
    if (out && out->failure) std::rethrow_exception(out->failure);
    return out;
  }

 private:
  void loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return stopping_ || job_.has_value(); });
      if (stopping_) return;
      Job job = std::move(*job_);
      job_.reset();
      lock.unlock();

      const Clock::time_point start = Clock::now();
      Result result;
      result.round = job.round;
      result.gradient.setZero(job.params.size());
      try {
        if (job.round == failAtRound_) throw std::logic_error("failpoint compute-throw");
        if (model_) {
          data::gather(share_, sampler_.next(), batch_);
          result.loss = static_cast<double>(
              model_->lossAndGradient(job.params, batch_, result.gradient, &result.stats));
          if (job.evaluate) result.evaluation = model_->evaluate(job.params, data_.test);
        }
      } catch (...) {  // no exception leaves this thread (STYLE.md, errors)
        result.failure = std::current_exception();
      }
      const Duration delay = straggler_.extraDelay(job.round, Clock::now() - start);

      lock.lock();
      // The emulated straggler sleeps here, interruptibly (stop must stay prompt).
      if (delay > Duration::zero() && wake_.wait_for(lock, delay, [this] { return stopping_; }))
        return;
      result_ = std::move(result);
      notify(readyFd_);
    }
  }

  // Crash testing (tests only): CONSENSUSD_FAILPOINT=compute-throw@R makes
  // the gradient of round R throw, as a bug in model code would.
  static std::int64_t failpointRound() {
    const char* spec = std::getenv("CONSENSUSD_FAILPOINT");
    const std::string prefix = "compute-throw@";
    if (spec == nullptr || std::string(spec).rfind(prefix, 0) != 0) return -1;
    return std::atoll(spec + prefix.size());
  }

  const data::TrainTest& data_;
  data::Dataset share_;
  std::optional<data::Model<Scalar>> model_;
  std::size_t dimension_;
  data::MinibatchSampler sampler_;
  data::Batch<Scalar> batch_;
  consensus::Straggler straggler_;
  int readyFd_;
  std::int64_t failAtRound_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::optional<Job> job_;
  std::optional<Result> result_;
  bool stopping_ = false;
  std::thread thread_;
};

template <class Scalar>
class Runner {
 public:
  using Vector = Eigen::Matrix<Scalar, Eigen::Dynamic, 1>;

  Runner(const config::LoadedConfig& loaded, StatusBoard& board, int signalFd, int wakeFd)
      : loaded_(loaded),
        cfg_(loaded.config),
        topology_(loaded.topology),
        self_(loaded.nodeIndex),
        board_(board),
        signalFd_(signalFd),
        wakeFd_(wakeFd),
        started_(Clock::now()),
        checkpoints_(cfg_.checkpoint.dir, static_cast<std::size_t>(cfg_.checkpoint.keep)) {}

  int run() {
    loadData();
    openSockets();
    resume();
    service_.ready();  // systemd (Type=notify): started once the ports are bound
    spdlog::info(
        "node {} of {} ({} nodes, degree {}), {} parameters ({}), policy {}, starting at round {}",
        cfg_.node.id, topology_.name(), topology_.size(), topology_.inNeighbors(self_).size(),
        dimension_, cfg_.model.dtype, cfg_.consensus.policy, engine_->round());
    int code = 0;
    try {
      loop();
    } catch (const std::exception& e) {
      // A bug on the engine thread: stop cleanly, keep what was trained.
      spdlog::critical("internal error on the engine thread: {}; stopping with a checkpoint",
                       e.what());
      code = 70;
    }
    shutdown();
    return code;
  }

 private:
  // An estimate on its way out: header and the round's shared payload.
  struct Outgoing {
    std::int64_t round = 0;
    Time due{};
    std::array<std::byte, wire::kHeaderSize> header{};
    std::shared_ptr<std::vector<Scalar>> payload;
  };
  // One per out-neighbour: its DEALER and what did not fit in its queue yet.
  // Nothing is lost to a momentarily full queue, and memory stays bounded: one
  // estimate (the newest) and at most kMaxPendingControls control messages.
  struct Link {
    zmq::socket_t dealer;
    std::optional<Outgoing> estimate;
    std::deque<std::array<std::byte, wire::kHeaderSize>> controls;
  };
  static constexpr std::size_t kMaxPendingControls = 64;

  Time now() const { return std::chrono::duration_cast<Time>(Clock::now() - started_); }

  void loadData() {
    data_ = data::load(config::dataSource(cfg_));
    const auto parts =
        data::partition(data_.train, config::partitionOptions(cfg_, topology_.size()));
    data::Dataset share = data::subset(data_.train, parts[self_]);
    histogram_ = data::classHistogram(data_.train, parts[self_]);
    spdlog::info("{}; this node holds {} training samples", data_.description, share.size());
    worker_ = std::make_unique<ComputeWorker<Scalar>>(
        data_, std::move(share),
        cfg_.model.kind == "none" ? std::nullopt
                                  : std::optional(config::modelOptions(cfg_, data_.train)),
        static_cast<std::size_t>(cfg_.model.dimension),
        static_cast<std::size_t>(cfg_.train.batchSize),
        static_cast<std::uint64_t>(cfg_.data.seed) * 7919u + self_, config::stragglerSpec(cfg_));
    dimension_ = worker_->dimension();
    expect_ = {topology_.hash(), dimension_, dtype()};
  }

  // 64 random bits: a routing id nobody can claim before us (a restart, or
  // a reconnect after an outage, never meets a stale connection's id).
  static std::string randomHex() {
    std::random_device device;
    const std::uint64_t bits = (std::uint64_t{device()} << 32) | device();
    return fmt::format("{:016x}", bits);
  }

  static wire::Dtype dtype() {
    return sizeof(Scalar) == 8 ? wire::Dtype::Float64 : wire::Dtype::Float32;
  }

  void openSockets() {
    const int maxMessage =
        static_cast<int>(std::min<std::size_t>(dimension_ * sizeof(Scalar) + 4096, INT32_MAX));
    router_ = zmq::socket_t(context_, zmq::socket_type::router);
    router_.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(maxMessage));
    router_.set(zmq::sockopt::rcvhwm, 64);
    // A second connection with a live connection's routing id is refused
    // (handover would drop the live one, and libzmq 4.3.4 can assert under
    // repeated handovers); our DEALERs' ids carry a random part, so only a
    // copy of a live id clashes. docs/protocol.md, "Identities".
    router_.set(zmq::sockopt::router_handover, 0);
    router_.set(zmq::sockopt::linger, 0);
    router_.set(zmq::sockopt::heartbeat_ivl, 1000);
    router_.set(zmq::sockopt::heartbeat_timeout, 5000);
    if (loaded_.curve) {
      // Admitted: the in-neighbours' keys; the handler answers before the first connection.
      std::map<std::string, std::string> admitted;
      for (const topology::Neighbor& in : topology_.inNeighbors(self_))
        admitted.emplace(topology_.node(in.index).publicKey, topology_.node(in.index).id);
      zap_ = std::make_unique<curve::ZapHandler>(context_, std::move(admitted));
      curve::makeServer(router_, *loaded_.curve);
    }
    // What never reaches recv: junk that fails the ZMTP handshake, and
    // connections ZeroMQ closes (a frame over MAXMSGSIZE ends here).
    const std::string monitorEndpoint = "inproc://router-monitor";
    if (zmq_socket_monitor(router_.handle(), monitorEndpoint.c_str(),
                           ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_DISCONNECTED) != 0)
      throw zmq::error_t();
    monitor_ = zmq::socket_t(context_, zmq::socket_type::pair);
    monitor_.connect(monitorEndpoint);
    const std::string bindAt =
        cfg_.node.bind.empty() ? topology_.node(self_).endpoint : cfg_.node.bind;
    try {
      router_.bind(bindAt);
    } catch (const zmq::error_t& e) {
      throw Unavailable("cannot bind " + bindAt + ": " + e.what());
    }
    const std::string routingId = cfg_.node.id + "/" + randomHex();
    spdlog::info("sending as routing id {}", routingId);
    for (const topology::Neighbor& out : topology_.outNeighbors(self_)) {
      zmq::socket_t dealer(context_, zmq::socket_type::dealer);
      dealer.set(zmq::sockopt::routing_id, routingId);
      dealer.set(zmq::sockopt::sndhwm, 8);
      dealer.set(zmq::sockopt::immediate, 1);
      dealer.set(zmq::sockopt::linger, 200);
      dealer.set(zmq::sockopt::heartbeat_ivl, 1000);
      dealer.set(zmq::sockopt::heartbeat_timeout, 5000);
      dealer.set(zmq::sockopt::reconnect_ivl, 100);
      dealer.set(zmq::sockopt::reconnect_ivl_max, 2000);
      if (loaded_.curve)
        curve::makeClient(dealer, *loaded_.curve, topology_.node(out.index).publicKey);
      dealer.connect(topology_.node(out.index).endpoint);
      links_.emplace(out.index, Link{std::move(dealer), {}, {}});
    }
    for (const topology::Neighbor& in : topology_.inNeighbors(self_)) {
      peerIndex_[topology_.node(in.index).id] = in.index;
      peerBySender_[static_cast<std::uint32_t>(in.index)] = in.index;
      peerRejects_[in.index] = 0;
    }
  }

  void resume() {
    Checkpoint expect;
    expect.topologyHash = topology_.hash();
    expect.node = static_cast<std::uint32_t>(self_);
    expect.dtype = dtype();
    expect.dimension = dimension_;
    const CheckpointStore::Loaded loaded = checkpoints_.loadNewest(expect);
    for (const auto& file : loaded.skipped)
      spdlog::warn("checkpoint folder: {} is not a regular file: skipped", file);
    for (const auto& file : loaded.rejected)
      spdlog::warn("checkpoint {} rejected ({}): renamed to .rejected", file.path, file.why);
    CheckpointStore::setAside(loaded.rejected);
    Vector params = worker_->initialParams(static_cast<std::uint64_t>(cfg_.model.initSeed));
    std::int64_t firstRound = 0;
    Vector velocity;
    if (loaded.checkpoint) {
      std::memcpy(params.data(), loaded.checkpoint->params.data(),
                  loaded.checkpoint->params.size());
      if (!loaded.checkpoint->velocity.empty()) {
        velocity.resize(params.size());
        std::memcpy(velocity.data(), loaded.checkpoint->velocity.data(),
                    loaded.checkpoint->velocity.size());
      }
      firstRound = loaded.checkpoint->round;
      lastCheckpoint_ = firstRound;
      spdlog::info("resumed from {} (round {})", loaded.path, firstRound);
    }
    engine_ = std::make_unique<consensus::RoundEngine<Scalar>>(
        topology_, self_, config::engineOptions(cfg_), config::schedule(cfg_), cfg_.train.momentum,
        std::move(params), now(), firstRound);
    if (velocity.size() > 0 && cfg_.train.momentum > 0) engine_->restoreVelocity(velocity);
  }

  // One buffer per round, shared by every neighbour's send (zero-copy): each
  // message holds a reference, the last send to complete frees it.
  void publish(std::int64_t round, const Vector& params) {
    Outgoing out;
    out.round = round;
    out.payload =
        std::make_shared<std::vector<Scalar>>(params.data(), params.data() + params.size());
    wire::Header header;
    header.kind = wire::Kind::Estimate;
    header.dtype = dtype();
    header.sender = static_cast<std::uint32_t>(self_);
    header.round = round;
    header.dimension = dimension_;
    header.topologyHash = topology_.hash();
    header.payloadBytes = dimension_ * sizeof(Scalar);
    header.checksum = wire::checksum(out.payload->data(), header.payloadBytes);
    header.sentNs = now().count();
    out.header = wire::encode(header);
    if (linkDelay_ > Duration::zero()) {  // emulated slow links (straggler.link_delay_ms)
      out.due = now() + linkDelay_;
      delayed_.push_back(std::move(out));
      return;
    }
    sendToAll(std::move(out));
  }

  void sendToAll(Outgoing out) {
    lastSent_ = std::move(out);
    for (auto& [node, link] : links_) queueEstimate(link, *lastSent_);
  }

  void sendDue(Time t) {
    while (!delayed_.empty() && delayed_.front().due <= t) {
      sendToAll(std::move(delayed_.front()));
      delayed_.pop_front();
    }
  }

  // Only the newest estimate matters: it replaces one still waiting for room.
  void queueEstimate(Link& link, const Outgoing& out) {
    if (link.estimate) ++sends_["superseded"];
    link.estimate = out;
    flush(link);
  }

  // Sends what waits on `link` until its queue is full (never blocks).
  void flush(Link& link) {
    while (!link.controls.empty()) {
      if (!trySend(link.dealer, link.controls.front(), zmq::message_t())) return;
      link.controls.pop_front();
    }
    if (!link.estimate) return;
    auto* hint = new std::shared_ptr<std::vector<Scalar>>(link.estimate->payload);
    zmq::message_t payload((*hint)->data(), (*hint)->size() * sizeof(Scalar),
                           [](void* /*data*/, void* h) {
                             delete static_cast<std::shared_ptr<std::vector<Scalar>>*>(h);
                           },
                           hint);
    if (trySend(link.dealer, link.estimate->header, std::move(payload))) {
      link.estimate.reset();
    } else {
      ++sends_["deferred"];
    }
  }

  static bool trySend(zmq::socket_t& dealer, const std::array<std::byte, wire::kHeaderSize>& header,
                      zmq::message_t payload) {
    // The high-water mark is checked on the first frame only: the second cannot fail on it.
    if (!dealer.send(zmq::buffer(header), zmq::send_flags::sndmore | zmq::send_flags::dontwait))
      return false;
    return dealer.send(payload, zmq::send_flags::dontwait).has_value();
  }

  // A neighbour heard for the first time, or again after a silence: it may
  // have missed our estimate (not yet connected, restarted), so send it again.
  void welcome(std::size_t peer, Time t) {
    const auto heard = lastHeard_.find(peer);
    const bool returning = heard == lastHeard_.end() || t - heard->second > peerTimeout_;
    lastHeard_[peer] = t;
    if (!returning) return;
    if (heard != lastHeard_.end()) spdlog::info("{} is back", topology_.node(peer).id);
    resendTo(peer);
  }

  void resendTo(std::size_t peer) {
    if (const auto link = links_.find(peer); link != links_.end() && lastSent_)
      queueEstimate(link->second, *lastSent_);
  }

  // A neighbour whose keep-alives report the same round twice in a row is
  // stuck; if our newest estimate is one it can use, it may have been lost
  // with a dropped connection: send it again (at most once per keep-alive).
  void onKeepAliveRound(std::size_t peer, std::int64_t round) {
    const auto [previous, fresh] = helloRounds_.try_emplace(peer, round);
    if (fresh) return;
    const bool stuck = previous->second == round;
    previous->second = round;
    if (stuck && lastSent_ && lastSent_->round >= round - cfg_.consensus.staleness) resendTo(peer);
  }

  // HELLO goes out only if there is room (another follows soon); DECISION and
  // BYE wait in the link's bounded queue.
  void sendControl(wire::Kind kind, std::int64_t round = 0, std::uint64_t flags = 0,
                   std::optional<std::size_t> only = {}) {
    wire::Header header;
    header.kind = kind;
    header.dtype = dtype();
    header.sender = static_cast<std::uint32_t>(self_);
    header.round = round;
    header.dimension = dimension_;
    header.topologyHash = topology_.hash();
    header.flags = flags;
    header.sentNs = now().count();
    const auto bytes = wire::encode(header);
    for (auto& [node, link] : links_) {
      if (only && *only != node) continue;
      if (kind == wire::Kind::Hello) {
        if (link.controls.empty() && !link.estimate) trySend(link.dealer, bytes, zmq::message_t());
        continue;
      }
      if (link.controls.size() >= kMaxPendingControls) {
        link.controls.pop_front();
        ++sends_["dropped"];
      }
      link.controls.push_back(bytes);
      flush(link);
    }
  }

  void reject(std::optional<std::size_t> peer, wire::Reject reason,
              const std::string& detail = {}) {
    ++rejects_[wire::toString(reason)];
    if (peer) ++peerRejects_[*peer];
    const std::string key =
        (peer ? topology_.node(*peer).id : std::string("?")) + "/" + wire::toString(reason);
    if (loggedRejects_.insert(key).second) {
      spdlog::warn("dropping messages from {}: {}{}",
                   peer ? topology_.node(*peer).id : std::string("an unknown peer"),
                   wire::toString(reason), detail.empty() ? "" : " (" + detail + ")");
    }
  }

  struct Identity {
    std::string name;  // for the log
    std::optional<std::size_t> peer;
    bool foreignId = false;  // CURVE: the routing id names another node than the key
  };
  // Who sent a message. With CURVE the peer is who its key says (the ZAP
  // User-Id), and the routing id must not name anybody else. Without, the
  // routing id ("n1/<random>", see openSockets) names the neighbour. When
  // libzmq refuses a connection's duplicate id it later takes the first data
  // frame as the id: a routing id of a header's size then names nobody, and
  // the header's sender is checked instead (a later reconnect is not lost).
  Identity identify(const std::vector<zmq::message_t>& frames) const {
    const std::string routingId = frames[0].to_string();
    const std::string named = routingId.substr(0, routingId.rfind('/'));
    Identity who{(zap_ && frames.size() > 1 ? curve::userIdOf(frames[1]) : named).substr(0, 64),
                 std::nullopt};
    if (const auto it = peerIndex_.find(who.name); it != peerIndex_.end()) who.peer = it->second;
    who.foreignId = zap_ && named != who.name;
    return who;
  }

  void receive() {
    std::vector<zmq::message_t> frames;
    for (int budget = 0; budget < 256; ++budget) {
      frames.clear();
      const auto got =
          zmq::recv_multipart(router_, std::back_inserter(frames), zmq::recv_flags::dontwait);
      if (!got) return;
      const Identity who = identify(frames);
      std::optional<std::size_t> from = who.peer;
      const bool misread = !zap_ && frames[0].size() == wire::kHeaderSize;
      if (!from && (!misread || frames.size() != 3)) {
        reject(std::nullopt, wire::Reject::NotNeighbor, "identity '" + who.name + "'");
        continue;
      }
      if (who.foreignId) {  // a key may only use its own node's id
        reject(from, wire::Reject::Sender, "routing id of another node");
        continue;
      }
      if (frames.size() != 3) {
        reject(from, wire::Reject::Frames);
        continue;
      }
      const std::span header(static_cast<const std::byte*>(frames[1].data()), frames[1].size());
      const std::span payload(static_cast<const std::byte*>(frames[2].data()), frames[2].size());
      const auto decoded = wire::decodeHeader(header);
      if (const auto* why = std::get_if<wire::Reject>(&decoded)) {
        reject(from, *why);
        continue;
      }
      if (!from) {  // a routing id that names nobody: the header's sender is all there is
        const std::uint32_t sender = std::get<wire::Header>(decoded).sender;
        if (const auto it = peerBySender_.find(sender); it != peerBySender_.end())
          from = it->second;
      }
      if (!from) {
        reject(std::nullopt, wire::Reject::NotNeighbor, "identity '" + who.name + "'");
        continue;
      }
      const wire::Header& h = std::get<wire::Header>(decoded);
      if (h.sender != *from) {
        reject(from, wire::Reject::Sender, "header claims node " + std::to_string(h.sender));
        continue;
      }
      if (const auto why = wire::validate(h, payload, expect_)) {
        reject(from, *why,
               *why == wire::Reject::Topology ? "their topology hash differs from ours" : "");
        continue;
      }
      const consensus::Receipt receipt = deliver(*from, h, payload);
      if (receipt == consensus::Receipt::Implausible) {
        reject(from, wire::Reject::Round, "round " + std::to_string(h.round));
        continue;
      }
      welcome(*from, now());
      if (h.kind == wire::Kind::Hello) onKeepAliveRound(*from, h.round);
      if (h.kind == wire::Kind::Bye) spdlog::info("{} said goodbye", topology_.node(*from).id);
    }
  }

  // A validated message to the engine, which checks its round first.
  consensus::Receipt deliver(std::size_t from, const wire::Header& h,
                             std::span<const std::byte> payload) {
    switch (h.kind) {
      case wire::Kind::Estimate: {
        const Scalar* values = reinterpret_cast<const Scalar*>(payload.data());
        if (reinterpret_cast<std::uintptr_t>(values) % alignof(Scalar) != 0) {
          aligned_.resize(static_cast<Eigen::Index>(dimension_));
          std::memcpy(aligned_.data(), payload.data(), payload.size());
          values = aligned_.data();
        }
        const consensus::Receipt receipt = engine_->onEstimate(from, h.round, values, now());
        if (receipt == consensus::Receipt::Stale) ++discarded_["stale"];
        if (receipt == consensus::Receipt::Duplicate) ++discarded_["duplicate"];
        return receipt;
      }
      case wire::Kind::Decision:
        return engine_->onDecision(from, h.round, h.flags == 1, now());
      case wire::Kind::Hello:
      case wire::Kind::Bye:
        // A keep-alive: the engine hears from the peer without an estimate.
        return engine_->onKeepAlive(from, h.round, now());
    }
    return consensus::Receipt::NotNeighbor;
  }

  void receiveEvents() {
    std::vector<zmq::message_t> frames;
    while (zmq::recv_multipart(monitor_, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
      std::uint16_t event = 0;
      if (!frames.empty() && frames[0].size() >= sizeof event)
        std::memcpy(&event, frames[0].data(), sizeof event);
      if (event == ZMQ_EVENT_DISCONNECTED) {
        ++connectionsClosed_;
      } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
        reject(std::nullopt, wire::Reject::Auth);  // the ZAP handler denied the key
      } else {
        reject(std::nullopt, wire::Reject::Handshake);
      }
      frames.clear();
    }
  }

  void handleCommands() {
    for (Command& command : board_.drain()) {
      nlohmann::json answer = {{"ok", true}};
      if (command.name == "stop") {
        stopping_ = true;
      } else if (command.name == "pause") {
        paused_ = true;
      } else if (command.name == "resume") {
        paused_ = false;
      } else if (command.name == "checkpoint") {
        if (const auto path = trySaveCheckpoint()) {
          answer["path"] = *path;
          answer["round"] = engine_->round();
        } else {
          answer = {{"ok", false}, {"error", "checkpoint failed: " + lastCheckpointError_}};
        }
      } else if (command.name == "set-policy") {
        answer = setPolicy(command.args);
      } else {
        answer = {{"ok", false}, {"error", "unknown command"}};
      }
      publishStatus();  // the answer must not race ahead of the state it describes
      if (command.reply) command.reply(answer);
    }
  }

  nlohmann::json setPolicy(const nlohmann::json& args) {
    try {
      config::NodeConfig updated =
          config::readConfig(config::toYaml(cfg_), "<running config>", setPolicyOverrides(args));
      engine_->setPolicy(config::policySpec(updated));
      cfg_.consensus = updated.consensus;
      configYaml_ = config::toYaml(cfg_);
      spdlog::info("policy changed to {} (from the next round)", cfg_.consensus.policy);
      return {{"ok", true}, {"policy", cfg_.consensus.policy}};
    } catch (const schema::InputError& e) {
      return {{"ok", false}, {"error", e.what()}};
    }
  }

  std::string saveCheckpoint() {
    Checkpoint checkpoint;
    checkpoint.round = engine_->round();
    checkpoint.topologyHash = topology_.hash();
    checkpoint.node = static_cast<std::uint32_t>(self_);
    checkpoint.dtype = dtype();
    checkpoint.dimension = dimension_;
    const auto bytesOf = [this](const Vector& v) {
      const auto* bytes = reinterpret_cast<const std::byte*>(v.data());
      return std::vector<std::byte>(bytes, bytes + dimension_ * sizeof(Scalar));
    };
    checkpoint.params = bytesOf(engine_->params());
    if (cfg_.train.momentum > 0) checkpoint.velocity = bytesOf(engine_->velocity());
    std::string path = checkpoints_.save(checkpoint);
    lastCheckpoint_ = checkpoint.round;
    spdlog::info("checkpoint {} (round {})", path, checkpoint.round);
    return path;
  }

  // A checkpoint that cannot be written (full disk, I/O error, no file
  // descriptors) costs that checkpoint only: logged, counted, shown in
  // status and metrics; training goes on and older generations stay.
  std::optional<std::string> trySaveCheckpoint() {
    try {
      return saveCheckpoint();
    } catch (const std::exception& e) {
      ++checkpointFailures_;
      if (lastCheckpointError_ != e.what())
        spdlog::error("checkpoint at round {} failed: {}", engine_->round(), e.what());
      lastCheckpointError_ = e.what();
      return std::nullopt;
    }
  }

  void onRecord(const consensus::RoundRecord& record) {
    ++finishedRounds_;
    lossEwma_ = finishedRounds_ == 1 ? record.loss : lossEwma_ + 0.05 * (record.loss - lossEwma_);
    lastRecord_ = record;
    nlohmann::json line = {
        {"t", std::chrono::duration<double>(record.end).count()},
        {"round", record.round},
        {"next", record.nextRound},
        {"loss", record.loss},
        {"target", record.target},
        {"responders", record.responders.size()},
        {"live", record.live},
        {"duration_ms",
         std::chrono::duration<double, std::milli>(record.end - record.start).count()},
        {"compute_ms", std::chrono::duration<double, std::milli>(record.compute).count()},
        {"blocked_ms", std::chrono::duration<double, std::milli>(record.blocked).count()},
        {"distance", record.consensusDistance},
        {"skipped", record.skipped}};
    if (pendingEvaluation_ && pendingEvaluation_->first == record.round) {
      accuracy_ = pendingEvaluation_->second.accuracy;
      testLoss_ = pendingEvaluation_->second.loss;
      line["accuracy"] = accuracy_;
      line["test_loss"] = testLoss_;
      pendingEvaluation_.reset();
    }
    if (metrics_) *metrics_ << line.dump() << '\n';
    history_.push_back(std::move(line));
    while (history_.size() > kHistory) history_.pop_front();
    // Rounds per second over the history window (skips count as rounds).
    const double span = history_.back()["t"].get<double>() - history_.front()["t"].get<double>();
    const auto rounds =
        history_.back()["next"].get<std::int64_t>() - history_.front()["next"].get<std::int64_t>();
    rate_ = span > 0 ? static_cast<double>(rounds) / span : 0.0;

    const std::int64_t every = cfg_.checkpoint.everyRounds;
    if (every > 0 && record.nextRound / every != record.round / every) trySaveCheckpoint();
    if (cfg_.train.rounds > 0 && engine_->round() >= cfg_.train.rounds) {
      spdlog::info("reached train.rounds = {}", cfg_.train.rounds);
      stopping_ = true;
    }
    if (cfg_.train.untilAccuracy > 0 && accuracy_ >= cfg_.train.untilAccuracy) {
      spdlog::info("reached train.until_accuracy = {}", cfg_.train.untilAccuracy);
      stopping_ = true;
    }
  }

  void publishStatus() {
    auto status = std::make_shared<StatusSnapshot>();
    const Time t = now();
    statusRefresh_ = t + kStatusRefresh;
    status->node = cfg_.node.id;
    status->version = kVersion;
    status->round = engine_->round();
    status->phase = paused_                                                           ? "paused"
                    : engine_->phase() == consensus::RoundEngine<Scalar>::Phase::Idle ? "idle"
                                                                                      : "waiting";
    status->policy = cfg_.consensus.policy;
    status->target = engine_->decision().count;
    status->degree = engine_->degree();
    status->responders = lastRecord_ ? lastRecord_->responders.size() : 0;
    status->loss = lossEwma_;
    status->accuracy = accuracy_;
    status->testLoss = testLoss_;
    status->consensusDistance = lastRecord_ ? lastRecord_->consensusDistance : 0;
    status->uptimeS = std::chrono::duration<double>(Clock::now() - started_).count();
    status->roundsPerSecond = rate_;
    status->lastCheckpointRound = lastCheckpoint_;
    status->paused = paused_;
    for (std::size_t s = 0; s < engine_->degree(); ++s) {
      NeighborStatus n;
      const std::size_t node = engine_->nodeOfSlot(s);
      n.id = topology_.node(node).id;
      const bool suspect = engine_->suspect(s, t);
      status->suspects += suspect ? 1 : 0;
      n.lastRound = engine_->newestRound(s);
      n.state = suspect ? "suspect" : n.lastRound >= engine_->round() - 1 ? "fresh" : "late";
      const auto ms = [](Duration d) {
        return std::chrono::duration<double, std::milli>(d).count();
      };
      n.medianArrivalMs = ms(engine_->arrivals().offsetQuantile(s, 0.5));
      n.p90ArrivalMs = ms(engine_->arrivals().offsetQuantile(s, 0.9));
      const auto& c = engine_->counters(s);
      n.onTime = c.onTime;
      n.late = c.late;
      n.stale = c.stale;
      n.duplicate = c.duplicate;
      n.mixed = c.mixed;
      n.rejected = peerRejects_[node];
      status->neighbors.push_back(n);
    }
    status->rejects = rejects_;
    status->checkpointFailures = checkpointFailures_;
    status->lastCheckpointError = lastCheckpointError_;
    status->acceptFailures = board_.acceptFailures();
    status->classHistogram = histogram_;
    status->discarded = discarded_;
    status->sends = sends_;
    status->connectionsClosed = connectionsClosed_;
    status->history = history_;
    status->configYaml = configYaml_;
    board_.publish(std::move(status));
  }

  void loop() {
    if (!cfg_.log.metricsFile.empty()) {
      metrics_ = std::make_unique<std::ofstream>(cfg_.log.metricsFile, std::ios::app);
    }
    const Duration helloEvery = std::chrono::duration_cast<Duration>(peerTimeout_ / 3);
    const Duration progressEvery = std::chrono::duration_cast<Duration>(
        std::chrono::duration<double>(cfg_.log.progressEveryS));
    Time nextHello{};
    Time nextProgress = now() + progressEvery;
    publishStatus();

    while (!stopping_) {
      service_.feedWatchdog(Clock::now());  // a hung loop stops feeding: systemd restarts us
      Time t = now();
      sendDue(t);
      if (t >= nextHello) {
        sendControl(wire::Kind::Hello, engine_->round());
        nextHello = t + helloEvery;
      }
      if (auto result = worker_->take()) {
        engine_->onGradient(result->round, result->gradient, result->loss, result->stats, t);
        if (result->evaluation) pendingEvaluation_ = {result->round, *result->evaluation};
      }
      handleCommands();
      if (stopping_) break;
      const auto record = engine_->tryFinish(t);
      for (const consensus::Decision& d : engine_->takeDecisions()) {  // symmetric mixing
        sendControl(wire::Kind::Decision, d.round, d.used ? 1 : 0, d.node);
      }
      if (record) {
        onRecord(*record);
        if (t >= nextStatus_) {
          publishStatus();
          nextStatus_ = t + kStatusEvery;
        }
        continue;
      }
      if (!paused_) {
        if (auto start = engine_->tryStart(t)) {
          publish(start->round, *start->params);
          const std::int64_t every = cfg_.train.evalEveryRounds;
          worker_->submit(start->round, *start->params, every > 0 && start->round % every == 0);
        }
      }
      if (t >= nextProgress) {
        spdlog::info("round {}  loss {:.4f}  test acc {}  m {}/{}  {:.1f} rounds/s",
                     engine_->round(), lossEwma_,
                     accuracy_ < 0 ? std::string("-") : fmt::format("{:.4f}", accuracy_),
                     engine_->decision().count, engine_->degree(), rate_);
        nextProgress = t + progressEvery;
        service_.status(fmt::format("round {}, loss {:.4f}, {:.1f} rounds/s", engine_->round(),
                                    lossEwma_, rate_));
        publishStatus();
      }
      if (t >= statusRefresh_) publishStatus();  // counters move while no round completes
      if (cfg_.train.maxTimeS > 0 &&
          std::chrono::duration<double>(Clock::now() - started_).count() >= cfg_.train.maxTimeS) {
        spdlog::info("reached train.max_time_s = {}", cfg_.train.maxTimeS);
        break;
      }

      Time wake = std::min({nextHello, nextProgress, statusRefresh_});
      if (auto next = engine_->nextWakeup(t)) wake = std::min(wake, *next);
      if (!delayed_.empty()) wake = std::min(wake, delayed_.front().due);
      if (service_.nextFeed() != Clock::time_point::max())
        wake = std::min(wake, std::chrono::duration_cast<Time>(service_.nextFeed() - started_));
      const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
          wake - now() + std::chrono::microseconds(999));
      // Links with something waiting are polled for room in their queue
      // (both vectors are members: no allocation per loop).
      auto& items = pollItems_;
      auto& waiting = waitingLinks_;
      items = {{router_.handle(), 0, ZMQ_POLLIN, 0},
               {nullptr, worker_->readyFd(), ZMQ_POLLIN, 0},
               {nullptr, signalFd_, ZMQ_POLLIN, 0},
               {nullptr, wakeFd_, ZMQ_POLLIN, 0},
               {monitor_.handle(), 0, ZMQ_POLLIN, 0},
               {zap_ ? zap_->socket().handle() : nullptr, -1,
                static_cast<short>(zap_ ? ZMQ_POLLIN : 0), 0}};
      waiting.clear();
      for (auto& [node, link] : links_) {
        if (!link.estimate && link.controls.empty()) continue;
        items.push_back({link.dealer.handle(), 0, ZMQ_POLLOUT, 0});
        waiting.push_back(&link);
      }
      zmq::poll(items, std::max(timeout, std::chrono::milliseconds(0)));
      if (items[0].revents & ZMQ_POLLIN) receive();
      if (items[4].revents & ZMQ_POLLIN) receiveEvents();
      if (items[5].revents & ZMQ_POLLIN) zap_->answer();
      for (std::size_t w = 0; w < waiting.size(); ++w) {
        if (items[6 + w].revents & ZMQ_POLLOUT) flush(*waiting[w]);
      }
      if (items[2].revents & ZMQ_POLLIN) {
        signalfd_siginfo info{};
        [[maybe_unused]] const ssize_t n = ::read(signalFd_, &info, sizeof info);
        spdlog::info("{}: stopping", info.ssi_signo == SIGINT ? "SIGINT" : "SIGTERM");
        stopping_ = true;
      }
      if (items[3].revents & ZMQ_POLLIN) drainFd(wakeFd_);
    }
  }

  void shutdown() {
    service_.stopping();
    trySaveCheckpoint();
    sendControl(wire::Kind::Bye);
    // A model of our own: the compute thread may still be busy with its.
    if (cfg_.model.kind != "none") {
      data::Model<Scalar> model(config::modelOptions(cfg_, data_.train));
      const data::Evaluation final = model.evaluate(engine_->params(), data_.test);
      accuracy_ = final.accuracy;
      testLoss_ = final.loss;
    }
    const nlohmann::json summary = {{"final", true},
                                    {"round", engine_->round()},
                                    {"t", std::chrono::duration<double>(now()).count()},
                                    {"accuracy", accuracy_},
                                    {"test_loss", testLoss_},
                                    {"rejects", rejects_},
                                    {"discarded", discarded_},
                                    {"checkpoint_failures", checkpointFailures_},
                                    {"sends", sends_}};
    if (metrics_) *metrics_ << summary.dump() << '\n';
    publishStatus();
    worker_.reset();
    links_.clear();
    zmq_socket_monitor(router_.handle(), nullptr, 0);
    monitor_.close();
    router_.close();
    zap_.reset();
    spdlog::info("stopped at round {}: test accuracy {:.4f}, rejects {}", engine_->round(),
                 accuracy_, nlohmann::json(rejects_).dump());
  }

  const config::LoadedConfig& loaded_;
  config::NodeConfig cfg_;
  const topology::Topology& topology_;
  std::size_t self_;
  StatusBoard& board_;
  int signalFd_;
  int wakeFd_;
  Clock::time_point started_;
  CheckpointStore checkpoints_;
  ServiceNotifier service_;

  data::TrainTest data_;
  std::vector<std::size_t> histogram_;
  std::unique_ptr<ComputeWorker<Scalar>> worker_;
  std::size_t dimension_ = 0;
  wire::Expectation expect_{};
  std::unique_ptr<consensus::RoundEngine<Scalar>> engine_;

  zmq::context_t context_{1};
  zmq::socket_t router_;
  zmq::socket_t monitor_;                   // the router's connection events
  std::unique_ptr<curve::ZapHandler> zap_;  // with security.curve
  std::map<std::size_t, Link> links_;
  std::vector<zmq::pollitem_t> pollItems_;
  std::vector<Link*> waitingLinks_;
  std::map<std::size_t, std::int64_t> helloRounds_;  // last keep-alive round per neighbour
  std::map<std::string, std::size_t> peerIndex_;
  std::map<std::uint32_t, std::size_t> peerBySender_;  // header sender -> in-neighbour
  std::map<std::size_t, Time> lastHeard_;
  // Derived once from the config, not per message or per round.
  Duration peerTimeout_ = config::engineOptions(cfg_).peerTimeout;
  std::string configYaml_ = config::toYaml(cfg_);
  Time nextStatus_{};     // snapshots after rounds: at most every kStatusEvery
  Time statusRefresh_{};  // and at least every kStatusRefresh
  Duration linkDelay_ = std::chrono::duration_cast<Duration>(
      std::chrono::duration<double, std::milli>(cfg_.straggler.linkDelayMs));
  std::deque<Outgoing> delayed_;      // estimates held back by link_delay_ms, oldest first
  std::optional<Outgoing> lastSent_;  // re-sent to a neighbour that comes back
  Vector aligned_;

  std::map<std::string, std::uint64_t> rejects_;
  std::map<std::size_t, std::uint64_t> peerRejects_;
  std::set<std::string> loggedRejects_;
  std::map<std::string, std::uint64_t>
      discarded_;                               // well-formed estimates not kept: stale, duplicate
  std::map<std::string, std::uint64_t> sends_;  // deferred (no room yet), superseded, dropped
  std::uint64_t connectionsClosed_ = 0;
  bool stopping_ = false;
  bool paused_ = false;
  std::optional<std::pair<std::int64_t, data::Evaluation>> pendingEvaluation_;
  std::optional<consensus::RoundRecord> lastRecord_;
  std::int64_t finishedRounds_ = 0;
  double lossEwma_ = 0;
  double accuracy_ = -1;
  double testLoss_ = -1;
  double rate_ = 0;
  std::int64_t lastCheckpoint_ = -1;
  std::uint64_t checkpointFailures_ = 0;
  std::string lastCheckpointError_;
  std::deque<nlohmann::json> history_;
  std::unique_ptr<std::ofstream> metrics_;
};

}  // namespace

int runNode(const config::LoadedConfig& loaded, StatusBoard& board, int signalFd, int wakeFd) {
  if (loaded.config.model.dtype == "float64")
    return Runner<double>(loaded, board, signalFd, wakeFd).run();
  return Runner<float>(loaded, board, signalFd, wakeFd).run();
}

}  // namespace consensusd::daemon
