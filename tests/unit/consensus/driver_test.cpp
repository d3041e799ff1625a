// consensus::step (driver.hpp) driving several engines on a tiny discrete-event network: round
// skipping and symmetric mixing.

#include "helpers.hpp"

using namespace consensus_test;

namespace {

// A tiny discrete-event network for the skipping tests: fixed compute time
// per node, fixed link latency, every engine driven as the daemon would.
struct Network {
  const Topology& topology;
  std::vector<std::unique_ptr<Engine>> engines;
  std::vector<double> computeMs;
  double latencyMs = 0.1;
  struct Event {
    double at;
    std::uint64_t order;
    std::function<void(double)> run;
    bool operator>(const Event& other) const {
      return std::tie(at, order) > std::tie(other.at, other.order);
    }
  };
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events;
  std::uint64_t counter = 0;
  std::vector<std::int64_t> finished;
  std::vector<std::int64_t> skips;

  Network(const Topology& graph, EngineOptions options, std::vector<double> compute)
      : topology(graph),
        computeMs(std::move(compute)),
        finished(graph.size(), 0),
        skips(graph.size(), 0) {
    for (std::size_t i = 0; i < graph.size(); ++i) {
      engines.push_back(std::make_unique<Engine>(graph, i, options, rate(0.0), 0.0,
                                                 Eigen::VectorXd::Zero(2), Time{}));
    }
  }
  void at(double t, std::function<void(double)> run) {
    events.push({t, counter++, std::move(run)});
  }

  // Node i's side of consensus::step, as the daemon and the simulator have theirs.
  struct NodeDriver {
    Network& net;
    std::size_t i;
    double now;
    static void decided(const Decision& /*decision*/) {}
    void finished(const RoundRecord& record) {
      ++net.finished[i];
      net.skips[i] += record.skipped ? 1 : 0;
    }
    static bool mayStart() { return true; }
    void published(const Engine::Publication& publication) {
      for (const auto& out : net.topology.outNeighbors(i)) {
        net.at(now + net.latencyMs, [n = &net, from = i, to = out.index, round = publication.round,
                                     values = Eigen::VectorXd(*publication.params)](double t) {
          n->engines[to]->onEstimate(from, round, values.data(), ms(t));
          n->poke(to, t);
        });
      }
    }
    void started(const Engine::Start& start) {
      const std::int64_t round = start.round;
      net.at(now + net.computeMs[i], [n = &net, self = i, round](double t) {
        n->engines[self]->onGradient(round, Eigen::VectorXd::Zero(2), 0.0, GradientStats{}, ms(t));
        n->poke(self, t);
      });
    }
  };

  void poke(std::size_t i, double now) {
    NodeDriver driver{*this, i, now};
    if (auto wake = step(*engines[i], ms(now), driver)) {
      at(std::chrono::duration<double, std::milli>(*wake).count(),
         [this, i](double t) { poke(i, t); });
    }
  }
  void run(double untilMs) {
    for (std::size_t i = 0; i < engines.size(); ++i) at(0, [this, i](double t) { poke(i, t); });
    while (!events.empty() && events.top().at <= untilMs) {
      Event event = events.top();
      events.pop();
      event.run(event.at);
    }
  }
};

}  // namespace

TEST_CASE("round skipping: a persistently slow node skips, its neighbours keep their pace") {
  const Topology ring = graph("ring", 6);
  EngineOptions options;
  options.policy.kind = PolicyKind::Static;
  options.policy.backups = 1;
  options.maxLead = 40;
  options.skipAhead = 2;
  const std::vector<double> compute{20.0, 1.0, 1.0, 1.0, 1.0, 1.0};

  options.roundSkipping = true;
  Network skipping(ring, options, compute);
  skipping.run(2000);
  options.roundSkipping = false;
  Network throttled(ring, options, compute);
  throttled.run(2000);
  Network alone(ring, options, std::vector<double>(6, 1.0));
  alone.run(2000);

  CAPTURE(skipping.finished);
  CAPTURE(throttled.finished);
  CAPTURE(alone.finished);
  // The slow node finishes about 2000 / 20 rounds either way, and skips.
  CHECK(skipping.finished[0] <= 101);
  CHECK(skipping.skips[0] >= 50);
  for (std::size_t i = 1; i < 6; ++i) {
    // With skipping, the others run at the pace they have without any straggler.
    CHECK(static_cast<double>(skipping.finished[i]) >=
          0.9 * static_cast<double>(alone.finished[i]));
    // Without it, the lead bound holds them within max_lead of the slow node.
    CHECK(throttled.finished[i] <= throttled.finished[0] + 6 * options.maxLead);
    CHECK(static_cast<double>(throttled.finished[i]) <
          0.5 * static_cast<double>(alone.finished[i]));
  }
}

TEST_CASE(
    "symmetric mixing: a neighbour that moved past the round without deciding does not count") {
  const Topology pair = graph("chain", 2);
  EngineOptions options = withPolicy(PolicyKind::All);
  options.mixMode = MixMode::Symmetric;
  Engine a(pair, 0, options, rate(0.0), 0.0, Eigen::VectorXd::Constant(1, 0.0), Time{});
  REQUIRE(a.tryStart(ms(0)));
  a.onGradient(0, Eigen::VectorXd::Zero(1), 0.0, GradientStats{}, ms(1));
  const Eigen::VectorXd theirs = Eigen::VectorXd::Constant(1, 1.0);
  a.onEstimate(1, 0, theirs.data(), ms(2));
  CHECK_FALSE(a.tryFinish(ms(3)));  // waits for n1's decision on round 0
  CHECK(a.phase() == Engine::Phase::Deciding);
  a.onEstimate(1, 5, theirs.data(), ms(4));  // n1 skipped ahead: no decision is coming
  const auto record = a.tryFinish(ms(4));
  REQUIRE(record);
  CHECK(record->responders.empty());
  CHECK(a.params()[0] == 0.0);
}

TEST_CASE("symmetric mixing: an edge counts only when both ends used each other") {
  const Topology pair = graph("chain", 2);  // weights 1/2
  EngineOptions options = withPolicy(PolicyKind::All);
  options.mixMode = MixMode::Symmetric;
  EngineOptions hasty = options;
  hasty.policy.kind = PolicyKind::Static;
  hasty.policy.backups = 1;
  hasty.minResponders = 0;  // n1 does not wait for n0 at all

  for (const bool bothUse : {true, false}) {
    CAPTURE(bothUse);
    Engine a(pair, 0, options, rate(0.0), 0.0, Eigen::VectorXd::Constant(1, 0.0), Time{});
    Engine b(pair, 1, bothUse ? options : hasty, rate(0.0), 0.0, Eigen::VectorXd::Constant(1, 1.0),
             Time{});
    const auto sa = a.tryStart(ms(0));
    const auto sb = b.tryStart(ms(0));
    REQUIRE((sa && sb));
    const Eigen::VectorXd xa = *sa->params;
    const Eigen::VectorXd xb = *sb->params;
    a.onGradient(0, Eigen::VectorXd::Zero(1), 0.0, GradientStats{}, ms(1));
    b.onGradient(0, Eigen::VectorXd::Zero(1), 0.0, GradientStats{}, ms(1));
    a.onEstimate(1, 0, xb.data(), ms(2));
    if (bothUse) b.onEstimate(0, 0, xa.data(), ms(2));
    // b cuts off (with or without a), then a; each tells the other.
    auto rb = b.tryFinish(ms(3));
    CHECK(rb.has_value() == !bothUse);  // having used nobody, b need not wait
    CHECK_FALSE(a.tryFinish(ms(3)));
    CHECK(a.phase() == Engine::Phase::Deciding);
    for (const Decision& d : b.takeDecisions()) a.onDecision(1, d.round, d.used, ms(4));
    for (const Decision& d : a.takeDecisions()) b.onDecision(0, d.round, d.used, ms(4));
    const auto ra = a.tryFinish(ms(4));
    if (bothUse) rb = b.tryFinish(ms(4));
    REQUIRE((ra && rb));
    if (bothUse) {
      CHECK(a.params()[0] == doctest::Approx(0.5));
      CHECK(b.params()[0] == doctest::Approx(0.5));
    } else {
      // Absorb would have moved a to 0.5 alone, breaking the mean; symmetric keeps both.
      CHECK(ra->responders.empty());
      CHECK(a.params()[0] == 0.0);
      CHECK(b.params()[0] == 1.0);
    }
    CHECK(a.params()[0] + b.params()[0] == doctest::Approx(1.0));  // the mean is kept
  }
}
