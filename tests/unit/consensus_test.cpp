// The consensus core on a fake clock with scripted arrivals: exact and fast.

#include <doctest/doctest.h>

#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <queue>
#include <random>

#include "consensusd/consensus/driver.hpp"
#include "consensusd/consensus/estimators.hpp"
#include "consensusd/consensus/mixing.hpp"
#include "consensusd/consensus/round_engine.hpp"
#include "consensusd/consensus/straggler.hpp"
#include "consensusd/topology/analysis.hpp"
#include "consensusd/topology/generators.hpp"

using namespace consensusd::consensus;
using consensusd::data::GradientStats;
using consensusd::data::Schedule;
using consensusd::topology::GeneratorOptions;
using consensusd::topology::Topology;
using Engine = RoundEngine<double>;
using std::chrono::milliseconds;

namespace {

Time ms(double value) {
  return std::chrono::duration_cast<Time>(std::chrono::duration<double, std::milli>(value));
}

Topology graph(const std::string& kind, std::size_t nodes) {
  GeneratorOptions options;
  options.kind = kind;
  options.nodes = nodes;
  options.degree = 4;
  return Topology::fromSpec(consensusd::topology::generate(options), "<test>");
}

Schedule rate(double eta) {
  Schedule schedule;
  schedule.learningRate = eta;
  return schedule;
}

// Node 0 of a 5-node star: neighbours n1..n4, each with weight 1/5.
struct Hub {
  Topology topology = graph("star", 5);
  Engine engine;
  explicit Hub(EngineOptions options, double eta = 0.0)
      : engine(topology, 0, options, rate(eta), 0.0, Eigen::VectorXd::Zero(3), Time{}) {}

  void send(std::size_t node, std::int64_t round, double value, Time at) {
    const Eigen::VectorXd values = Eigen::VectorXd::Constant(3, value);
    engine.onEstimate(node, round, values.data(), at);
  }
  void gradient(Time at, double value = 0.0) {
    engine.onGradient(engine.round(), Eigen::VectorXd::Constant(3, value), 0.0, GradientStats{},
                      at);
  }
};

EngineOptions withPolicy(PolicyKind kind) {
  EngineOptions options;
  options.policy.kind = kind;
  options.roundSkipping = false;
  return options;
}

}  // namespace

TEST_CASE("all: waits for every live neighbour, then cuts off at once") {
  Hub hub(withPolicy(PolicyKind::All));
  REQUIRE(hub.engine.tryStart(ms(0)));
  hub.gradient(ms(0.5));
  for (std::size_t j = 1; j <= 3; ++j) hub.send(j, 0, 1.0, ms(static_cast<double>(j)));
  CHECK_FALSE(hub.engine.tryFinish(ms(3.9)));
  hub.send(4, 0, 1.0, ms(4));
  const auto record = hub.engine.tryFinish(ms(4));
  REQUIRE(record);
  CHECK(record->reason == CutoffReason::Count);
  CHECK(record->responders.size() == 4);
  CHECK(record->compute == ms(0.5));
  CHECK(hub.engine.params()[0] == doctest::Approx(0.8));  // 4 x 0.2 x 1.0
}

TEST_CASE("all: a dead neighbour stalls the round until it turns suspect") {
  EngineOptions options = withPolicy(PolicyKind::All);
  options.peerTimeout = milliseconds(100);
  Hub hub(options);
  REQUIRE(hub.engine.tryStart(ms(0)));
  hub.gradient(ms(1));
  for (std::size_t j = 1; j <= 3; ++j) hub.send(j, 0, 1.0, ms(2));
  CHECK_FALSE(hub.engine.tryFinish(ms(50)));
  CHECK(hub.engine.nextWakeup(ms(50)) == ms(100));  // n4, silent since the start, turns suspect
  const auto record = hub.engine.tryFinish(ms(100));
  REQUIRE(record);
  CHECK(record->reason == CutoffReason::Count);
  CHECK(record->live == 3);
  CHECK(hub.engine.suspect(3, ms(100)));
  // It speaks again, twice (one message alone may be a replay): no longer suspect.
  hub.send(4, 0, 1.0, ms(101));
  CHECK(hub.engine.suspect(3, ms(101)));
  hub.send(4, 1, 1.0, ms(102));
  CHECK_FALSE(hub.engine.suspect(3, ms(102)));
}

TEST_CASE("static: cuts off at the (d - b)-th arrival") {
  EngineOptions options = withPolicy(PolicyKind::Static);
  options.policy.backups = 1;
  Hub hub(options);
  REQUIRE(hub.engine.tryStart(ms(0)));
  hub.gradient(ms(0.5));
  hub.send(1, 0, 1.0, ms(1));
  hub.send(2, 0, 1.0, ms(2));
  CHECK_FALSE(hub.engine.tryFinish(ms(2.9)));
  hub.send(3, 0, 1.0, ms(3));
  const auto record = hub.engine.tryFinish(ms(3));
  REQUIRE(record);
  CHECK(record->target == 3);
  CHECK(record->responders == std::vector<std::size_t>{1, 2, 3});
  // renormalize (the default): self and the three in share the missing 0.2.
  CHECK(record->selfWeight == doctest::Approx(0.2 / 0.8));
}

TEST_CASE("the own gradient is always waited for") {
  EngineOptions options = withPolicy(PolicyKind::Static);
  options.policy.backups = 3;
  Hub hub(options);
  REQUIRE(hub.engine.tryStart(ms(0)));
  hub.send(1, 0, 1.0, ms(1));
  CHECK_FALSE(hub.engine.tryFinish(ms(5)));
  hub.gradient(ms(6));
  CHECK(hub.engine.tryFinish(ms(6)));
}

TEST_CASE("timeout: cuts off at the fixed time with at least m_min responders") {
  EngineOptions options = withPolicy(PolicyKind::Timeout);
  options.policy.timeout = milliseconds(3);
  Hub hub(options);
  REQUIRE(hub.engine.tryStart(ms(0)));
  hub.gradient(ms(0.5));
  CHECK(hub.engine.nextWakeup(ms(0.5)) == ms(3));
  CHECK_FALSE(hub.engine.tryFinish(ms(3)));  // nobody yet: m_min = 1
  hub.send(2, 0, 1.0, ms(3.5));
  const auto record = hub.engine.tryFinish(ms(3.5));
  REQUIRE(record);
  CHECK(record->reason == CutoffReason::Timeout);
  CHECK(record->responders == std::vector<std::size_t>{2});
}

TEST_CASE("the hard deadline ends any wait") {
  EngineOptions options = withPolicy(PolicyKind::All);
  options.hardDeadline = milliseconds(20);
  Hub hub(options);
  REQUIRE(hub.engine.tryStart(ms(0)));
  hub.gradient(ms(1));
  CHECK_FALSE(hub.engine.tryFinish(ms(19)));
  const auto record = hub.engine.tryFinish(ms(20));
  REQUIRE(record);
  CHECK(record->reason == CutoffReason::Deadline);
  CHECK(record->responders.empty());
  CHECK(record->selfWeight == 1.0);
}

TEST_CASE("quantile: cuts off at the pooled quantile of recorded arrivals") {
  EngineOptions options = withPolicy(PolicyKind::Quantile);
  options.policy.quantile = 0.5;
  Hub hub(options);
  for (std::int64_t k = 0; k < 5; ++k) {
    const double t0 = 10.0 * static_cast<double>(k);
    REQUIRE(hub.engine.tryStart(ms(t0)));
    hub.gradient(ms(t0));
    for (std::size_t j = 1; j <= 4; ++j) hub.send(j, k, 0.0, ms(t0 + static_cast<double>(j)));
    REQUIRE(hub.engine.tryFinish(ms(t0 + 4)));
  }
  REQUIRE(hub.engine.tryStart(ms(50)));
  REQUIRE(hub.engine.decision().cutoff);
  CHECK(*hub.engine.decision().cutoff == hub.engine.arrivals().pooledQuantile(0.5));
  CHECK(*hub.engine.decision().cutoff >= milliseconds(2));
  CHECK(*hub.engine.decision().cutoff <= milliseconds(3));
}

TEST_CASE("late, stale, duplicate and future estimates") {
  EngineOptions options = withPolicy(PolicyKind::Static);
  options.policy.backups = 3;
  options.staleness = 1;
  Hub hub(options);
  REQUIRE(hub.engine.tryStart(ms(0)));
  hub.gradient(ms(0));
  hub.send(1, 0, 1.0, ms(1));
  REQUIRE(hub.engine.tryFinish(ms(1)));
  // n2's round-0 estimate comes after our cut-off: late, still fresh for round 1 (s = 1).
  hub.send(2, 0, 2.0, ms(2));
  CHECK(hub.engine.counters(1).late == 1);
  REQUIRE(hub.engine.tryStart(ms(2)));
  hub.gradient(ms(2));
  const auto record = hub.engine.tryFinish(ms(2));
  REQUIRE(record);
  CHECK(record->responders == std::vector<std::size_t>{1, 2});  // n1's round 0 is fresh too
  // Round 2: round-0 estimates are now older than k - s.
  REQUIRE(hub.engine.tryStart(ms(3)));
  const Eigen::VectorXd old = Eigen::VectorXd::Constant(3, 9.0);
  CHECK(hub.engine.onEstimate(3, 0, old.data(), ms(3)) == Receipt::Stale);
  CHECK(hub.engine.counters(2).stale == 1);
  hub.send(3, 2, 1.0, ms(3));
  CHECK(hub.engine.onEstimate(3, 2, old.data(), ms(3)) == Receipt::Duplicate);
  CHECK(hub.engine.counters(2).duplicate == 1);
  // A neighbour from the future (round 7) is usable with `newest` mixing.
  hub.send(4, 7, 1.0, ms(3));
  hub.gradient(ms(3));
  const auto future = hub.engine.tryFinish(ms(3));
  REQUIRE(future);
  CHECK(std::count(future->responders.begin(), future->responders.end(), 4u) == 1);
  CHECK(hub.engine.onEstimate(0, 2, old.data(), ms(3)) == Receipt::NotNeighbor);
}

TEST_CASE("same mixing uses exactly the round-k estimates, newest the newest fresh ones") {
  for (const MixRound mode : {MixRound::Same, MixRound::Newest}) {
    CAPTURE(static_cast<int>(mode));
    EngineOptions options = withPolicy(PolicyKind::Static);
    options.policy.backups = 3;
    options.mixRound = mode;
    Hub hub(options);
    // n1 is ahead: rounds 0, 1 and 2 arrive before we finish round 0.
    hub.send(1, 0, 1.0, ms(0));
    hub.send(1, 1, 10.0, ms(0));
    hub.send(1, 2, 100.0, ms(0));
    REQUIRE(hub.engine.tryStart(ms(0)));
    hub.gradient(ms(0));
    REQUIRE(hub.engine.tryFinish(ms(0)));
    // Self (at 0) and the one neighbour in share the weights equally.
    const double expected = mode == MixRound::Same ? 0.5 * 1.0 : 0.5 * 100.0;
    CHECK(hub.engine.params()[0] == doctest::Approx(expected));
  }
  // `same` falls back to the newest when the neighbour is ahead beyond the ring.
  EngineOptions options = withPolicy(PolicyKind::Static);
  options.policy.backups = 3;
  options.mixRound = MixRound::Same;
  options.mailboxDepth = 2;
  Hub hub(options);
  for (std::int64_t r = 0; r < 5; ++r) hub.send(1, r, static_cast<double>(r), ms(0));
  REQUIRE(hub.engine.tryStart(ms(0)));
  hub.gradient(ms(0));
  REQUIRE(hub.engine.tryFinish(ms(0)));
  CHECK(hub.engine.params()[0] == doctest::Approx(0.5 * 4.0));
}

TEST_CASE("mixing weights: non-negative and summing to 1 for every responder set") {
  for (const auto& [kind, nodes] : std::vector<std::pair<std::string, std::size_t>>{
           {"random-regular", 10}, {"star", 6}, {"exponential", 8}, {"chain", 5}}) {
    const Topology topology = graph(kind, nodes);
    for (std::size_t i = 0; i < topology.size(); ++i) {
      const auto& in = topology.inNeighbors(i);
      for (std::uint32_t subset = 0; subset < (1u << in.size()); ++subset) {
        std::vector<MixInput> inputs;
        double sum = 0;
        for (std::size_t k = 0; k < in.size(); ++k) {
          if ((subset >> k & 1u) == 0) continue;
          inputs.push_back({nullptr, in[k].weight});
          CHECK(in[k].weight >= 0);
          sum += in[k].weight;
        }
        const double self = absorbSelfWeight(inputs);
        CHECK(self >= 0);
        CHECK(self + sum == doctest::Approx(1.0).epsilon(1e-12));
      }
    }
  }
}

TEST_CASE("renormalize: with uniform weights, the plain average of self and those in") {
  for (const std::vector<double>& values :
       std::vector<std::vector<double>>{{1.0}, {1.0, 3.0}, {1.0, 3.0, 5.0, 7.0}}) {
    CAPTURE(values.size());
    EngineOptions options = withPolicy(PolicyKind::Static);
    options.policy.backups = static_cast<std::int64_t>(4 - values.size());
    options.mixMode = MixMode::Renormalize;  // the default, named: this test is about it
    Hub hub(options);
    double sum = 0;
    for (std::size_t k = 0; k < values.size(); ++k) {
      hub.send(k + 1, 0, values[k], ms(0));
      sum += values[k];
    }
    REQUIRE(hub.engine.tryStart(ms(0)));
    hub.gradient(ms(0));
    const auto record = hub.engine.tryFinish(ms(0));
    REQUIRE(record);
    // Own estimate 0 and the k in, each at 1 / (k + 1) (all four in: the topology's 1/5).
    const double share = 1.0 / static_cast<double>(values.size() + 1);
    CHECK(record->selfWeight == doctest::Approx(share));
    CHECK(hub.engine.params()[0] == doctest::Approx(share * sum));
  }
}

TEST_CASE("absorb: a missing neighbour's weight stays with self") {
  EngineOptions options = withPolicy(PolicyKind::Static);
  options.policy.backups = 3;
  options.mixMode = MixMode::Absorb;
  Hub hub(options);
  hub.send(1, 0, 10.0, ms(0));
  REQUIRE(hub.engine.tryStart(ms(0)));
  hub.gradient(ms(0));
  const auto record = hub.engine.tryFinish(ms(0));
  REQUIRE(record);
  CHECK(record->selfWeight == doctest::Approx(0.8));
  CHECK(hub.engine.params()[0] == doctest::Approx(0.2 * 10.0));
}

TEST_CASE("the fused mix computes the weighted sum in one pass") {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  const std::size_t n = 10000;
  std::vector<std::vector<float>> inputs(3, std::vector<float>(n));
  std::vector<float> self(n);
  for (auto& v : inputs) std::generate(v.begin(), v.end(), [&] { return normal(rng); });
  std::generate(self.begin(), self.end(), [&] { return normal(rng); });
  const std::vector<MixInput> terms{
      {inputs[0].data(), 0.2}, {inputs[1].data(), 0.3}, {inputs[2].data(), 0.1}};
  std::vector<float> out(n);
  fusedMix(self.data(), 0.4, terms, out.data(), n);
  for (std::size_t i = 0; i < n; i += 997) {
    const double expected = 0.4 * double{self[i]} + 0.2 * double{inputs[0][i]} +
                            0.3 * double{inputs[1][i]} + 0.1 * double{inputs[2][i]};
    CHECK(out[i] == doctest::Approx(expected).epsilon(1e-5));
  }
  fusedMix(self.data(), 0.4, terms, self.data(), n);  // in place
  CHECK(self[0] == out[0]);
}

TEST_CASE("trimmed mean: per coordinate, the extremes dropped and the rest averaged") {
  // 5,000 coordinates (more than one block), a liar sending 1e30 or -1e30.
  std::mt19937 rng(5);
  std::normal_distribution<double> normal;
  const std::size_t n = 5000;
  for (const std::size_t degree : {std::size_t{2}, std::size_t{4}, std::size_t{7}}) {
    for (const std::size_t trim : {std::size_t{1}, std::size_t{2}}) {
      CAPTURE(degree);
      CAPTURE(trim);
      std::vector<std::vector<double>> inputs(degree, std::vector<double>(n));
      std::vector<double> self(n);
      for (auto& v : inputs) std::generate(v.begin(), v.end(), [&] { return normal(rng); });
      std::generate(self.begin(), self.end(), [&] { return normal(rng); });
      for (std::size_t i = 0; i < n; i += 3) inputs[0][i] = i % 2 == 0 ? 1e30 : -1e30;
      for (std::size_t i = 1; i < n; i += 7) inputs[degree - 1][i] = self[i];  // ties
      std::vector<MixInput> terms;
      for (const auto& v : inputs) terms.push_back({v.data(), 0.0});
      std::vector<double> out(n);
      trimmedMean(self.data(), terms, trim, out.data(), n);
      if (degree + 1 <= 2 * trim) {
        CHECK(out == self);  // too few values to trim: keep our own
        continue;
      }
      for (std::size_t i = 0; i < n; ++i) {
        std::vector<double> values{self[i]};
        for (const auto& v : inputs) values.push_back(v[i]);
        std::sort(values.begin(), values.end());
        double sum = 0;
        for (std::size_t k = trim; k < values.size() - trim; ++k) sum += values[k];
        const double expected = sum / static_cast<double>(values.size() - 2 * trim);
        if (out[i] != doctest::Approx(expected)) {
          CHECK(out[i] == doctest::Approx(expected));
          break;
        }
      }
      trimmedMean(self.data(), terms, trim, self.data(), n);  // in place
      CHECK(self == out);
    }
  }
}

TEST_CASE("clipping: each neighbour's pull limited to the radius, the lower median by default") {
  // Self at 0; neighbours at distance 1, 2 and 100 along one axis.
  const std::vector<float> self(4, 0.0f);
  const std::vector<std::vector<float>> at{{1, 0, 0, 0}, {0, 2, 0, 0}, {0, 0, 0, 100}};
  std::vector<MixInput> terms;
  for (const auto& v : at) terms.push_back({v.data(), 0.25});
  CHECK(clipWeights(self.data(), terms, 0.0, 4) == doctest::Approx(2.0));
  CHECK(terms[0].weight == doctest::Approx(0.25));
  CHECK(terms[1].weight == doctest::Approx(0.25));
  CHECK(terms[2].weight == doctest::Approx(0.25 * 2 / 100));
  CHECK(clipWeights(self.data(), terms, 0.5, 4) == doctest::Approx(0.5));
  CHECK(terms[0].weight == doctest::Approx(0.125));
}

TEST_CASE(
    "step size 0, symmetric W, everyone answering: mean kept, disagreement shrinks by SLEM^2") {
  const Topology topology = graph("ring", 8);
  const double slem = consensusd::topology::analyze(topology).slem;
  EngineOptions options = withPolicy(PolicyKind::All);
  std::vector<std::unique_ptr<Engine>> engines;
  std::mt19937 rng(7);
  std::normal_distribution<double> normal;
  for (std::size_t i = 0; i < 8; ++i) {
    Eigen::VectorXd start(4);
    for (auto& v : start) v = normal(rng);
    engines.push_back(
        std::make_unique<Engine>(topology, i, options, rate(0.0), 0.0, start, Time{}));
  }
  const auto stats = [&] {
    Eigen::VectorXd mean = Eigen::VectorXd::Zero(4);
    for (const auto& e : engines) mean += e->params() / 8.0;
    double disagreement = 0;
    for (const auto& e : engines) disagreement += (e->params() - mean).squaredNorm();
    return std::pair{mean, disagreement};
  };
  auto [mean0, before] = stats();
  for (int k = 0; k < 30; ++k) {
    const Time now = ms(k);
    for (std::size_t i = 0; i < 8; ++i) {
      const auto start = engines[i]->tryStart(now);
      REQUIRE(start);
      for (const auto& out : topology.outNeighbors(i))
        engines[out.index]->onEstimate(i, start->round, start->params->data(), now);
    }
    for (auto& e : engines) {
      e->onGradient(k, Eigen::VectorXd::Zero(4), 0.0, GradientStats{}, now);
      REQUIRE(e->tryFinish(now));
    }
    const auto [mean, after] = stats();
    CHECK((mean - mean0).norm() < 1e-12);
    CHECK(after <= slem * slem * before * (1 + 1e-9));
    before = after;
  }
}

TEST_CASE("E[T(m)] matches the closed form for shifted-exponential arrivals") {
  const std::size_t n = 6;
  const double shift = 2.0;
  const double mean = 3.0;  // ms of the exponential part
  ArrivalHistory history(n, 20000, milliseconds(1000));
  std::mt19937_64 rng(11);
  std::exponential_distribution<double> exponential(1.0 / mean);
  for (int r = 0; r < 20000; ++r) {
    ArrivalHistory::Round round;
    round.round = r;
    for (std::size_t j = 0; j < n; ++j) {
      round.offsets.push_back(ms(shift + exponential(rng)));
      round.censored.push_back(false);
    }
    history.record(std::move(round));
  }
  for (std::size_t m = 1; m <= n; ++m) {
    // E[A_(m)] = shift + mean * sum_{i<m} 1 / (n - i)
    double expected = shift;
    for (std::size_t i = 0; i < m; ++i) expected += mean / static_cast<double>(n - i);
    const double measured =
        std::chrono::duration<double, std::milli>(history.expectedRoundTime(m)).count();
    CHECK(measured == doctest::Approx(expected).epsilon(0.02));
  }
}

TEST_CASE("late arrivals complete censored records and silent neighbours count at the cap") {
  ArrivalHistory history(2, 10, milliseconds(100));
  ArrivalHistory::Round round;
  round.round = 4;
  round.start = ms(10);
  round.offsets = {ms(1), ms(5)};
  round.censored = {false, true};
  history.record(round);
  CHECK(history.expectedRoundTime(2) == milliseconds(100));
  // Still missing 6 ms after the round start: at least that late, no later yet.
  CHECK(history.expectedRoundTime(2, ms(16)) == milliseconds(6));
  CHECK(history.expectedRoundTime(2, ms(500)) == milliseconds(100));
  history.observeLate(1, 4, ms(18));
  CHECK(history.expectedRoundTime(2) == milliseconds(8));
  CHECK(history.expectedRoundTime(0) == Duration::zero());
}

namespace {

struct HubChoices {
  double early = 0;  // mean m chosen in rounds 15-40
  double late = 0;   // ... and 500-600
};

// One hub with 4 neighbours that always answer, neighbour j at 1 + (j - 1) *
// `spacing` ms with the hub's own estimate off by `disagreement` in every
// coordinate (up and down in turn, so the hub does not drift); F(x) =
// |x|^2 / 2 from far away, gradients with noise.
HubChoices hubChoices(bool noiseTerm, double spacing, double disagreement = 0.0) {
  EngineOptions options;
  options.policy.kind = PolicyKind::Dynamic;
  options.policy.noiseTerm = noiseTerm;
  options.roundSkipping = false;
  options.warmupRounds = 10;
  options.windowRounds = 50;
  options.batchSize = 1;
  const Topology topology = graph("star", 5);
  const std::size_t dimension = 20;
  Engine engine(topology, 0, options, rate(0.05), 0.0, Eigen::VectorXd::Constant(dimension, 30.0),
                Time{});
  std::mt19937_64 rng(5);
  std::normal_distribution<double> normal;
  const double sigma = 1.0;  // per coordinate
  std::vector<std::size_t> chosen;
  for (std::int64_t k = 0; k < 600; ++k) {
    const double t0 = 10.0 * static_cast<double>(k);
    const auto start = engine.tryStart(ms(t0));
    REQUIRE(start);
    const Eigen::VectorXd x = *start->params;
    Eigen::VectorXd g = x;
    for (auto& v : g) v += sigma * normal(rng);
    GradientStats stats;
    stats.gradNormSq = g.squaredNorm();
    stats.sampleVariance = sigma * sigma * static_cast<double>(dimension);
    engine.onGradient(k, g, 0.5 * x.squaredNorm(), stats, ms(t0 + 0.5));
    const Eigen::VectorXd estimate = x.array() + (k % 2 == 0 ? disagreement : -disagreement);
    for (std::size_t j = 1; j <= 4; ++j) {
      engine.onEstimate(j, k, estimate.data(), ms(t0 + 1.0 + static_cast<double>(j - 1) * spacing));
    }
    const auto record = engine.tryFinish(ms(t0 + 4));
    REQUIRE(record);
    chosen.push_back(record->target);
  }
  const auto average = [&](std::size_t from, std::size_t to) {
    double sum = 0;
    for (std::size_t k = from; k < to; ++k) sum += static_cast<double>(chosen[k]);
    return sum / static_cast<double>(to - from);
  };
  CHECK(engine.gradients().smoothness() == doctest::Approx(1.0).epsilon(0.5));
  return {average(15, 40), average(500, 600)};
}

}  // namespace

TEST_CASE("dynamic with DBW's noise term: few neighbours early, more late, on a noisy quadratic") {
  const HubChoices choices = hubChoices(true, 1.0);
  CAPTURE(choices.early);
  CAPTURE(choices.late);
  CHECK(choices.early <= 1.5);
  CHECK(choices.late >= 2.0);
  CHECK(choices.late >= choices.early + 1.0);
}

TEST_CASE("dynamic (default): no noise term, so the fastest neighbour while they agree") {
  // Arrivals 0.1 ms apart: waiting for all four costs 30% more than for one,
  // and with neighbours that agree nothing is gained by it, early or late.
  const HubChoices agree = hubChoices(false, 0.1);
  CAPTURE(agree.early);
  CAPTURE(agree.late);
  CHECK(agree.early <= 1.2);
  CHECK(agree.late <= 1.2);
}

TEST_CASE("dynamic: neighbours that disagree are worth waiting for once descent slows") {
  // Each neighbour's estimate is mixed in and discarded before the next round
  // starts, so their distances come from the last estimates seen: without
  // them the consensus pull only counted neighbours already in, which cost
  // no waiting, and the rule took the fastest neighbour here too. Under
  // renormalize (the default) k of 4 in pull by k / (k + 1) of the
  // disagreement, so three (0.75 at 1.2 ms) edge out four (0.8 at 1.3 ms).
  const HubChoices disagree = hubChoices(false, 0.1, 1.0);
  CAPTURE(disagree.early);
  CAPTURE(disagree.late);
  CHECK(disagree.early <= 1.5);
  CHECK(disagree.late >= 2.5);
}

namespace {

// One round of the window: our compute time and every neighbour's arrival offset.
void recordArrivals(ArrivalHistory& history, std::int64_t round, Duration compute,
                    std::vector<Duration> offsets) {
  ArrivalHistory::Round record;
  record.round = round;
  record.compute = compute;
  record.censored.assign(offsets.size(), false);
  record.offsets = std::move(offsets);
  history.record(std::move(record));
}

}  // namespace

TEST_CASE("forecast: every neighbour in by the cut-off is mixed, not only the m waited for") {
  // Slots 0 and 1 always arrive together at 5 ms; slot 2 at 50 ms in even
  // rounds and at 2 ms in odd ones; our own gradient takes 1 ms.
  ArrivalHistory history(3, 10, milliseconds(1000));
  for (std::int64_t r = 0; r < 10; ++r)
    recordArrivals(history, r, ms(1), {ms(5), ms(5), ms(r % 2 == 0 ? 50 : 2)});
  const ArrivalHistory::Forecast forecast = history.forecast({0, 1, 2});
  REQUIRE(forecast.roundTime.size() == 4);
  CHECK(forecast.roundTime[0] == ms(1));
  CHECK(forecast.roundTime[1] == ms(3.5));  // 5 ms in even rounds, 2 ms in odd ones
  CHECK(forecast.roundTime[3] == ms(27.5));
  // Waiting for one: both 5 ms arrivals come together in even rounds.
  CHECK(forecast.inTime[1] == std::vector<double>{0.5, 0.5, 0.5});
  CHECK(forecast.inTime[2] == std::vector<double>{1.0, 1.0, 0.5});
  CHECK(forecast.inTime[3] == std::vector<double>{1.0, 1.0, 1.0});
  CHECK(forecast.inTime[0] == std::vector<double>{0.0, 0.0, 0.0});
}

TEST_CASE("forecast: a spike seen once per neighbour prices a wait no round showed yet") {
  // Four neighbours at 1 ms; each is 100 ms late in one round of 20, never
  // two in the same round. Whole rounds say that waiting for three costs
  // 1 ms; by the neighbours' own records two are late together with
  // P = 1 - 0.95^4 - 4 x 0.05 x 0.95^3. The forecast takes halfway.
  ArrivalHistory history(4, 20, milliseconds(1000));
  for (std::int64_t r = 0; r < 20; ++r) {
    std::vector<Duration> offsets(4, ms(1));
    if (r % 5 == 0) offsets[static_cast<std::size_t>(r / 5)] = ms(100);
    recordArrivals(history, r, ms(1), offsets);
  }
  const ArrivalHistory::Forecast forecast = history.forecast({0, 1, 2, 3});
  const double late = 1 - std::pow(0.95, 4) - 4 * 0.05 * std::pow(0.95, 3);
  const auto millis = [](Duration d) {
    return std::chrono::duration<double, std::milli>(d).count();
  };
  CHECK(millis(forecast.roundTime[3]) == doctest::Approx(1 + late * 99 / 2).epsilon(1e-6));
  // Waiting for all four: late in 4 rounds of 20, what the rounds show;
  // independence says less (1 - 0.95^4), so it does not count.
  CHECK(millis(forecast.roundTime[4]) == doctest::Approx(1 + 0.2 * 99).epsilon(1e-6));
}

TEST_CASE("forecast: neighbours late together are priced between whole rounds and independence") {
  // Both neighbours are 50 ms late in the same rounds, half of them. Whole
  // rounds: 26 ms for one or both. Independent neighbours: both late in a
  // quarter of the rounds (14 ms for one: earlier, not taken), one late in
  // three quarters (38 ms for both: halfway, 32 ms).
  ArrivalHistory history(2, 10, milliseconds(1000));
  for (std::int64_t r = 0; r < 10; ++r) {
    const Duration offset = ms(r % 2 == 0 ? 50 : 2);
    recordArrivals(history, r, ms(1), {offset, offset});
  }
  const ArrivalHistory::Forecast forecast = history.forecast({0, 1});
  CHECK(forecast.roundTime[1] == ms(26));
  CHECK(forecast.roundTime[2] == ms(32));
}

TEST_CASE("forecast: the independent estimate equals every combination of recorded values") {
  // Three neighbours and the compute, six rounds of distinct random values:
  // independence is the mean of max(C, A_(m)) over all 6^4 ways of drawing
  // each from its own record (the sweep updates the count of neighbours in
  // one value at a time, dividing a chance out: both ways of dividing run).
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> micros(1, 40'000);
  const auto us = [](int v) { return Duration(std::chrono::microseconds(v)); };
  ArrivalHistory history(3, 6, milliseconds(1000));
  std::vector<std::vector<int>> values(4);  // C, then each neighbour
  for (std::int64_t r = 0; r < 6; ++r) {
    for (auto& record : values) record.push_back(micros(rng));
    recordArrivals(history, r, us(values[0].back()),
                   {us(values[1].back()), us(values[2].back()), us(values[3].back())});
  }
  std::vector<double> whole(4, 0.0);
  std::vector<double> independent(4, 0.0);
  std::vector<std::vector<double>> inTime(4, std::vector<double>(3, 0.0));
  for (std::size_t r = 0; r < 6; ++r) {
    std::vector<int> sorted{values[1][r], values[2][r], values[3][r]};
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t m = 0; m <= 3; ++m) {
      const int cutoff = std::max(values[0][r], m == 0 ? 0 : sorted[m - 1]);
      whole[m] += cutoff / 6.0;
      for (std::size_t k = 0; k < 3; ++k) inTime[m][k] += values[k + 1][r] <= cutoff ? 1 : 0;
    }
  }
  for (std::size_t c = 0; c < 6; ++c) {
    for (std::size_t a = 0; a < 6; ++a) {
      for (std::size_t b = 0; b < 6; ++b) {
        for (std::size_t d = 0; d < 6; ++d) {
          std::vector<int> sorted{values[1][a], values[2][b], values[3][d]};
          std::sort(sorted.begin(), sorted.end());
          for (std::size_t m = 0; m <= 3; ++m)
            independent[m] += std::max(values[0][c], m == 0 ? 0 : sorted[m - 1]) / 1296.0;
        }
      }
    }
  }
  const ArrivalHistory::Forecast forecast = history.forecast({0, 1, 2});
  for (std::size_t m = 0; m <= 3; ++m) {
    const double expected = std::max(whole[m], (whole[m] + independent[m]) / 2);
    CHECK(std::chrono::duration<double, std::micro>(forecast.roundTime[m]).count() ==
          doctest::Approx(expected).epsilon(1e-7));  // whole ns
    for (std::size_t k = 0; k < 3; ++k) CHECK(forecast.inTime[m][k] == inTime[m][k] / 6.0);
  }
}

TEST_CASE("heterogeneity: the pull back along the node's own gradient, not its noise or a lag") {
  // Gradients g = c + noise (20 coordinates, ||c||^2 = 4, sd 0.1 each) and
  // mixing displacements d = eta * lag * c + noise (sd 0.01), fed as the
  // engine does: d . g with eta = 0.1.
  const auto measure = [](double lag) {
    GradientEstimator gradients(50, 1);
    gradients.record(4.0, 0.0);  // ||grad F||^2 = 4
    std::mt19937_64 rng(3);
    std::normal_distribution<double> normal(0.0, 1.0);
    const Eigen::VectorXd c = Eigen::VectorXd::Constant(20, std::sqrt(0.2));
    for (int k = 0; k < 400; ++k) {
      Eigen::VectorXd g = c;
      Eigen::VectorXd d = 0.1 * lag * c;
      for (Eigen::Index i = 0; i < 20; ++i) {
        g[i] += 0.1 * normal(rng);
        d[i] += 0.01 * normal(rng);
      }
      gradients.recordPull(d.dot(g), 0.1);
    }
    return gradients;
  };
  // Skewed data: the neighbours pull back the whole step (d = eta c).
  const GradientEstimator skewed = measure(1.0);
  CHECK(skewed.heterogeneity() == doctest::Approx(4.0).epsilon(0.1));
  CHECK(skewed.progressNormSq() <= 0.4);   // most of the gradient is pulled back
  CHECK(skewed.progressNormSq() >= 0.04);  // never below 1% of it
  // Neighbours three steps ahead on the same data pull along -g: not heterogeneity.
  const GradientEstimator ahead = measure(-3.0);
  CHECK(ahead.heterogeneity() == 0.0);
  CHECK(ahead.progressNormSq() == doctest::Approx(4.0));
  // Only noise: close to zero.
  const GradientEstimator iid = measure(0.0);
  CHECK(iid.heterogeneity() < 0.1);
  CHECK(iid.progressNormSq() > 3.9);
}

// Four neighbours of weight 0.2 (self 0.2), neighbour j in at 1 + (j - 1) *
// `spacing` ms, our gradient at 0.5 ms: E[T(m)] = 1 + (m - 1) * spacing ms,
// over `rounds` rounds of a 50-round window. Each at squared distance
// `distanceSq` (-1: unknown); L = 2 when `curvature`.
struct StaircaseContext {
  ArrivalHistory arrivals{4, 50, milliseconds(1000)};
  GradientEstimator gradients{50, 1};
  std::vector<NeighborView> neighbors;
  PolicyContext context;

  StaircaseContext(const StaircaseContext&) = delete;  // the context points into it
  StaircaseContext(double distanceSq, bool curvature, double spacing = 1.0,
                   std::int64_t rounds = 50) {
    for (std::int64_t r = 0; r < rounds; ++r) {
      recordArrivals(arrivals, r, ms(0.5),
                     {ms(1), ms(1 + spacing), ms(1 + 2 * spacing), ms(1 + 3 * spacing)});
    }
    for (int k = 0; k < 5; ++k) {
      gradients.record(10.0, 0.0);
      if (curvature) gradients.recordStep(2.0, 1.0);
    }
    for (std::size_t j = 0; j < 4; ++j) neighbors.push_back({j, 0.2, true, distanceSq});
    context.round = 100;
    context.degree = context.live = context.maxCount = 4;
    context.minCount = 1;
    context.learningRate = 0.05;
    context.neighbors = &neighbors;
    context.arrivals = &arrivals;
    context.gradients = &gradients;
  }
};

TEST_CASE("dynamic: a tie that only the lead-bound floor makes keeps the fewest neighbours") {
  StaircaseContext staircase(-1.0, false);
  PolicyContext& context = staircase.context;
  const auto policy = makePolicy(PolicySpec{}, 0);
  CHECK(policy->decide(context).count == 1);  // the gain is the same, m = 1 is quickest
  // Held by the lead bound to 10 ms a round: every m costs the same 10 ms,
  // but waiting for more would make this node slower than the floor it sees.
  context.leadFloor = ms(10.0);
  const std::vector<DynamicScore> scores = dynamicScores(context);
  REQUIRE(scores.size() == 4);
  CHECK(scores.front().rho == scores.back().rho);
  CHECK(policy->decide(context).count == 1);
}

TEST_CASE("dynamic: rates within the tie margin go to more neighbours once the window is full") {
  const auto policy = makePolicy(PolicySpec{}, 0);
  // All four cost 3% more time than one (the gain is the same): a tie.
  StaircaseContext close(-1.0, false, 0.01);
  CHECK(policy->decide(close.context).count == 4);
  // 20 rounds cannot show that such a wait is cheap: the best rate alone.
  StaircaseContext young(-1.0, false, 0.01, 20);
  CHECK(policy->decide(young.context).count == 1);
  // Two cost 2% more than one, three 4%, four 6%: all but the last are in.
  StaircaseContext wider(-1.0, false, 0.02);
  CHECK(policy->decide(wider.context).count == 3);
  // Without the margin, the best rate alone.
  PolicySpec strict;
  strict.tieMargin = 0.0;
  CHECK(makePolicy(strict, 0)->decide(close.context).count == 1);
}

TEST_CASE("dynamic: with renormalize, a neighbour is priced at the weight the mix gives it") {
  StaircaseContext staircase(1.0, true);
  PolicyContext& context = staircase.context;
  // The pull term L/2 sum w ||x_j - x_i||^2 for m = 1 and m = 4: absorb gives
  // the one in 0.2 (pull 0.2 against 0.8), renormalize 0.5 (0.5 against 0.8).
  const std::vector<DynamicScore> absorb = dynamicScores(context);
  context.renormalizeSelf = 0.2;
  const std::vector<DynamicScore> renormalize = dynamicScores(context);
  REQUIRE(absorb.size() == 4);
  REQUIRE(renormalize.size() == 4);
  CHECK(renormalize[0].gain - absorb[0].gain == doctest::Approx(0.3));
  CHECK(renormalize[3].gain == doctest::Approx(absorb[3].gain));
}

TEST_CASE("dynamic: when more neighbours cost no time, it waits for all of them") {
  // All four arrive together: E[T(m)] is the same for every m, and of equal
  // scores the rule takes the most neighbours (strictly better scores only
  // took the fewest, against the intent of the lead-bound floor).
  const HubChoices together = hubChoices(false, 0.0);
  CAPTURE(together.early);
  CAPTURE(together.late);
  CHECK(together.early == 4.0);
  CHECK(together.late == 4.0);
}

TEST_CASE("dynamic: neighbours a phase behind, in with our own gradient, are waited for") {
  // n1 keeps our phase; n2..n4 send each round's estimate just as our own
  // gradient is done. Waiting for one (static), we move on first, so theirs
  // come in a round too old to mix. They must still count as late (not as
  // never), and the round just ended as due now (not at the hard deadline),
  // or the rule sees seconds where waiting costs nothing, and never mixes them.
  EngineOptions options = withPolicy(PolicyKind::Static);
  options.policy.backups = 3;
  const Topology topology = graph("star", 5);
  Engine engine(topology, 0, options, rate(0.05), 0.0, Eigen::VectorXd::Zero(3), Time{});
  const Eigen::VectorXd estimate = Eigen::VectorXd::Constant(3, 1.0);
  GradientStats stats;
  stats.gradNormSq = 1.0;
  std::vector<std::size_t> mixed;
  REQUIRE(engine.tryStart(ms(0)));
  for (std::int64_t k = 0; k < 200; ++k) {
    if (k == 100) engine.setPolicy(PolicySpec{});  // dynamic from round 101
    const double t0 = 10.0 * static_cast<double>(k);
    engine.onEstimate(1, k, estimate.data(), ms(t0 + 0.1));
    engine.onGradient(k, Eigen::VectorXd::Ones(3), 0.0, stats, ms(t0 + 10));
    std::optional<RoundRecord> record = engine.tryFinish(ms(t0 + 10));
    if (record) REQUIRE(engine.tryStart(ms(t0 + 10)));  // before theirs are in
    for (std::size_t j = 2; j <= 4; ++j) engine.onEstimate(j, k, estimate.data(), ms(t0 + 10));
    if (!record) {
      record = engine.tryFinish(ms(t0 + 10));
      REQUIRE(record);
      REQUIRE(engine.tryStart(ms(t0 + 10)));
    }
    mixed.push_back(record->responders.size());
  }
  CHECK(engine.counters(2).stale >= 99);
  CHECK(mixed[99] == 1);
  CHECK(std::all_of(mixed.begin() + 105, mixed.end(), [](std::size_t n) { return n == 4; }));
}

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
    void started(std::int64_t round, const Eigen::VectorXd& params) {
      for (const auto& out : net.topology.outNeighbors(i)) {
        net.at(now + net.latencyMs, [n = &net, from = i, to = out.index, round,
                                     values = Eigen::VectorXd(params)](double t) {
          n->engines[to]->onEstimate(from, round, values.data(), ms(t));
          n->poke(to, t);
        });
      }
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

TEST_CASE("the policy can be switched between rounds") {
  Hub hub(withPolicy(PolicyKind::All));
  REQUIRE(hub.engine.tryStart(ms(0)));
  CHECK(hub.engine.decision().count == 4);
  PolicySpec spec;
  spec.kind = PolicyKind::Static;
  spec.backups = 2;
  hub.engine.setPolicy(spec);
  CHECK(hub.engine.decision().count == 4);  // the running round keeps its decision
  hub.gradient(ms(1));
  for (std::size_t j = 1; j <= 4; ++j) hub.send(j, 0, 0.0, ms(1));
  REQUIRE(hub.engine.tryFinish(ms(1)));
  REQUIRE(hub.engine.tryStart(ms(2)));
  CHECK(hub.engine.decision().count == 2);
}

TEST_CASE("straggler models: seeded draws with the right means and schedule") {
  const auto meanMs = [](StragglerSpec spec, std::int64_t rounds = 20000) {
    Straggler straggler(spec);
    double total = 0;
    for (std::int64_t k = 0; k < rounds; ++k) {
      total += std::chrono::duration<double, std::milli>(straggler.extraDelay(k, milliseconds(10)))
                   .count();
    }
    return total / static_cast<double>(rounds);
  };
  StragglerSpec spec;
  CHECK(meanMs(spec) == 0.0);
  spec.kind = StragglerKind::Constant;
  spec.delay = milliseconds(5);
  CHECK(meanMs(spec) == doctest::Approx(5.0));
  spec.kind = StragglerKind::ShiftedExponential;
  spec.mean = milliseconds(3);
  CHECK(meanMs(spec) == doctest::Approx(8.0).epsilon(0.03));
  spec.kind = StragglerKind::Pareto;
  spec.paretoShape = 3.0;  // mean = x_m alpha / (alpha - 1)
  CHECK(meanMs(spec) == doctest::Approx(7.5).epsilon(0.05));
  spec.kind = StragglerKind::Bimodal;  // 0.1 x (20 - 1) x 10 ms
  CHECK(meanMs(spec) == doctest::Approx(19.0).epsilon(0.08));
  spec.fromRound = 100;
  spec.toRound = 199;
  Straggler scheduled(spec);
  Straggler again(spec);
  for (std::int64_t k = 0; k < 300; ++k) {
    const Duration d = scheduled.extraDelay(k, milliseconds(10));
    CHECK(d == again.extraDelay(k, milliseconds(10)));
    if (k < 100 || k > 199) CHECK(d == Duration::zero());
  }
}

TEST_CASE("plausible rounds: a far-future or negative round is refused and changes nothing") {
  EngineOptions options = withPolicy(PolicyKind::All);
  options.peerTimeout = milliseconds(100);
  Hub hub(options);
  // A neighbour that hears us directly is at most max_lead + skip_ahead + 1 ahead.
  CHECK(hub.engine.horizon(0) == options.maxLead + options.skipAhead + 1);
  const Eigen::VectorXd lie = Eigen::VectorXd::Constant(3, 1e6);
  constexpr std::int64_t kFar = std::int64_t{1} << 62;
  CHECK(hub.engine.onEstimate(1, kFar, lie.data(), ms(0)) == Receipt::Implausible);
  CHECK(hub.engine.onEstimate(1, -5, lie.data(), ms(0)) == Receipt::Implausible);
  CHECK(hub.engine.onKeepAlive(2, std::numeric_limits<std::int64_t>::max(), ms(0)) ==
        Receipt::Implausible);
  CHECK(hub.engine.onDecision(3, kFar, true, ms(0)) == Receipt::Implausible);
  CHECK(hub.engine.newestRound(0) == -1);
  CHECK(hub.engine.newestRound(1) == -1);
  CHECK(hub.engine.counters(0).onTime == 0);
  // The round goes on with the real estimates, and none of the lie is mixed.
  REQUIRE(hub.engine.tryStart(ms(1)));
  hub.gradient(ms(1));
  for (std::size_t j = 1; j <= 4; ++j) hub.send(j, 0, 1.0, ms(2));
  const auto record = hub.engine.tryFinish(ms(2));
  REQUIRE(record);
  CHECK(record->responders.size() == 4);
  CHECK(hub.engine.params()[0] == doctest::Approx(0.8));
  CHECK(hub.engine.round() == 1);
}

TEST_CASE("plausible rounds: a lie between a live neighbour's messages is never believed") {
  EngineOptions options = withPolicy(PolicyKind::All);
  options.peerTimeout = milliseconds(100);
  Hub hub(options);
  const Eigen::VectorXd values = Eigen::VectorXd::Constant(3, 1.0);
  for (int t = 0; t <= 200; t += 10) {
    CHECK(hub.engine.onKeepAlive(1, 1'000'000, ms(t)) == Receipt::Implausible);
    CHECK(hub.engine.onEstimate(1, 0, values.data(), ms(t + 1)) != Receipt::Implausible);
  }
  CHECK(hub.engine.newestRound(0) == 0);
}

TEST_CASE("plausible rounds: a neighbour truly ahead is believed after half a peer timeout") {
  // We were away (restarted from an old checkpoint): n1 went on to round 1000.
  const Topology pair = graph("chain", 2);
  EngineOptions options = withPolicy(PolicyKind::All);
  options.roundSkipping = true;
  options.peerTimeout = milliseconds(100);
  Engine a(pair, 0, options, rate(0.0), 0.0, Eigen::VectorXd::Zero(1), Time{});
  const Eigen::VectorXd theirs = Eigen::VectorXd::Constant(1, 1.0);
  CHECK(a.onKeepAlive(1, 1000, ms(0)) == Receipt::Implausible);
  CHECK(a.onEstimate(1, 1000, theirs.data(), ms(20)) == Receipt::Implausible);
  CHECK(a.onKeepAlive(1, 1000, ms(50)) == Receipt::Stored);
  CHECK(a.onEstimate(1, 1000, theirs.data(), ms(60)) == Receipt::Stored);
  CHECK(a.newestRound(0) == 1000);
  // One round later it has skipped to n1's round and mixed n1's estimate.
  REQUIRE(a.tryStart(ms(61)));
  a.onGradient(0, Eigen::VectorXd::Zero(1), 0.0, GradientStats{}, ms(62));
  const auto record = a.tryFinish(ms(62));
  REQUIRE(record);
  CHECK(record->skipped);
  CHECK(a.round() == 1000);
  CHECK(a.params()[0] == doctest::Approx(0.5));
  CHECK(a.onKeepAlive(1, 1001, ms(63)) == Receipt::Stored);  // in reach again
}

TEST_CASE("plausible rounds: a run of claims ahead stays believed while it keeps coming") {
  // n1 is far ahead and the node cannot skip to it yet: every claim of the run,
  // however long it lasts, is taken once the first half timeout has passed.
  const Topology pair = graph("chain", 2);
  EngineOptions options = withPolicy(PolicyKind::All);
  options.peerTimeout = milliseconds(100);
  Engine a(pair, 0, options, rate(0.0), 0.0, Eigen::VectorXd::Zero(1), Time{});
  CHECK(a.onKeepAlive(1, 1000, ms(0)) == Receipt::Implausible);
  for (int t = 50; t <= 500; t += 30) CHECK(a.onKeepAlive(1, 1000, ms(t)) == Receipt::Stored);
  // A silence longer than the peer timeout ends the run: the next claim starts anew.
  CHECK(a.onKeepAlive(1, 1000, ms(700)) == Receipt::Implausible);
}

TEST_CASE("plausible rounds: what a liar got believed is dropped when the sender speaks in reach") {
  const Topology pair = graph("chain", 2);
  EngineOptions options = withPolicy(PolicyKind::All);
  options.peerTimeout = milliseconds(100);
  Engine a(pair, 0, options, rate(0.0), 0.0, Eigen::VectorXd::Zero(1), Time{});
  const Eigen::VectorXd lie = Eigen::VectorXd::Constant(1, 1e6);
  const Eigen::VectorXd truth = Eigen::VectorXd::Constant(1, 1.0);
  // Speaking alone for an absent n1 for half a peer timeout gets a claim believed...
  CHECK(a.onEstimate(1, 1'000'000, lie.data(), ms(0)) == Receipt::Implausible);
  CHECK(a.onEstimate(1, 1'000'001, lie.data(), ms(50)) == Receipt::Stored);
  CHECK(a.newestRound(0) == 1'000'001);
  // ...until the real n1 speaks: its round is in reach, the lie is gone.
  CHECK(a.onEstimate(1, 0, truth.data(), ms(51)) == Receipt::Stored);
  CHECK(a.newestRound(0) == 0);
  REQUIRE(a.tryStart(ms(52)));
  a.onGradient(0, Eigen::VectorXd::Zero(1), 0.0, GradientStats{}, ms(52));
  const auto record = a.tryFinish(ms(52));
  REQUIRE(record);
  CHECK(a.params()[0] == doctest::Approx(0.5));
}

TEST_CASE("plausible rounds: the horizon grows with the hops from us to the sender") {
  // Exponential, 8 nodes (directed, i sends to i+1, i+2, i+4): node 0 hears
  // 4 (which hears 0), 6 (two hops: 0 -> 2 -> 6) and 7 (three: 0 -> 1 -> 3 -> 7).
  const Topology exponential = graph("exponential", 8);
  EngineOptions options = withPolicy(PolicyKind::All);
  Engine engine(exponential, 0, options, rate(0.0), 0.0, Eigen::VectorXd::Zero(1), Time{});
  std::map<std::size_t, std::int64_t> horizons;
  for (std::size_t s = 0; s < engine.degree(); ++s)
    horizons[engine.nodeOfSlot(s)] = engine.horizon(s);
  const std::int64_t extra = options.skipAhead + 1;
  CHECK(horizons == std::map<std::size_t, std::int64_t>{{4, options.maxLead + extra},
                                                        {6, 2 * options.maxLead + extra},
                                                        {7, 3 * options.maxLead + extra}});
}
