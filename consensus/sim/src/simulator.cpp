#include "consensusd/sim/simulator.hpp"

#include <algorithm>
#include <memory>
#include <queue>

#include "consensusd/consensus/driver.hpp"
#include "consensusd/data/partition.hpp"

namespace consensusd::sim {
namespace {

using consensus::Time;
using Engine = consensus::RoundEngine<float>;
using Vector = Eigen::VectorXf;

enum class EventKind { Gradient, Estimate, Decision, Wake, Sample };

struct Event {
  Time at;
  std::uint64_t order;  // ties break in scheduling order: deterministic
  EventKind kind;
  std::size_t node;
  std::size_t from = 0;
  std::int64_t round = 0;
  bool used = false;
  std::shared_ptr<const Vector> payload;
  bool operator>(const Event& other) const {
    return std::tie(at, order) > std::tie(other.at, other.order);
  }
};

struct Node {
  std::unique_ptr<Engine> engine;
  data::MinibatchSampler sampler;
  std::vector<consensus::Straggler> stragglers;
  Vector gradient;
  double loss = 0;  // of the gradient in flight
  data::GradientStats stats;
  double lossEwma = 0;
  bool lossSeen = false;
  std::optional<Time> wake;  // the pending Wake event's time
};

class Simulation {
 public:
  Simulation(const topology::Topology& topology, const data::TrainTest& data,
             const std::vector<data::Dataset>& shares, const SimOptions& options)
      : topology_(topology),
        data_(data),
        shares_(shares),
        options_(options),
        model_(options.model) {
    Vector initial(static_cast<Eigen::Index>(model_.dimension()));
    model_.initialize(initial, options.initSeed);
    for (std::size_t i = 0; i < topology.size(); ++i) {
      Node node{std::make_unique<Engine>(topology, i, options.engine, options.schedule,
                                         options.momentum, initial, Time{}),
                data::MinibatchSampler(shares[i].size(), options.engine.batchSize,
                                       options.seed * 7919u + i),
                {},
                Vector(initial.size()),
                0,
                {},
                0,
                false,
                std::nullopt};
      if (i < options.stragglers.size()) {
        for (std::size_t k = 0; k < options.stragglers[i].size(); ++k) {
          consensus::StragglerSpec spec = options.stragglers[i][k];
          if (spec.kind == consensus::StragglerKind::None && spec.linkDelay == Duration::zero())
            continue;
          // Distinct draws per node and per model (the first as before stacking).
          spec.seed = (spec.seed * 1000003u + options.seed * 7919u + i) ^ (k * 0x9E3779B97F4A7C15u);
          node.stragglers.emplace_back(spec);
        }
      }
      nodes_.push_back(std::move(node));
    }
    if (options.nodeEvalSamples > 0) {
      std::vector<std::size_t> first(std::min(options.nodeEvalSamples, data.test.size()));
      for (std::size_t k = 0; k < first.size(); ++k) first[k] = k;
      nodeTest_ = data::subset(data.test, first);
    }
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
        case EventKind::Gradient:
          node.engine->swapGradient(event.round, node.gradient, node.loss, node.stats, event.at);
          break;
        case EventKind::Estimate:
          node.engine->onEstimate(event.from, event.round, event.payload->data(), event.at,
                                  event.payload);  // shared by every receiver, not copied
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
    events_.push({at, order_++, kind, node, from, round, used, std::move(payload)});
  }

  Duration transfer(std::size_t bytes) const {
    return options_.link.latency +
           std::chrono::duration_cast<Duration>(std::chrono::duration<double>(
               static_cast<double>(bytes) / options_.link.bytesPerSecond));
  }

  // Node i's side of consensus::step: events for what the engine hands back.
  struct NodeDriver {
    Simulation& sim;
    std::size_t i;
    Time now;

    void decided(const consensus::Decision& d) {
      sim.push(now + sim.transfer(64), EventKind::Decision, d.node, i, d.round, d.used);
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
    void started(std::int64_t round, std::shared_ptr<const Vector> params) {
      sim.start(i, round, std::move(params), now);
    }
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
  // out-neighbours, and its gradient is computed now (for real) and
  // delivered after its virtual time.
  void start(std::size_t i, std::int64_t round, std::shared_ptr<const Vector> params, Time now) {
    Node& node = nodes_[i];
    const std::shared_ptr<const Vector> payload = sent(i, params);
    // Slow links delay only estimates, as the daemon's transport does.
    Duration arrival = transfer(static_cast<std::size_t>(payload->size()) * sizeof(float));
    for (const consensus::Straggler& straggler : node.stragglers)
      arrival += straggler.linkDelay(round);
    for (const topology::Neighbor& out : topology_.outNeighbors(i))
      push(now + arrival, EventKind::Estimate, out.index, i, round, false, payload);
    data::gather(shares_[i], node.sampler.next(), batch_);
    node.loss =
        static_cast<double>(model_.lossAndGradient(*params, batch_, node.gradient, &node.stats));
    node.lossEwma = node.lossSeen ? node.lossEwma + 0.05 * (node.loss - node.lossEwma) : node.loss;
    node.lossSeen = true;
    Duration compute = options_.compute;
    for (consensus::Straggler& straggler : node.stragglers)
      compute += straggler.extraDelay(round, options_.compute);
    push(now + compute, EventKind::Gradient, i, 0, round);
  }

  // What node i sends for `params`: the estimate itself, unless it attacks.
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
    for (const Node& node : nodes_) {
      average += node.engine->params();
      row.meanRound += static_cast<double>(node.engine->round()) / n;
      row.meanLoss += node.lossEwma / n;
    }
    average /= static_cast<float>(n);
    for (const Node& node : nodes_)
      row.consensusDistance += static_cast<double>((node.engine->params() - average).norm()) / n;
    row.accuracy = model_.evaluate(average, data_.test).accuracy;
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
  std::optional<data::Dataset> nodeTest_;
  std::vector<Node> nodes_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  std::uint64_t order_ = 0;
  data::Batch<float> batch_;
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
