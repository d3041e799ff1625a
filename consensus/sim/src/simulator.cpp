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

#include "compute.hpp"
#include "consensusd/consensus/driver.hpp"
#include "consensusd/data/partition.hpp"

namespace consensusd::sim {
namespace {

using consensus::Time;

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
          job.params.reset();  // computed: the engine may write x_k in place (publish: update)
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
    void published(const Engine::Publication& estimate) { sim.publish(i, estimate, now); }
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

  // Node i's estimate of `round` leaves for the out-neighbours.
  void publish(std::size_t i, const Engine::Publication& estimate, Time now) {
    Node& node = nodes_[i];
    const std::int64_t round = estimate.round;
    const std::shared_ptr<const Vector> payload = sent(i, estimate.params);
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
      if (estimate.publicCopy) {
        // Compressed: the frame to a neighbour in step, else the copy whole;
        // in order on each link, as over the daemon's TCP connections.
        Link& link = links_[{i, out.index}];
        if (link.inStep && estimate.frame) {
          message.frame = estimate.frame;
          message.base = estimate.base;
          bytes = estimate.frame->size();
        } else {
          message.payload = estimate.publicCopy;
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
  }

  // Round `round` starts at node i: its gradient is computed (for real,
  // ahead on a spare core if there is one) and delivered after its virtual
  // time, with its loss.
  void start(std::size_t i, Engine::Start start, Time now) {
    Node& node = nodes_[i];
    const std::int64_t round = start.round;
    node.job.params = std::move(start.params);
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

}  // namespace

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
