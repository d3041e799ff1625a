// Mixing (mixing.cpp): weights, renormalize and absorb, the fused mix, robust aggregation, and
// consensus on a ring.

#include "helpers.hpp"

using namespace consensus_test;

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
  // Bit for bit the scalar sum in input order, whatever vector width this
  // CPU's pass uses (every node must mix the same way).
  std::size_t exact = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float scalar =
        ((0.4f * self[i] + 0.2f * inputs[0][i]) + 0.3f * inputs[1][i]) + 0.1f * inputs[2][i];
    if (out[i] == scalar) ++exact;
  }
  CHECK(exact == n);
  // In the same pass: the distance from self, then a step (bit for bit the
  // separate passes' result: the engine relies on it).
  std::vector<float> step(n);
  std::generate(step.begin(), step.end(), [&] { return normal(rng); });
  double distanceSq = 0;
  MixExtras<float> extras;
  extras.distanceSq = &distanceSq;
  extras.step = step.data();
  extras.stepScale = -0.05f;
  std::vector<float> stepped(n);
  fusedMix(self.data(), 0.4, terms, stepped.data(), n, extras);
  double expectedSq = 0;
  for (std::size_t i = 0; i < n; ++i) {
    expectedSq += (double{out[i]} - double{self[i]}) * (double{out[i]} - double{self[i]});
    CHECK(stepped[i] == out[i] - 0.05f * step[i]);
  }
  CHECK(distanceSq == doctest::Approx(expectedSq).epsilon(1e-5));

  // Each input's distance from self, in the same pass: as squaredDistance
  // measures it, and the mix unchanged.
  std::vector<double> inputDistancesSq(terms.size(), -1.0);
  MixExtras<float> measuring;
  measuring.inputDistancesSq = inputDistancesSq.data();
  std::vector<float> measured(n);
  fusedMix(self.data(), 0.4, terms, measured.data(), n, measuring);
  CHECK(measured == out);
  for (std::size_t k = 0; k < terms.size(); ++k) {
    CAPTURE(k);
    CHECK(inputDistancesSq[k] ==
          doctest::Approx(squaredDistance(inputs[k].data(), self.data(), n)).epsilon(1e-6));
  }

  fusedMix(self.data(), 0.4, terms, self.data(), n);  // in place
  CHECK(self[0] == out[0]);
}

TEST_CASE("the round's sums for the dynamic rule come out of one pass as separate ones would") {
  std::mt19937 rng(4);
  std::normal_distribution<float> normal;
  const std::size_t n = 5000;  // more than two blocks
  const auto random = [&] {
    Eigen::VectorXf v(static_cast<Eigen::Index>(n));
    for (float& value : v) value = normal(rng);
    return v;
  };
  const Eigen::VectorXf g = random(), x = random(), delta = random(), mixed = random(),
                        previousX = random(), previousG = random();
  const RoundSums all = roundSums(g.data(), x.data(), delta.data(), mixed.data(), previousX.data(),
                                  previousG.data(), n);
  const auto near = [](double expected) { return doctest::Approx(expected).epsilon(1e-5); };
  CHECK(all.gradientSq == near(g.cast<double>().squaredNorm()));
  CHECK(all.alongDelta == near(g.cast<double>().dot(delta.cast<double>())));
  CHECK(all.pull == near((mixed - x).cast<double>().dot(g.cast<double>())));
  CHECK(all.curvature == near((g - previousG).cast<double>().dot((x - previousX).cast<double>())));
  CHECK(all.stepSq == near((x - previousX).cast<double>().squaredNorm()));
  // A term whose vectors are not given stays 0; the others are unchanged.
  const RoundSums some =
      roundSums<float>(g.data(), x.data(), nullptr, nullptr, previousX.data(), nullptr, n);
  CHECK(some.gradientSq == all.gradientSq);
  CHECK(some.alongDelta == 0);
  CHECK(some.pull == 0);
  CHECK(some.curvature == 0);
  CHECK(some.stepSq == 0);
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
