#include "consensusd/sim/simulator.hpp"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <queue>
#include <stdexcept>
#include <thread>

#include "consensusd/consensus/driver.hpp"
#include "consensusd/data/partition.hpp"

namespace consensusd::sim {
namespace {

using consensus::Time;
using Engine = consensus::RoundEngine<float>;
using Vector = Eigen::VectorXf;

// Arriving: part of an estimate of several chunks is in (the daemon hears
// every chunk; here one such event every peer_timeout / 4 of the transfer).
enum class EventKind { Gradient, Estimate, Arriving, Decision, Wake, Sample };

struct Event {
  Time at;
  std::uint64_t order;  // ties break in scheduling order: deterministic
  EventKind kind;
  std::size_t node;
  std::size_t from = 0;
  std::int64_t round = 0;
  bool used = false;
  std::shared_ptr<const Vector> payload;
  // A compressed frame instead of `payload` (a keyframe is a payload).
  std::shared_ptr<const std::vector<std::byte>> frame;
  std::int64_t base = -1;
  bool operator>(const Event& other) const {
    return std::tie(at, order) > std::tie(other.at, other.order);
  }
};

// A round's gradient: what it is computed from, and what comes out.
struct GradientJob {
  std::shared_ptr<const Vector> params;  // held until the job is done
  std::vector<std::size_t> indices;      // the minibatch, drawn when the round starts
  Vector gradient;
  double loss = 0;
  data::GradientStats stats;
  std::exception_ptr error;
};

// Node i's straggler models, each with its own draws.
std::vector<consensus::Straggler> stragglersOf(const SimOptions& options, std::size_t i) {
  std::vector<consensus::Straggler> out;
  if (i >= options.stragglers.size()) return out;
  for (std::size_t k = 0; k < options.stragglers[i].size(); ++k) {
    consensus::StragglerSpec spec = options.stragglers[i][k];
    if (spec.kind == consensus::StragglerKind::None && spec.linkDelay == Duration::zero()) continue;
    // Distinct draws per node and per model (the first as before stacking).
    spec.seed = (spec.seed * 1000003u + options.seed * 7919u + i) ^ (k * 0x9E3779B97F4A7C15u);
    out.emplace_back(spec);
  }
  return out;
}

struct Node {
  std::unique_ptr<Engine> engine;
  data::MinibatchSampler sampler;
  std::vector<consensus::Straggler> stragglers;
  GradientJob job;  // of the round in flight
  double lossEwma = 0;
  bool lossSeen = false;
  std::optional<Time> wake;  // the pending Wake event's time
};

// The nodes' gradients, computed ahead on the spare cores. A round's
// gradient is due `compute` of virtual time after the round starts, and the
// other nodes' events of that time come in between, so a job handed out at
// the start is most often done by the time its Gradient event needs it.
// Workers take the newest job (the one needed last); the event loop runs a
// job it needs itself when no worker has taken it yet. The arithmetic is the
// same whichever thread does it, so a run does not depend on `threads`.
class Gradients {
 public:
  Gradients(const data::ModelOptions& model, const std::vector<data::Dataset>& shares,
            std::vector<Node>& nodes, std::size_t threads)
      : shares_(shares),
        nodes_(nodes),
        states_(nodes.size(), State::Idle),
        own_{data::Model<float>(model), {}} {
    for (std::size_t k = 1; k < threads; ++k) workers_.push_back({data::Model<float>(model), {}});
    for (Worker& worker : workers_) threads_.emplace_back([this, &worker] { work(worker); });
  }
  Gradients(const Gradients&) = delete;
  Gradients& operator=(const Gradients&) = delete;
  ~Gradients() {
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    queued_.notify_all();
    for (std::thread& thread : threads_) thread.join();
  }

  // Node i's job is filled in (params, indices): compute it.
  void submit(std::size_t i) {
    if (threads_.empty()) return compute(i, own_);
    {
      const std::lock_guard lock(mutex_);
      states_[i] = State::Queued;
      stack_.push_back(i);
    }
    queued_.notify_one();
  }

  // Node i's job is done when this returns (rethrows what it threw).
  void wait(std::size_t i) {
    if (!threads_.empty()) {
      std::unique_lock lock(mutex_);
      if (states_[i] == State::Queued) {
        states_[i] = State::Running;
        lock.unlock();
        compute(i, own_);
        lock.lock();
      } else {
        done_.wait(lock, [&] { return states_[i] == State::Done; });
      }
      states_[i] = State::Idle;
    }
    if (GradientJob& job = nodes_[i].job; job.error) std::rethrow_exception(job.error);
  }

 private:
  enum class State { Idle, Queued, Running, Done };
  struct Worker {
    data::Model<float> model;  // keeps work buffers: one per thread
    data::Batch<float> batch;
  };

  void compute(std::size_t i, Worker& worker) {
    GradientJob& job = nodes_[i].job;
    try {
      data::gather(shares_[i], job.indices, worker.batch);
      job.loss = static_cast<double>(
          worker.model.lossAndGradient(*job.params, worker.batch, job.gradient, &job.stats));
    } catch (...) {
      job.error = std::current_exception();
    }
    job.params.reset();  // the engine may write its buffer again
  }

  void work(Worker& worker) {
    std::unique_lock lock(mutex_);
    while (true) {
      queued_.wait(lock, [&] { return stopping_ || !stack_.empty(); });
      if (stopping_) return;
      const std::size_t i = stack_.back();
      stack_.pop_back();
      if (states_[i] != State::Queued) continue;  // the event loop took it
      states_[i] = State::Running;
      lock.unlock();
      compute(i, worker);
      lock.lock();
      states_[i] = State::Done;
      done_.notify_all();
    }
  }

  const std::vector<data::Dataset>& shares_;
  std::vector<Node>& nodes_;
  std::mutex mutex_;
  std::condition_variable queued_;
  std::condition_variable done_;
  std::vector<State> states_;
  std::vector<std::size_t> stack_;  // job ids, newest last; may hold ids since taken
  bool stopping_ = false;
  Worker own_;  // the event loop's
  std::vector<Worker> workers_;
  std::vector<std::thread> threads_;
};

// The test accuracy of a model on every core: the test set in one part per
// thread, cut at multiples of the model's evaluation chunk, so each part
// predicts exactly what the whole would and the count of correct samples
// does not depend on `threads`.
class TestAccuracy {
 public:
  TestAccuracy(const data::ModelOptions& model, const data::Dataset& test, std::size_t threads)
      : whole_(test) {
    const std::size_t chunks = (test.size() + data::kEvalChunk - 1) / data::kEvalChunk;
    const std::size_t perPart = (chunks + threads - 1) / threads * data::kEvalChunk;
    if (threads > 1 && perPart < test.size()) {
      for (std::size_t begin = 0; begin < test.size(); begin += perPart) {
        std::vector<std::size_t> indices(std::min(perPart, test.size() - begin));
        std::iota(indices.begin(), indices.end(), begin);
        parts_.push_back(data::subset(test, indices));
      }
    }
    for (std::size_t k = 0; k < std::max<std::size_t>(parts_.size(), 1); ++k)
      models_.emplace_back(model);
  }

  double operator()(const Vector& params) {
    if (parts_.empty()) return models_.front().evaluate(params, whole_).accuracy;
    std::vector<double> correct(parts_.size());
    const auto count = [&](std::size_t k) {
      correct[k] = std::round(models_[k].evaluate(params, parts_[k]).accuracy *
                              static_cast<double>(parts_[k].size()));
    };
    std::vector<std::thread> helpers;
    for (std::size_t k = 1; k < parts_.size(); ++k) helpers.emplace_back(count, k);
    count(0);
    for (std::thread& helper : helpers) helper.join();
    return std::accumulate(correct.begin(), correct.end(), 0.0) /
           static_cast<double>(whole_.size());
  }

 private:
  const data::Dataset& whole_;
  std::vector<data::Dataset> parts_;  // empty: evaluate the whole here
  std::vector<data::Model<float>> models_;
};

class Simulation {
 public:
  Simulation(const topology::Topology& topology, const data::TrainTest& data,
             const std::vector<data::Dataset>& shares, const SimOptions& options)
      : topology_(topology),
        data_(data),
        shares_(shares),
        options_(options),
        model_(options.model),
        testAccuracy_(options.model, data.test, std::max<std::size_t>(options.threads, 1)) {
    if (options.engine.compression != consensus::Compression::None && !options.attackers.empty())
      throw std::invalid_argument("attackers send plain estimates: consensus.compression: none");
    Vector initial(static_cast<Eigen::Index>(model_.dimension()));
    model_.initialize(initial, options.initSeed);
    for (std::size_t i = 0; i < topology.size(); ++i) {
      Node node{std::make_unique<Engine>(topology, i, options.engine, options.schedule,
                                         options.momentum, initial, Time{}),
                data::MinibatchSampler(shares[i].size(), options.engine.batchSize,
                                       options.seed * 7919u + i),
                {},
                {nullptr, {}, Vector(initial.size()), 0, {}, nullptr},
                0,
                false,
                std::nullopt};
      node.stragglers = stragglersOf(options, i);
      nodes_.push_back(std::move(node));
    }
    if (options.nodeEvalSamples > 0) {
      std::vector<std::size_t> first(std::min(options.nodeEvalSamples, data.test.size()));
      for (std::size_t k = 0; k < first.size(); ++k) first[k] = k;
      nodeTest_ = data::subset(data.test, first);
    }
    gradients_.emplace(options.model, shares, nodes_, std::max<std::size_t>(options.threads, 1));
  }

  SimResult run() {
    runEvents();
    for (const Node& node : nodes_) {
      result_.nodeRounds.push_back(node.engine->round());
      result_.nodeParams.push_back(node.engine->params());
    }
    return result_;
  }

 private:
  void runEvents() {
    for (std::size_t i = 0; i < nodes_.size(); ++i) poke(i, Time{});
    push(Time{}, EventKind::Sample, 0);
    while (!events_.empty()) {
      Event event = events_.top();
      events_.pop();
      if (event.at > options_.maxTime) break;
      ++result_.events;
      Node& node = nodes_[event.node];
      switch (event.kind) {
        case EventKind::Gradient: {
          gradients_->wait(event.node);
          GradientJob& job = node.job;
          node.lossEwma =
              node.lossSeen ? node.lossEwma + 0.05 * (job.loss - node.lossEwma) : job.loss;
          node.lossSeen = true;
          node.engine->swapGradient(event.round, job.gradient, job.loss, job.stats, event.at);
          break;
        }
        case EventKind::Estimate: {
          const consensus::Receipt receipt =
              event.frame ? node.engine->onFrame(event.from, event.round, event.base, *event.frame,
                                                 event.at)
                          : node.engine->onEstimate(event.from, event.round, event.payload->data(),
                                                    event.at,
                                                    event.payload);  // shared, not copied
          // The daemon's receiver asks for a keyframe; here the sender just knows.
          if (receipt == consensus::Receipt::Gap || receipt == consensus::Receipt::Corrupt)
            links_[{event.from, event.node}].inStep = false;
          break;
        }
        case EventKind::Arriving:
          node.engine->onArriving(event.from, event.round, event.at);
          break;
        case EventKind::Decision:
          node.engine->onDecision(event.from, event.round, event.used, event.at);
          break;
        case EventKind::Wake:
          if (node.wake != event.at) continue;  // superseded by an earlier wake
          node.wake.reset();
          break;
        case EventKind::Sample:
          if (sample(event.at)) return;
          push(event.at + options_.sampleEvery, EventKind::Sample, 0);
          continue;
      }
      poke(event.node, event.at);
    }
  }

  void push(Time at, EventKind kind, std::size_t node, std::size_t from = 0, std::int64_t round = 0,
            bool used = false, std::shared_ptr<const Vector> payload = nullptr) {
    events_.push({at, order_++, kind, node, from, round, used, std::move(payload), nullptr, -1});
  }

  // A message of `bytes` between nodes a and b (either way).
  Duration transfer(std::size_t bytes, std::size_t a, std::size_t b) const {
    const Duration time =
        options_.link.latency + std::chrono::duration_cast<Duration>(std::chrono::duration<double>(
                                    static_cast<double>(bytes) / options_.link.bytesPerSecond));
    if (options_.link.spread == 0) return time;
    return std::chrono::duration_cast<Duration>(time *
                                                linkSlowness(options_.link, options_.seed, a, b));
  }

  // When an estimate of `bytes` sent from a to b at `at` is in: through b's
  // download if it has one (after the estimates before it), else over the link.
  Time arrival(Time at, std::size_t bytes, std::size_t a, std::size_t b) {
    const auto& download = options_.link.downloadBytesPerSecond;
    if (b >= download.size() || download[b] <= 0) return at + transfer(bytes, a, b);
    Time& free = downloadFree_[b];
    const Time begins = std::max(at + options_.link.latency, free);
    free = begins + std::chrono::duration_cast<Duration>(
                        std::chrono::duration<double>(static_cast<double>(bytes) / download[b]));
    return free;
  }

  // An estimate of several chunks is heard while it arrives, as in the
  // daemon: a slow link is not a silent neighbour.
  void arriving(Time begins, Time in, std::size_t bytes, std::size_t a, std::size_t b,
                std::int64_t round) {
    constexpr std::size_t kChunkBytes = std::size_t{1} << 20;  // the daemon's (wire.hpp)
    if (bytes <= kChunkBytes) return;
    const Duration every = options_.engine.peerTimeout / 4;
    for (Time t = begins; t < in; t += every) push(t, EventKind::Arriving, b, a, round);
  }

  // Node i's side of consensus::step: events for what the engine hands back.
  struct NodeDriver {
    Simulation& sim;
    std::size_t i;
    Time now;

    void decided(const consensus::Decision& d) {
      sim.push(now + sim.transfer(64, i, d.node), EventKind::Decision, d.node, i, d.round, d.used);
    }
    void finished(const consensus::RoundRecord& record) {
      ++sim.result_.rounds;
      sim.backups_ +=
          static_cast<double>(sim.nodes_[i].engine->degree() - record.responders.size());
      sim.targets_ += static_cast<double>(record.target);
      if (record.reason == consensus::CutoffReason::Timeout) ++sim.timeouts_;
      if (record.reason == consensus::CutoffReason::Deadline) ++sim.deadlines_;
      ++sim.recorded_;
    }
    static bool mayStart() { return true; }
    void started(Engine::Start start) { sim.start(i, std::move(start), now); }
  };

  void poke(std::size_t i, Time now) {
    Node& node = nodes_[i];
    NodeDriver driver{*this, i, now};
    if (auto wake = consensus::step(*node.engine, now, driver);
        wake && (!node.wake || *wake < *node.wake)) {
      node.wake = *wake;
      push(*wake, EventKind::Wake, i);
    }
  }

  // Round `round` starts at node i: its estimate leaves for the
  // out-neighbours, and its gradient is computed (for real, ahead on a spare
  // core if there is one) and delivered after its virtual time, with its loss.
  void start(std::size_t i, Engine::Start start, Time now) {
    Node& node = nodes_[i];
    const std::int64_t round = start.round;
    const std::shared_ptr<const Vector>& params = start.params;
    const std::shared_ptr<const Vector> payload = sent(i, params);
    // A node's slow link (straggler.link_delay_ms) delays only estimates, as
    // the daemon's transport does.
    Duration delay{};
    for (const consensus::Straggler& straggler : node.stragglers)
      delay += straggler.linkDelay(round);
    const std::size_t wholeBytes = static_cast<std::size_t>(payload->size()) * sizeof(float);
    for (const topology::Neighbor& out : topology_.outNeighbors(i)) {
      Event message{{}, 0, EventKind::Estimate, out.index, i, round, false, payload, nullptr, -1};
      std::size_t bytes = wholeBytes;
      Time in{};
      if (start.publicCopy) {
        // Compressed: the frame to a neighbour in step, else the copy whole;
        // in order on each link, as over the daemon's TCP connections.
        Link& link = links_[{i, out.index}];
        if (link.inStep && start.frame) {
          message.frame = start.frame;
          message.base = start.base;
          bytes = start.frame->size();
        } else {
          message.payload = start.publicCopy;
        }
        link.inStep = true;
        if (options_.link.estimateBytes != 0)  // the size given is the float32 estimate's
          bytes = bytes * options_.link.estimateBytes / wholeBytes;
        in = std::max(arrival(now + delay, bytes, i, out.index), link.lastIn);
        link.lastIn = in;
      } else {
        if (options_.link.estimateBytes != 0) bytes = options_.link.estimateBytes;
        in = arrival(now + delay, bytes, i, out.index);
      }
      result_.bytesSent += bytes;
      arriving(now + delay, in, bytes, i, out.index, round);
      message.at = in;
      message.order = order_++;
      events_.push(std::move(message));
    }
    node.job.params = params;
    node.job.indices = node.sampler.next();
    gradients_->submit(i);
    Duration compute = options_.compute;
    for (consensus::Straggler& straggler : node.stragglers)
      compute += straggler.extraDelay(round, options_.compute);
    push(now + compute, EventKind::Gradient, i, 0, round);
  }

  // What node i sends: its parameters (shared, as the daemon sends them), or an attacker's lie.
  std::shared_ptr<const Vector> sent(std::size_t i, std::shared_ptr<const Vector> params) const {
    for (const Attacker& attacker : options_.attackers) {
      if (attacker.node != i) continue;
      const auto scale = static_cast<float>(attacker.scale);
      if (attacker.attack == Attack::SignFlip)
        return std::make_shared<const Vector>(-scale * *params);
      return std::make_shared<const Vector>((params->array() + scale).matrix());
    }
    return params;
  }

  // Appends a row; true when the run should end.
  bool sample(Time now) {
    const auto n = static_cast<double>(nodes_.size());
    Vector average = Vector::Zero(nodes_.front().engine->params().size());
    Sample row;
    row.timeS = std::chrono::duration<double>(now).count();
    double lossSum = 0;
    std::size_t losses = 0;
    for (const Node& node : nodes_) {
      average += node.engine->params();
      row.meanRound += static_cast<double>(node.engine->round()) / n;
      if (node.lossSeen) {
        lossSum += node.lossEwma;
        ++losses;
      }
    }
    row.meanLoss = losses > 0 ? lossSum / static_cast<double>(losses)
                              : std::numeric_limits<double>::quiet_NaN();
    average /= static_cast<float>(n);
    for (const Node& node : nodes_)
      row.consensusDistance += static_cast<double>((node.engine->params() - average).norm()) / n;
    row.accuracy = testAccuracy_(average);
    row.minAccuracy = row.maxAccuracy = row.accuracy;
    if (nodeTest_) {
      row.minAccuracy = 1;
      row.maxAccuracy = 0;
      for (const Node& node : nodes_) {
        const double a = model_.evaluate(node.engine->params(), *nodeTest_).accuracy;
        row.minAccuracy = std::min(row.minAccuracy, a);
        row.maxAccuracy = std::max(row.maxAccuracy, a);
      }
    }
    const double rounds = recorded_ > 0 ? static_cast<double>(recorded_) : 1.0;
    row.meanBackups = backups_ / rounds;
    row.meanTarget = targets_ / rounds;
    row.timeoutShare = static_cast<double>(timeouts_) / rounds;
    row.deadlineShare = static_cast<double>(deadlines_) / rounds;
    row.sentBytesPerNode = static_cast<double>(result_.bytesSent) / n;
    const double samples = row.meanRound * static_cast<double>(options_.engine.batchSize);
    row.sentBytesPerSample = samples > 0 ? row.sentBytesPerNode / samples : 0.0;
    backups_ = targets_ = 0;
    recorded_ = timeouts_ = deadlines_ = 0;
    result_.samples.push_back(row);
    return options_.stopAtAccuracy > 0 && row.accuracy >= options_.stopAtAccuracy;
  }

  const topology::Topology& topology_;
  const data::TrainTest& data_;
  const std::vector<data::Dataset>& shares_;
  const SimOptions& options_;
  data::Model<float> model_;
  TestAccuracy testAccuracy_;
  std::optional<data::Dataset> nodeTest_;
  std::vector<Node> nodes_;
  std::map<std::size_t, Time> downloadFree_;  // per node with a download rate: when it is idle
  // Compressed estimates, per directed edge: whether the receiver's copy of
  // the sender's is in step (else the next goes whole), when the last is in.
  struct Link {
    bool inStep = false;
    Time lastIn{};
  };
  std::map<std::pair<std::size_t, std::size_t>, Link> links_;
  std::optional<Gradients> gradients_;  // after nodes_: its workers stop first
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  std::uint64_t order_ = 0;
  double backups_ = 0;  // per-row sums over the rounds recorded since the last row
  double targets_ = 0;
  std::int64_t recorded_ = 0;
  std::int64_t timeouts_ = 0;
  std::int64_t deadlines_ = 0;
  SimResult result_;
};

// The synchronous baseline: one loop over steps, no events needed (every
// node waits for every other at each step).
class SynchronousRun {
 public:
  SynchronousRun(const topology::Topology& topology, const data::TrainTest& data,
                 const std::vector<data::Dataset>& shares, const SimOptions& options)
      : topology_(topology),
        shares_(shares),
        options_(options),
        model_(options.model),
        testAccuracy_(options.model, data.test, std::max<std::size_t>(options.threads, 1)),
        x_(static_cast<Eigen::Index>(model_.dimension())),
        sgd_(model_.dimension(), options.momentum) {
    model_.initialize(x_, options.initSeed);
    for (std::size_t i = 0; i < topology.size(); ++i) {
      samplers_.emplace_back(shares[i].size(), options.engine.batchSize, options.seed * 7919u + i);
      stragglers_.push_back(stragglersOf(options, i));
    }
  }

  SimResult run() {
    const std::size_t n = topology_.size();
    const double bytes =
        static_cast<double>(options_.link.estimateBytes != 0 ? options_.link.estimateBytes
                                                             : model_.dimension() * sizeof(float));
    Vector gradient(x_.size());
    Vector sum(x_.size());
    data::Batch<float> batch;
    Time now{};
    Time nextSample{};
    double lossEwma = 0;
    // Samples at or before `until`, of x as it is now.
    const auto sampleUntil = [&](Time until, std::int64_t step) {
      for (; nextSample <= until && nextSample <= options_.maxTime;
           nextSample += options_.sampleEvery)
        if (sample(nextSample, step, lossEwma)) return true;
      return false;
    };
    for (std::int64_t step = 0;; ++step) {
      if (sampleUntil(now, step)) return finish(step);
      // Every node's gradient at x; the step waits for the slowest.
      sum.setZero();
      double loss = 0;
      Duration slowest{};
      Duration slowLink{};
      for (std::size_t i = 0; i < n; ++i) {
        data::gather(shares_[i], samplers_[i].next(), batch);
        loss += static_cast<double>(model_.lossAndGradient(x_, batch, gradient));
        sum += gradient;
        Duration compute = options_.compute;
        for (consensus::Straggler& straggler : stragglers_[i]) {
          compute += straggler.extraDelay(step, options_.compute);
          slowLink = std::max(slowLink, straggler.linkDelay(step));
        }
        slowest = std::max(slowest, compute);
      }
      // (At least a microsecond: a step of no time would never reach the next sample.)
      const Duration took =
          std::max<Duration>(slowest + allReduce(bytes, slowLink), std::chrono::microseconds(1));
      if (now + took > options_.maxTime) {  // not done by the end: the last samples without it
        sampleUntil(options_.maxTime, step);
        return finish(step);
      }
      lossEwma = step == 0 ? loss / static_cast<double>(n)
                           : lossEwma + 0.05 * (loss / static_cast<double>(n) - lossEwma);
      sgd_.step(x_, sum / static_cast<float>(n), options_.schedule.at(step));
      now += took;
      result_.rounds += static_cast<std::int64_t>(n);
      result_.bytesSent += static_cast<std::uint64_t>(2.0 * bytes * static_cast<double>(n - 1));
    }
  }

 private:
  SimResult finish(std::int64_t steps) {
    result_.nodeRounds.assign(topology_.size(), steps);
    result_.nodeParams.assign(topology_.size(), x_);
    return std::move(result_);
  }

  // A ring all-reduce of `bytes`: 2(N-1) steps, each as slow as the slowest
  // link of the ring (nodes in the topology's order) carrying 1/N of it.
  Duration allReduce(double bytes, Duration slowLink) const {
    const std::size_t n = topology_.size();
    if (n < 2) return Duration::zero();
    double slowness = 1;
    if (options_.link.spread > 0)
      for (std::size_t i = 0; i < n; ++i)
        slowness = std::max(slowness, linkSlowness(options_.link, options_.seed, i, (i + 1) % n));
    const double part = bytes / static_cast<double>(n) / options_.link.bytesPerSecond;
    const Duration oneStep =
        std::chrono::duration_cast<Duration>(
            (options_.link.latency + std::chrono::duration<double>(part)) * slowness) +
        slowLink;
    return oneStep * static_cast<std::int64_t>(2 * (n - 1));
  }

  bool sample(Time at, std::int64_t step, double lossEwma) {
    Sample row;
    row.timeS = std::chrono::duration<double>(at).count();
    row.meanRound = static_cast<double>(step);
    row.meanLoss = step > 0 ? lossEwma : std::numeric_limits<double>::quiet_NaN();
    row.accuracy = row.minAccuracy = row.maxAccuracy = testAccuracy_(x_);
    row.meanTarget = static_cast<double>(topology_.size() - 1);
    const double n = static_cast<double>(topology_.size());
    row.sentBytesPerNode = static_cast<double>(result_.bytesSent) / n;
    const double samples = row.meanRound * static_cast<double>(options_.engine.batchSize);
    row.sentBytesPerSample = samples > 0 ? row.sentBytesPerNode / samples : 0.0;
    result_.samples.push_back(row);
    return options_.stopAtAccuracy > 0 && row.accuracy >= options_.stopAtAccuracy;
  }

  const topology::Topology& topology_;
  const std::vector<data::Dataset>& shares_;
  const SimOptions& options_;
  data::Model<float> model_;
  TestAccuracy testAccuracy_;
  Vector x_;
  data::Sgd<float> sgd_;
  std::vector<data::MinibatchSampler> samplers_;
  std::vector<std::vector<consensus::Straggler>> stragglers_;
  SimResult result_;
};

}  // namespace

SimResult simulateSynchronous(const topology::Topology& topology, const data::TrainTest& data,
                              const std::vector<data::Dataset>& shares, const SimOptions& options) {
  return SynchronousRun(topology, data, shares, options).run();
}

SimResult simulate(const topology::Topology& topology, const data::TrainTest& data,
                   const std::vector<data::Dataset>& shares, const SimOptions& options) {
  return Simulation(topology, data, shares, options).run();
}

double linkSlowness(const LinkModel& link, std::uint64_t seed, std::size_t a, std::size_t b) {
  // Z by Box-Muller from a hash of the seed and the pair: no draw depends on
  // the order of events, and a link is the same both ways.
  std::uint64_t state =
      seed * 0x9E3779B97F4A7C15u ^ (std::min(a, b) * 0xD1B54A32D192ED03u + std::max(a, b));
  const auto uniform = [&state] {  // splitmix64, in (0, 1)
    std::uint64_t z = (state += 0x9E3779B97F4A7C15u);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return (static_cast<double>((z ^ (z >> 31)) >> 11) + 0.5) * 0x1.0p-53;
  };
  const double u = uniform();
  const double v = uniform();
  const double z = std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * std::acos(-1.0) * v);
  return std::exp(link.spread * z);
}

std::optional<double> firstCrossing(const std::vector<Sample>& samples, double target,
                                    std::size_t window) {
  window = std::max<std::size_t>(window, 1);
  double sum = 0;
  for (std::size_t k = 0; k < samples.size(); ++k) {
    sum += samples[k].accuracy;
    if (k >= window) sum -= samples[k - window].accuracy;
    if (k + 1 >= window && sum / static_cast<double>(window) >= target) return samples[k].timeS;
  }
  return std::nullopt;
}

}  // namespace consensusd::sim
