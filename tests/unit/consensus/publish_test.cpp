// consensus.publish: update: the estimate leaves with the update (x_k + u,
// through the outer step if set), the mix averages the neighbours' results,
// and the hard deadline counts from the estimate leaving.

#include "helpers.hpp"

namespace consensus_test {
namespace {

EngineOptions publishingUpdates(PolicyKind kind = PolicyKind::All) {
  EngineOptions options = withPolicy(kind);
  options.publish = Publish::Update;
  return options;
}

// Two nodes, each the other's only neighbour (weights 1/2): every round both
// start, both updates come in (node 0's first), each estimate goes across.
struct Pair {
  Topology topology = graph("chain", 2);
  std::vector<std::unique_ptr<Engine>> nodes;
  std::vector<Receipt> receipts;  // of every delivery, in order
  Time now{};

  Pair(EngineOptions options, std::vector<Eigen::VectorXd> starts, double eta = 0.0) {
    for (std::size_t i = 0; i < 2; ++i)
      nodes.push_back(std::make_unique<Engine>(topology, i, options, rate(eta), 0.0,
                                               std::move(starts[i]), Time{}));
  }
  void deliver(std::size_t from, const Engine::Publication& estimate) {
    Engine& to = *nodes[1 - from];
    receipts.push_back(estimate.frame
                           ? to.onFrame(from, estimate.round, estimate.base, *estimate.frame, now)
                           : to.onEstimate(from, estimate.round,
                                           estimate.publicCopy ? estimate.publicCopy->data()
                                                               : estimate.params->data(),
                                           now));
  }
  // One round with deltas d[i]; returns what each node published.
  std::vector<Eigen::VectorXd> round(const std::vector<Eigen::VectorXd>& deltas) {
    now += ms(10);
    for (auto& node : nodes) {
      const auto start = node->tryStart(now);
      REQUIRE(start);
      CHECK_FALSE(start->publish);
      CHECK_FALSE(node->takePublication());  // nothing leaves before the update
    }
    std::vector<Eigen::VectorXd> published;
    for (std::size_t i = 0; i < 2; ++i) {
      nodes[i]->onGradient(nodes[i]->round(), deltas[i], 0.0, GradientStats{}, now,
                           UpdateKind::Delta);
      const auto estimate = nodes[i]->takePublication();
      REQUIRE(estimate);
      CHECK(estimate->round == nodes[i]->round());
      CHECK_FALSE(nodes[i]->takePublication());  // taken once
      published.push_back(*estimate->params);
      deliver(i, *estimate);
    }
    for (auto& node : nodes) REQUIRE(node->tryFinish(now));
    return published;
  }
};

}  // namespace

TEST_CASE("publish: update: x_k + u leaves with the update, and the mix averages the results") {
  const Eigen::VectorXd x0 = Eigen::Vector3d(1, 2, 3);
  const Eigen::VectorXd x1 = Eigen::Vector3d(-1, 0, 5);
  Pair pair(publishingUpdates(), {x0, x1});
  const Eigen::VectorXd d0 = Eigen::Vector3d(0.5, -1, 0);
  const Eigen::VectorXd d1 = Eigen::Vector3d(0, 2, -4);
  const std::vector<Eigen::VectorXd> published = pair.round({d0, d1});
  CHECK(published[0] == x0 + d0);
  CHECK(published[1] == x1 + d1);
  // FedAvg's step: the average of the results, each node's own delta counted once.
  const Eigen::VectorXd average = (x0 + d0 + x1 + d1) / 2;
  for (const auto& node : pair.nodes) CHECK((node->params() - average).norm() < 1e-12);
  // The next round starts there and publishes from there.
  const std::vector<Eigen::VectorXd> next = pair.round({d1, d0});
  CHECK((next[0] - (average + d1)).norm() < 1e-12);
}

TEST_CASE("publish: update: a gradient's estimate is x_k - eta g at the schedule's eta") {
  EngineOptions options = publishingUpdates(PolicyKind::Static);
  options.policy.backups = 4;  // the hub mixes with nobody: x_{k+1} = x_k - eta g
  options.minResponders = 0;
  Hub hub(options, 0.1);
  REQUIRE(hub.engine.tryStart(ms(0)));
  hub.gradient(ms(5), 2.0);
  const auto estimate = hub.engine.takePublication();
  REQUIRE(estimate);
  CHECK(*estimate->params == Eigen::VectorXd::Constant(3, -0.2));
  const auto record = hub.engine.tryFinish(ms(5));
  REQUIRE(record);
  CHECK(record->gradientApplied);
  CHECK(hub.engine.params() == Eigen::VectorXd::Constant(3, -0.2));  // not stepped twice
}

TEST_CASE("publish: update: the hard deadline counts from the estimate leaving") {
  for (const Publish publish : {Publish::Start, Publish::Update}) {
    CAPTURE(static_cast<int>(publish));
    EngineOptions options = withPolicy(PolicyKind::All);
    options.publish = publish;
    options.peerTimeout = std::chrono::seconds(60);  // every neighbour stays live
    options.hardDeadline = std::chrono::seconds(10);
    Hub hub(options);
    for (std::size_t n = 1; n <= 4; ++n) hub.engine.onKeepAlive(n, 0, ms(0));
    REQUIRE(hub.engine.tryStart(ms(0)));
    // The update takes longer than the deadline (long local steps); nobody's estimate is in.
    hub.gradient(ms(15'000));
    if (publish == Publish::Start) {
      CHECK(hub.engine.tryFinish(ms(15'000))->reason == CutoffReason::Deadline);
      continue;
    }
    CHECK_FALSE(hub.engine.tryFinish(ms(15'000)));  // the neighbours have 10 s from now
    CHECK(hub.engine.nextWakeup(ms(15'000)) == ms(25'000));
    CHECK_FALSE(hub.engine.tryFinish(ms(24'999)));
    CHECK(hub.engine.tryFinish(ms(25'000))->reason == CutoffReason::Deadline);
  }
}

TEST_CASE("publish: update with int8 frames: the copies stay in step and the mean is x + u's") {
  std::mt19937 rng(7);
  std::normal_distribution<double> normal(0.0, 1.0);
  const auto random = [&] {
    Eigen::VectorXd v(static_cast<Eigen::Index>(2 * kInt8Block + 9));
    for (double& value : v) value = normal(rng);
    return v;
  };
  EngineOptions options = publishingUpdates();
  options.compression = Compression::Int8;
  Pair pair(options, {random(), random()});
  const auto mean = [&] { return (pair.nodes[0]->params() + pair.nodes[1]->params()) / 2; };
  const auto spread = [&] {
    return (pair.nodes[0]->params() - pair.nodes[1]->params()).lpNorm<Eigen::Infinity>();
  };
  for (int k = 0; k < 20; ++k) {
    const std::vector<Eigen::VectorXd> deltas{0.1 * random(), 0.1 * random()};
    // Symmetric weights and differences of copies: the mean moves by the deltas' mean.
    const Eigen::VectorXd expected = mean() + (deltas[0] + deltas[1]) / 2;
    pair.round(deltas);
    CHECK((mean() - expected).lpNorm<Eigen::Infinity>() < 1e-9);
  }
  const double moving = spread();
  for (int k = 0; k < 40; ++k)
    pair.round(
        {Eigen::VectorXd::Zero(2 * kInt8Block + 9), Eigen::VectorXd::Zero(2 * kInt8Block + 9)});
  for (const Receipt receipt : pair.receipts) CHECK(receipt == Receipt::Stored);
  CHECK(spread() < 1e-6 * moving);  // frames of x + u, applied in order: consensus
}

TEST_CASE("publish: update with outer: nesterov, every neighbour mixed, is DiLoCo's step") {
  // Each node publishes x + lr (d + mu v) with its own velocity; the average
  // of those is x + lr (D + mu V), V the velocity of the averaged deltas D:
  // momentum is linear, so averaging after it is DiLoCo's all-reduce before it.
  EngineOptions options = publishingUpdates();
  options.outer = Outer::Nesterov;
  options.outerLearningRate = 0.7;
  options.outerMomentum = 0.9;
  const Eigen::VectorXd x0 = Eigen::Vector3d(1, -1, 2);
  Pair pair(options, {x0, x0});
  Eigen::VectorXd x = x0;
  Eigen::VectorXd v = Eigen::VectorXd::Zero(3);
  std::mt19937 rng(3);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (int k = 0; k < 6; ++k) {
    const Eigen::VectorXd d0 = Eigen::Vector3d(normal(rng), normal(rng), normal(rng));
    const Eigen::VectorXd d1 = Eigen::Vector3d(normal(rng), normal(rng), normal(rng));
    pair.round({d0, d1});
    const Eigen::VectorXd mean = (d0 + d1) / 2;
    v = 0.9 * v + mean;
    x += 0.7 * (mean + 0.9 * v);
    for (const auto& node : pair.nodes) CHECK((node->params() - x).norm() < 1e-12);
  }
}

}  // namespace consensus_test
