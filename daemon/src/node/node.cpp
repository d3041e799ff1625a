#include "node/node.hpp"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cstring>
#include <set>
#include <zmq.hpp>

#include "consensusd/config/params.hpp"
#include "consensusd/consensus/driver.hpp"
#include "consensusd/daemon/status_server.hpp"
#include "consensusd/daemon/wire.hpp"
#include "consensusd/data/partition.hpp"
#include "consensusd/schema/yaml_tree.hpp"
#include "consensusd/version.hpp"
#include "durability/checkpoint_requests.hpp"
#include "network/link_watch.hpp"
#include "network/transport.hpp"
#include "node/deliver.hpp"
#include "node/graph_change.hpp"
#include "node/part_options.hpp"
#include "node/status_snapshot.hpp"
#include "node/trainer_start.hpp"
#include "os/event_fd.hpp"
#include "os/resident.hpp"
#include "os/service_notify.hpp"
#include "status/telemetry.hpp"
#include "trainer/compute_worker.hpp"
#include "trainer/trainer_endpoint.hpp"
#include "trainer/trainer_feed.hpp"

namespace consensusd::daemon {
namespace {

using consensus::Duration;
using consensus::Time;
using Clock = std::chrono::steady_clock;

// A snapshot copies the history: after rounds (1000/s here), publish at most this often.
constexpr auto kStatusEvery = std::chrono::milliseconds(50);
// Without rounds (a stalled or paused node), rejects and suspects still show within this.
constexpr auto kStatusRefresh = std::chrono::seconds(1);

template <class Scalar>
class Node {
 public:
  using Vector = Eigen::Matrix<Scalar, Eigen::Dynamic, 1>;
  using Engine = consensus::RoundEngine<Scalar>;

  // `trainer`: an endpoint that already learned the node's shape from its
  // first trainer (model.dimension/dtype: auto); else made here if external.
  Node(const config::LoadedConfig& loaded, StatusBoard& board, int signalFd, int wakeFd,
       ServiceNotifier& service, std::unique_ptr<TrainerEndpoint> trainer)
      : loaded_(loaded),
        cfg_(loaded.config),
        board_(board),
        signalFd_(signalFd),
        wakeFd_(wakeFd),
        started_(Clock::now()),
        service_(service),
        trainer_(std::move(trainer)),
        graphs_(cfg_, loaded.topology, loaded.nodeIndex),
        telemetry_(cfg_.log.metricsFile) {}

  int run() {
    loadData();
    transport_.emplace(
        graphs_.graph(), graphs_.self(),
        transportOptions(loaded_, graphs_.graph(), graphs_.self(), dimension_, dtype()));
    linkWatch_.emplace(dimension_ * sizeof(Scalar));
    if (config::isExternal(cfg_) && !trainer_)
      trainer_ = std::make_unique<TrainerEndpoint>(trainerOptions(cfg_, loaded_));
    resume();
    if (trainer_) trainer_->welcomeHeld();  // resumed: a held first trainer learns fresh or not
    service_.ready();  // systemd (Type=notify): started once the ports are bound
    spdlog::info(
        "node {} of {} ({} nodes, degree {}), {} parameters ({}), policy {}, starting at round {}",
        cfg_.node.id, graphs_.graph().name(), graphs_.graph().size(),
        graphs_.graph().inNeighbors(graphs_.self()).size(), dimension_, cfg_.model.dtype,
        cfg_.consensus.policy, engine_->round());
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
  Time now() const { return std::chrono::duration_cast<Time>(Clock::now() - started_); }

  static wire::Dtype dtype() {
    return sizeof(Scalar) == 8 ? wire::Dtype::Float64 : wire::Dtype::Float32;
  }
  static std::span<const std::byte> bytesOf(const Vector& v) {
    return {reinterpret_cast<const std::byte*>(v.data()),
            static_cast<std::size_t>(v.size()) * sizeof(Scalar)};
  }

  void loadData() {
    if (config::isExternal(cfg_)) {  // the trainer brings its data and model
      dimension_ = static_cast<std::size_t>(cfg_.model.dimension);
      return;
    }
    data_ = data::load(config::dataSource(cfg_));
    const auto parts =
        data::partition(data_.train, config::partitionOptions(cfg_, graphs_.graph().size()));
    data::Dataset share = data::subset(data_.train, parts[graphs_.self()]);
    histogram_ = data::classHistogram(data_.train, parts[graphs_.self()]);
    spdlog::info("{}; this node holds {} training samples", data_.description, share.size());
    worker_ = std::make_unique<ComputeWorker<Scalar>>(
        data_, std::move(share),
        config::hasModel(cfg_) ? std::optional(config::modelOptions(cfg_, data_.train))
                               : std::nullopt,
        static_cast<std::size_t>(cfg_.model.dimension),
        static_cast<std::size_t>(cfg_.train.batchSize),
        static_cast<std::uint64_t>(cfg_.data.seed) * 7919u + graphs_.self(),
        config::stragglerSpec(cfg_));
    dimension_ = worker_->dimension();
  }

  void resume() {
    Checkpoint identity;
    identity.topologyHash = graphs_.graph().hash();
    identity.nodeId = cfg_.node.id;
    identity.node = static_cast<std::uint32_t>(graphs_.self());
    identity.dtype = dtype();
    identity.dimension = dimension_;
    checkpoints_.emplace(cfg_.checkpoint.dir, static_cast<std::size_t>(cfg_.checkpoint.keep),
                         identity, wakeFd_);
    saves_.emplace(
        *checkpoints_, [this] { return checkpointState(); }, [this] { publishStatus(); });
    Vector params = worker_
                        ? worker_->initialParams(static_cast<std::uint64_t>(cfg_.model.initSeed))
                        : Vector::Zero(static_cast<Eigen::Index>(dimension_));
    std::int64_t firstRound = 0;
    Vector velocity;
    if (const std::optional<Checkpoint> checkpoint = checkpoints_->resume()) {
      std::memcpy(params.data(), checkpoint->params.data(), checkpoint->params.size());
      if (!checkpoint->velocity.empty()) {
        velocity.resize(params.size());
        std::memcpy(velocity.data(), checkpoint->velocity.data(), checkpoint->velocity.size());
      }
      firstRound = checkpoint->round;
    } else if (trainer_) {
      trainer_->expectInitialParams();  // a fresh start takes the trainer's initialisation
      awaitingTrainerInit_ = true;
    }
    engine_ = std::make_unique<consensus::RoundEngine<Scalar>>(
        graphs_.graph(), graphs_.self(), engineOptions_, config::schedule(cfg_),
        cfg_.train.momentum, std::move(params), now(), firstRound);
    for (const std::span<Scalar> buffer : engine_->modelBuffers())
      makeResident(std::as_writable_bytes(buffer));
    if (velocity.size() > 0 && engine_->keepsVelocity()) engine_->restoreVelocity(velocity);
    if (worker_)
      worker_->recycle(engine_->takeSpentUpdate());  // its zeros: the one gradient buffer
  }

  void receive() {
    for (int budget = 0; budget < 256; ++budget) {
      auto received = transport_->receive(now());
      if (!received) return;
      if (auto* message = std::get_if<Inbound>(&*received))
        transport_->settle(*message, deliver(*engine_, *message, aligned_, now()), now());
    }
  }

  // x_k is held, not copied: the engine mixes into a fresh buffer meanwhile.
  CheckpointWriter::State checkpointState() const {
    std::shared_ptr<const Vector> params = engine_->sharedParams();
    return {engine_->round(), graphs_.graph().hash(), params, bytesOf(*params),
            engine_->keepsVelocity() ? bytesOf(engine_->velocity()) : std::span<const std::byte>()};
  }

  void handleCommands() {
    for (Command& command : board_.drain()) {
      nlohmann::json answer = {{"ok", true}};
      if (command.name == "checkpoint") {  // answered when written
        saves_->want(std::move(command.reply));
        continue;
      }
      if (command.name == "apply") {  // answered once switched to, between rounds
        const auto text = command.args.find("topology");
        const auto file = command.args.find("file");
        if (text != command.args.end() && text->is_string() && file != command.args.end() &&
            file->is_string()) {
          graphs_.want(cfg_, text->get<std::string>(), file->get<std::string>(),
                       std::move(command.reply));
          continue;
        }
        answer = {{"ok", false},
                  {"error", "apply needs \"topology\" (the file's text) and \"file\""}};
      } else if (command.name == "stop") {
        stop("stop");
      } else if (command.name == "pause") {
        paused_ = true;
      } else if (command.name == "resume") {
        paused_ = false;
      } else if (command.name == "set-policy") {
        answer = setPolicy(command.args);
      } else {
        answer = {{"ok", false}, {"error", "unknown command"}};
      }
      publishStatus();  // the answer must not race ahead of the state it describes
      if (command.reply) command.reply(answer);
    }
  }

  // A held graph (graphs_), between rounds: the engine's slots and the transport's links follow.
  void switchTopology() {
    const std::optional<GraphChange::Next> next = graphs_.next();
    if (!next || engine_->phase() != Engine::Phase::Idle) return;
    engine_->setTopology(*next->graph, next->self, now());
    transport_->setTopology(*next->graph, next->self);  // it keeps its own copy of the graph left
    linkWatch_->clear();
    GraphChange::Switched done = graphs_.switched(engine_->round(), engine_->degree());
    publishStatus();  // the answer must not race ahead of the state it describes
    if (done.reply) done.reply(done.answer);
  }

  nlohmann::json setPolicy(const nlohmann::json& args) {
    try {
      const config::NodeConfig updated = config::reconfigure(
          cfg_, setPolicyOverrides(args), graphs_.graph().inNeighbors(graphs_.self()).size());
      engine_->setPolicy(config::policySpec(updated));
      cfg_.consensus = updated.consensus;
      configYaml_ = config::toYaml(cfg_);
      spdlog::info("policy changed to {} (from the next round)", cfg_.consensus.policy);
      return {{"ok", true}, {"policy", cfg_.consensus.policy}};
    } catch (const schema::InputError& e) {
      return {{"ok", false}, {"error", e.what()}};
    }
  }

  // consensus::step calls these: this node's side of a step.
 public:
  void decided(const consensus::Decision& d) {  // symmetric mixing
    transport_->sendControl(wire::Kind::Decision, d.round, d.used ? 1 : 0, d.node, now());
  }
  void finished(const consensus::RoundRecord& record) {
    finishedRound_ = true;
    if (record.adopted) {
      joinedAtRound_ = record.nextRound;
      std::string from;
      for (const std::size_t node : record.responders)
        from += (from.empty() ? "" : ", ") + graphs_.graph().node(node).id;
      spdlog::info("joined a running cluster at round {}: took the estimates of {} in place of x_0",
                   record.nextRound, from);
    }
    for (std::size_t s = 0; s < engine_->degree(); ++s) {
      const std::size_t node = engine_->nodeOfSlot(s);
      linkWatch_->observe(node, graphs_.graph().node(node).id, transport_->inflow(node),
                          record.end - record.start);
    }
    if (engine_->joining() && record.live == 0 && !saidAlone_ && engine_->degree() > 0 &&
        now() >= engineOptions_.peerTimeout) {
      saidAlone_ = true;  // a joiner with no neighbour to take the state from
      spdlog::warn(
          "no neighbour answers (all {} silent or gone): training from x_0 on its own until one "
          "does; it then takes its neighbours' state if they are ahead",
          engine_->degree());
    }
    // One gradient buffer: back to the compute thread for the next round.
    if (worker_) worker_->recycle(engine_->takeSpentUpdate());
    telemetry_.onRecord(
        record, {transport_->counters().bytesSent, bytesReceived(*engine_, *transport_), samples_});
    const std::int64_t every = cfg_.checkpoint.everyRounds;
    if (every > 0 && record.nextRound / every != record.round / every) saves_->want();
    if (cfg_.train.rounds > 0 && engine_->round() >= cfg_.train.rounds) {
      spdlog::info("reached train.rounds = {}", cfg_.train.rounds);
      stop("rounds");
    }
    if (cfg_.train.untilAccuracy > 0 && telemetry_.accuracy() >= cfg_.train.untilAccuracy) {
      spdlog::info("reached train.until_accuracy = {}", cfg_.train.untilAccuracy);
      stop("accuracy");
    }
  }
  // Why training ends, for the trainer (the first reason given stands).
  void stop(const char* reason) {
    if (!stopping_) endReason_ = reason;
    stopping_ = true;
  }
  // Our trainer went away (model.kind: external): nothing is computed until
  // one attaches again, so the neighbours stop waiting for us. Before the
  // first one (a cluster starting, trainers coming up) they wait as ever.
  bool idle() const { return trainer_ && trainerSeen_ && !trainer_->attached(); }
  // A checkpoint wanted while the writer is still busy with the last one
  // holds the next round, so that it saves the round it was wanted at (the
  // engine thread keeps serving meanwhile).
  bool mayStart() const {
    return !paused_ && !stopping_ && !awaitingTrainerInit_ && !saves_->wanted() && !graphs_.held();
  }
  // The estimate is the engine's own buffer, shared (not copied) by every
  // send, which only reads it.
  void published(const Engine::Publication& estimate) {
    // Compressed: the frame, or the copy whole to a neighbour out of step.
    if (estimate.publicCopy) {
      std::optional<CompressedFrame> frame;
      if (estimate.frame) frame = CompressedFrame{estimate.base, estimate.frame, *estimate.frame};
      transport_->publishCompressed(estimate.round, estimate.publicCopy,
                                    bytesOf(*estimate.publicCopy), std::move(frame), now());
    } else {
      transport_->publish(estimate.round, estimate.params, bytesOf(*estimate.params), now());
    }
  }
  // x_k to the trainer, or to the compute job (which only reads it).
  void started(Engine::Start start) {
    if (trainer_) {
      trainer_->publish(start.round, bytesOf(*start.params));
      return;
    }
    const std::int64_t every = cfg_.train.evalEveryRounds;
    worker_->submit(start.round, std::move(start.params), every > 0 && start.round % every == 0);
  }

 private:
  void publishStatus() {
    auto status = std::make_shared<StatusSnapshot>();
    const Time t = now();
    statusRefresh_ = t + kStatusRefresh;
    status->node = cfg_.node.id;
    status->version = kVersion;
    status->round = engine_->round();
    const bool engineIdle = engine_->phase() == consensus::RoundEngine<Scalar>::Phase::Idle;
    status->phase = paused_                          ? "paused"
                    : engineIdle && saves_->wanted() ? "checkpointing"  // held for the writer
                    : engineIdle && graphs_.held()   ? "applying"       // a new graph, next
                    : engineIdle                     ? "idle"
                                                     : "waiting";
    status->policy = cfg_.consensus.policy;
    status->target = engine_->decision().count;
    status->degree = engine_->degree();
    status->uptimeS = std::chrono::duration<double>(Clock::now() - started_).count();
    status->paused = paused_;
    telemetry_.fill(*status, now());
    checkpoints_->fill(*status);
    status->joinedAtRound = joinedAtRound_;
    status->topology = graphs_.file();
    status->topologyHash = GraphChange::hashText(graphs_.graph());
    status->topologyChanges = graphs_.changes();
    fillNeighborsAndTraffic(*status, *engine_, *transport_, graphs_.graph(), t);
    status->samples = samples_;
    if (trainer_) status->trainer = trainer_->status();
    status->acceptFailures = board_.acceptFailures();
    status->classHistogram = histogram_;
    status->configYaml = configYaml_;
    board_.publish(std::move(status));
  }

  void loop() {
    const Duration helloEvery =
        std::chrono::duration_cast<Duration>(engineOptions_.peerTimeout / 3);
    const Duration progressEvery = std::chrono::duration_cast<Duration>(
        std::chrono::duration<double>(cfg_.log.progressEveryS));
    Time nextHello{};
    Time nextProgress = now() + progressEvery;
    publishStatus();

    while (!stopping_) {
      service_.feedWatchdog(Clock::now());  // a hung loop stops feeding: systemd restarts us
      const Time t = now();
      transport_->sendDue(t);
      if (t >= nextHello || idle() != saidIdle_) {  // neighbours learn of a lost trainer at once
        saidIdle_ = idle();
        transport_->keepAlive(engine_->round(), t, saidIdle_);
        nextHello = t + helloEvery;
      }
      if (auto result = worker_ ? worker_->take() : std::nullopt) {
        engine_->swapGradient(result->round, result->gradient, result->loss, result->stats, t);
        if (config::hasModel(cfg_)) samples_ += static_cast<std::uint64_t>(cfg_.train.batchSize);
        worker_->recycle(std::move(result->gradient));  // what the engine held: often none
        if (result->evaluation) telemetry_.onEvaluation(result->round, *result->evaluation);
      }
      counted(feed_.takeDue(*engine_, t));
      handleCommands();
      saves_->serve();
      switchTopology();
      graphs_.reloadWatched(cfg_);
      if (stopping_) break;
      finishedRound_ = false;
      const std::optional<Time> engineWake = consensus::step(*engine_, t, *this);
      transport_->offerBuffers(t);  // a round may have let go of estimates
      if (stopping_) break;         // a stop condition came with the round
      if (finishedRound_ && t >= nextStatus_) {
        publishStatus();
        nextStatus_ = t + kStatusEvery;
      }
      if (t >= nextProgress) {
        const double accuracy = telemetry_.accuracy();
        spdlog::info("round {}  loss {:.4f}  test acc {}  m {}/{}  {:.1f} rounds/s",
                     engine_->round(), telemetry_.loss(),
                     accuracy < 0 ? std::string("-") : fmt::format("{:.4f}", accuracy),
                     engine_->decision().count, engine_->degree(), telemetry_.roundsPerSecond(t));
        nextProgress = t + progressEvery;
        service_.status(fmt::format("round {}, loss {:.4f}, {:.1f} rounds/s", engine_->round(),
                                    telemetry_.loss(), telemetry_.roundsPerSecond(t)));
        publishStatus();
      }
      if (t >= statusRefresh_) publishStatus();  // counters move while no round completes
      if (cfg_.train.maxTimeS > 0 &&
          std::chrono::duration<double>(Clock::now() - started_).count() >= cfg_.train.maxTimeS) {
        spdlog::info("reached train.max_time_s = {}", cfg_.train.maxTimeS);
        stop("time");
        break;
      }
      Time wake = std::min({nextHello, nextProgress, statusRefresh_});
      if (engineWake) wake = std::min(wake, *engineWake);
      if (const auto due = feed_.due()) wake = std::min(wake, *due);
      waitForEvents(wake);
    }
  }

  // Sleeps in poll until a socket, the compute thread, a signal or a
  // command needs us, or until `wake`.
  void waitForEvents(Time wake) {
    if (auto due = transport_->nextDue()) wake = std::min(wake, *due);
    if (service_.nextFeed() != Clock::time_point::max())
      wake = std::min(wake, std::chrono::duration_cast<Time>(service_.nextFeed() - started_));
    const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
        wake - now() + std::chrono::microseconds(999));
    auto& items = pollItems_;  // a member: no allocation per loop
    items = {{nullptr, worker_ ? worker_->readyFd() : -1, ZMQ_POLLIN, 0},
             {nullptr, signalFd_, ZMQ_POLLIN, 0},
             {nullptr, wakeFd_, ZMQ_POLLIN, 0},
             {nullptr, graphs_.watchFd(), ZMQ_POLLIN, 0}};
    if (trainer_) trainer_->append(items);  // items 4 and 5
    const std::size_t transportAt = items.size();
    transport_->append(items);
    zmq::poll(items, std::max(timeout, std::chrono::milliseconds(0)));
    if (trainer_) serveTrainer(std::span(items).subspan(4, 2));
    if (transport_->serve(std::span(items).subspan(transportAt), now())) receive();
    if (items[1].revents & ZMQ_POLLIN) {
      const std::uint32_t signal = readSignal(signalFd_);
      if (signal == SIGHUP) {
        graphs_.reload(cfg_, true);
      } else if (signal != 0) {
        spdlog::info("{}: stopping", signal == SIGINT ? "SIGINT" : "SIGTERM");
        stop("signal");
      }
    }
    if (items[2].revents & ZMQ_POLLIN) drainFd(wakeFd_);
    if (items[3].revents & ZMQ_POLLIN) graphs_.noteWatch();
  }

  // The trainer's initialisation (fresh start) and its updates, to the engine.
  void serveTrainer(std::span<const zmq::pollitem_t> items) {
    const std::optional<TrainerUpdate> update = trainer_->serve(items);
    trainerSeen_ = trainerSeen_ || trainer_->attached();
    if (auto initial = trainer_->takeInitialParams()) {
      engine_->resetParams(Eigen::Map<const Vector>(
          reinterpret_cast<const Scalar*>(initial->data()), static_cast<Eigen::Index>(dimension_)));
      awaitingTrainerInit_ = false;
      spdlog::info("initial parameters from the trainer");
    }
    if (update) counted(feed_.take(*update, *engine_, now()));
  }
  // What the node counts of an update the engine took.
  void counted(const std::optional<FedUpdate>& fed) {
    if (!fed) return;
    samples_ += fed->samples.value_or(static_cast<std::uint64_t>(cfg_.train.batchSize));
    if (fed->accuracy || fed->testLoss)
      telemetry_.onEvaluation(fed->round, {fed->testLoss.value_or(telemetry_.testLoss()),
                                           fed->accuracy.value_or(telemetry_.accuracy())});
  }

  // An estimate in chunks still on its way (the neighbour's round may wait
  // for it) goes out in full while it moves: the wait ends when nothing
  // could be sent for `patience`, or on a second SIGTERM. True if all went.
  bool finishSends(Duration patience) {
    std::uint64_t sent = transport_->counters().bytesSent + transport_->unsent();
    Time until = now() + patience;
    while (transport_->sending() && now() < until) {
      auto& items = pollItems_;
      items = {{nullptr, signalFd_, ZMQ_POLLIN, 0}};
      transport_->append(items);
      zmq::poll(items, std::chrono::milliseconds(50));
      if ((items[0].revents & ZMQ_POLLIN) && readSignal(signalFd_) != SIGHUP) return false;
      if (transport_->serve(std::span(items).subspan(1), now())) receive();
      transport_->offerBuffers(now());
      const std::uint64_t progress = transport_->counters().bytesSent + transport_->unsent();
      if (progress != sent) {  // more handed to ZeroMQ, or written by it
        sent = progress;
        until = now() + patience;
      }
    }
    return !transport_->sending();
  }

  static constexpr Duration kGoodbyeGrace = std::chrono::milliseconds(200);
  void shutdown() {
    service_.stopping();
    // Before the checkpoint: writing a large model takes seconds.
    const bool flowing = finishSends(engineOptions_.peerTimeout);
    // After our last chunk (a BYE in the middle of an estimate truncates it),
    // before the checkpoint: the neighbours stop waiting for us at once.
    transport_->sendControl(wire::Kind::Bye, engine_->round(), 0, std::nullopt, now());
    // The goodbye too (a full queue would keep it here); if something could
    // not go for a peer timeout already (a neighbour gone), briefly: the
    // live neighbours' sockets take theirs at once.
    finishSends(flowing ? engineOptions_.peerTimeout : kGoodbyeGrace);
    saves_->finish(engine_->round());
    // A model of our own: the compute thread may still be busy with its.
    if (config::hasModel(cfg_)) {
      data::Model<Scalar> model(config::modelOptions(cfg_, data_.train));
      telemetry_.setFinal(model.evaluate(engine_->params(), data_.test));
    }
    const TrafficCounters& traffic = transport_->counters();
    telemetry_.writeSummary({{"final", true},
                             {"round", engine_->round()},
                             {"t", std::chrono::duration<double>(now()).count()},
                             {"accuracy", telemetry_.accuracy()},
                             {"test_loss", telemetry_.testLoss()},
                             {"rejects", traffic.rejects()},
                             {"discarded", traffic.discards()},
                             {"checkpoint_failures", checkpoints_->failures()},
                             {"sends", traffic.sendEvents()},
                             {"sent_bytes", traffic.bytesSent},
                             {"received_bytes", bytesReceived(*engine_, *transport_)},
                             {"samples", samples_}});
    publishStatus();
    worker_.reset();
    if (trainer_) trainer_->end(engine_->round(), bytesOf(engine_->params()), endReason_);
    trainer_.reset();
    const std::string rejects = nlohmann::json(traffic.rejects()).dump();
    transport_.reset();
    spdlog::info("stopped at round {}: test accuracy {:.4f}, rejects {}", engine_->round(),
                 telemetry_.accuracy(), rejects);
  }

  const config::LoadedConfig& loaded_;
  config::NodeConfig cfg_;
  StatusBoard& board_;
  int signalFd_;
  int wakeFd_;
  Clock::time_point started_;
  ServiceNotifier& service_;
  // Derived once from the config, not per message or per round.
  consensus::EngineOptions engineOptions_ = config::engineOptions(cfg_);
  std::string configYaml_ = config::toYaml(cfg_);

  data::TrainTest data_;
  std::vector<std::size_t> histogram_;
  std::uint64_t samples_ = 0;  // behind the updates taken (bytes per sample)
  std::unique_ptr<ComputeWorker<Scalar>> worker_;
  std::size_t dimension_ = 0;
  std::optional<Transport> transport_;
  std::unique_ptr<TrainerEndpoint> trainer_;  // model.kind: external
  bool awaitingTrainerInit_ = false;          // a fresh start waits for the trainer's x_0
  TrainerFeed<Scalar> feed_{config::stragglerSpec(cfg_)};  // its updates to the engine
  std::optional<LinkWatch> linkWatch_;                     // is a neighbour's link the bottleneck
  std::optional<CheckpointWriter> checkpoints_;
  GraphChange graphs_;  // the graph in force, and a new one held until between rounds
  std::int64_t joinedAtRound_ = -1;
  std::optional<CheckpointRequests> saves_;  // saves wanted, and their answers
  std::unique_ptr<consensus::RoundEngine<Scalar>> engine_;
  Telemetry telemetry_;
  std::vector<zmq::pollitem_t> pollItems_;
  Vector aligned_;  // an estimate whose frame is not aligned for Scalar

  Time nextStatus_{};           // snapshots after rounds: at most every kStatusEvery
  Time statusRefresh_{};        // and at least every kStatusRefresh
  bool finishedRound_ = false;  // in the current step
  bool stopping_ = false;
  std::string endReason_ = "stop";  // rounds, accuracy, time, stop or signal
  bool paused_ = false;
  bool saidIdle_ = false;     // in our last keep-alives
  bool saidAlone_ = false;    // a joiner with no neighbour answering: logged once
  bool trainerSeen_ = false;  // a trainer has attached since we started
};

}  // namespace

int runNode(const config::LoadedConfig& loaded, StatusBoard& board, int signalFd, int wakeFd) {
  ServiceNotifier service;
  const auto run = [&](const config::LoadedConfig& config,
                       std::unique_ptr<TrainerEndpoint> trainer) {
    if (config::usesFloat64(config.config))
      return Node<double>(config, board, signalFd, wakeFd, service, std::move(trainer)).run();
    return Node<float>(config, board, signalFd, wakeFd, service, std::move(trainer)).run();
  };
  if (!config::shapeFromTrainer(loaded.config)) return run(loaded, nullptr);
  std::unique_ptr<TrainerEndpoint> trainer = awaitTrainerShape(loaded, signalFd, service);
  if (!trainer) return 0;  // stopped while waiting
  const TrainerShape shape = *trainer->shape();
  config::LoadedConfig shaped = loaded;
  shaped.config.model.dimension = static_cast<std::int64_t>(shape.dimension);
  shaped.config.model.dtype = shape.dtype == wire::Dtype::Float64 ? config::kFloat64 : "float32";
  return run(shaped, std::move(trainer));
}

}  // namespace consensusd::daemon
