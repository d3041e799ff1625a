// Compressed estimates in the round engine: public copies that stay in step
// through lost, replayed and forged frames, and CHOCO-SGD's mix.

#include <cstring>

#include "helpers.hpp"

namespace consensus_test {
namespace {

using std::chrono::seconds;

constexpr std::size_t kDimension = 3 * kInt8Block + 40;

Eigen::VectorXd randomStart(std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  Eigen::VectorXd x(static_cast<Eigen::Index>(kDimension));
  for (double& v : x) v = normal(rng);
  return x;
}

EngineOptions compressed(Compression codec = Compression::Int8) {
  EngineOptions options = withPolicy(PolicyKind::All);
  options.compression = codec;
  return options;
}

// Three engines on a ring, gradients of zero: gossip alone. Each round every
// node starts, its frame (or keyframe) goes to both neighbours unless
// `deliver` says otherwise, and every node finishes.
struct Ring {
  Topology topology = graph("ring", 3);
  std::vector<std::unique_ptr<Engine>> nodes;
  std::vector<Engine::Start> starts;
  // Which senders' receivers are in step (else they get the copy whole).
  std::vector<std::vector<bool>> inStep;
  std::vector<Receipt> receipts;  // of the last round, in delivery order
  Time now{};

  explicit Ring(EngineOptions options) : inStep(3, std::vector<bool>(3, false)) {
    for (std::size_t i = 0; i < 3; ++i)
      nodes.push_back(std::make_unique<Engine>(topology, i, options, rate(0.0), 0.0,
                                               randomStart(10 + static_cast<std::uint32_t>(i)),
                                               Time{}));
  }

  Receipt deliver(std::size_t from, std::size_t to, const Engine::Start& start) {
    const bool frame = inStep[from][to] && start.frame;
    const Receipt receipt =
        frame ? nodes[to]->onFrame(from, start.round, start.base, *start.frame, now)
              : nodes[to]->onEstimate(from, start.round, start.publicCopy->data(), now);
    // A driver's rule: after a gap or a corrupt frame, the next is a keyframe.
    inStep[from][to] = receipt != Receipt::Gap && receipt != Receipt::Corrupt;
    return receipt;
  }

  void startAll() {
    now += ms(10);
    starts.clear();
    receipts.clear();
    for (auto& node : nodes) starts.push_back(*node->tryStart(now));
  }
  void deliverAll(const std::function<bool(std::size_t, std::size_t)>& drop = {}) {
    for (std::size_t from = 0; from < 3; ++from) {
      for (const std::size_t to : {(from + 1) % 3, (from + 2) % 3}) {
        if (drop && drop(from, to)) {
          inStep[from][to] = false;  // a driver knows the send it dropped
          continue;
        }
        receipts.push_back(deliver(from, to, starts[from]));
      }
    }
  }
  std::optional<RoundRecord> finish(std::size_t i, Time at) {
    nodes[i]->onGradient(nodes[i]->round(), Eigen::VectorXd::Zero(kDimension), 0.0, GradientStats{},
                         at);
    return nodes[i]->tryFinish(at);
  }
  void round(const std::function<bool(std::size_t, std::size_t)>& drop = {}) {
    startAll();
    deliverAll(drop);
    // A node missing a neighbour's estimate waits for the hard deadline.
    for (std::size_t i = 0; i < 3; ++i) REQUIRE(finish(i, now + seconds(10)));
    now += seconds(10);
  }

  Eigen::VectorXd mean() const {
    Eigen::VectorXd sum = Eigen::VectorXd::Zero(kDimension);
    for (const auto& node : nodes) sum += node->params();
    return sum / 3.0;
  }
  double spread() const {
    const Eigen::VectorXd m = mean();
    double worst = 0;
    for (const auto& node : nodes)
      worst = std::max(worst, (node->params() - m).lpNorm<Eigen::Infinity>());
    return worst;
  }
};

}  // namespace

TEST_CASE("compressed gossip: int8 frames keep the mean and reach consensus") {
  for (const Compression codec : {Compression::Int8, Compression::Bf16, Compression::Fp16}) {
    CAPTURE(static_cast<int>(codec));
    Ring ring(compressed(codec));
    const Eigen::VectorXd mean = ring.mean();
    const double before = ring.spread();
    ring.round();  // keyframes: the copies are the estimates, the mix is exact
    for (const Receipt receipt : ring.receipts) CHECK(receipt == Receipt::Stored);
    ring.round();
    CHECK(ring.starts[0].frame != nullptr);
    CHECK(ring.starts[0].base == 0);
    CHECK(ring.starts[0].frame->size() == frameBytes(codec, kDimension));
    for (int k = 0; k < 60; ++k) ring.round();
    for (const Receipt receipt : ring.receipts) CHECK(receipt == Receipt::Stored);
    // Symmetric weights and differences of copies: the mean does not move.
    CHECK((ring.mean() - mean).lpNorm<Eigen::Infinity>() < 1e-9);
    CHECK(ring.spread() < 1e-6 * before);
  }
}

TEST_CASE("compressed gossip: a keyframe still on its way when the next round starts") {
  EngineOptions options = compressed();
  options.consensusStep = 0.5;  // no consensus in one round
  Ring ring(options);
  const Eigen::VectorXd first = ring.nodes[0]->params();
  ring.round();
  // The sends of round 0 (keyframes) are held, as a slow link holds them.
  const std::vector<Engine::Start> inFlight = ring.starts;
  const double spread = ring.spread();
  for (int k = 0; k < 30; ++k) ring.round();
  CHECK(*inFlight[0].publicCopy == first);  // never written while held
  CHECK(ring.spread() < 1e-6 * spread);
}

TEST_CASE(
    "compressed gossip: the first mix is the plain average, then x + gamma sum w (c_j - c_i)") {
  EngineOptions options = compressed();
  options.consensusStep = 0.5;
  Ring ring(options);
  std::vector<Eigen::VectorXd> x;
  for (const auto& node : ring.nodes) x.push_back(node->params());
  ring.round();
  // Keyframes: every copy is the estimate, so x_0 + 1/2 (1/3 (x_1 - x_0) + 1/3 (x_2 - x_0)).
  const Eigen::VectorXd expected = x[0] + 0.5 / 3.0 * ((x[1] - x[0]) + (x[2] - x[0]));
  CHECK((ring.nodes[0]->params() - expected).lpNorm<Eigen::Infinity>() < 1e-12);
}

TEST_CASE("compressed gossip: a lost frame is a gap until a keyframe, and nothing wrong is mixed") {
  Ring ring(compressed());
  ring.round();
  ring.round();
  // n1's frame to n0 is dropped by its driver, which sends the copy whole next.
  ring.round([](std::size_t from, std::size_t to) { return from == 1 && to == 0; });
  ring.round();
  for (const Receipt receipt : ring.receipts) CHECK(receipt == Receipt::Stored);
  // Lost on the way, the driver none the wiser: the next frame is a gap.
  ring.round([](std::size_t from, std::size_t to) { return from == 1 && to == 0; });
  ring.inStep[1][0] = true;
  ring.startAll();
  ring.deliverAll();
  CHECK(ring.receipts[3] == Receipt::Gap);  // n0 -> n1, n0 -> n2, n1 -> n2, n1 -> n0
  const std::size_t slot = ring.nodes[0]->nodeOfSlot(0) == 1 ? 0 : 1;
  CHECK(ring.nodes[0]->counters(slot).gap == 1);
  // Not held: this round n0 mixes n2 alone.
  const auto record = ring.finish(0, ring.now + seconds(10));
  REQUIRE(record);
  CHECK(record->responders == std::vector<std::size_t>{2});
  for (std::size_t i = 1; i < 3; ++i) REQUIRE(ring.finish(i, ring.now));
  ring.now += seconds(10);
  // The next send is a keyframe, and the copies are whole again.
  ring.round();
  for (const Receipt receipt : ring.receipts) CHECK(receipt == Receipt::Stored);
  const double spread = ring.spread();
  for (int k = 0; k < 20; ++k) ring.round();
  CHECK(ring.spread() < 1e-3 * spread);
}

TEST_CASE(
    "compressed gossip: a replayed frame is a duplicate, a forged one corrupt, neither applied") {
  Ring ring(compressed());
  ring.round();
  ring.round();
  const Engine::Start last = ring.starts[1];
  std::vector<std::byte> frame = *last.frame;
  CHECK(ring.nodes[0]->onFrame(1, last.round, last.base, frame, ring.now) == Receipt::Duplicate);
  // The next round's frame from n1 with its first scale NaN: refused, copy untouched.
  ring.now += ms(10);
  std::vector<Engine::Start> starts;
  for (auto& node : ring.nodes) starts.push_back(*node->tryStart(ring.now));
  std::vector<std::byte> forged = *starts[1].frame;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(forged.data(), &nan, sizeof nan);
  CHECK(ring.nodes[0]->onFrame(1, starts[1].round, starts[1].base, forged, ring.now) ==
        Receipt::Corrupt);
  // The genuine frame still continues the copy (the forged one changed nothing).
  CHECK(ring.nodes[0]->onFrame(1, starts[1].round, starts[1].base, *starts[1].frame, ring.now) ==
        Receipt::Stored);
  // A frame beyond what the copy holds, before the one in between: a gap.
  CHECK(ring.nodes[0]->onFrame(1, starts[1].round + 2, starts[1].round + 1, *starts[1].frame,
                               ring.now) == Receipt::Gap);
}
}  // namespace consensus_test

namespace consensus_test {

TEST_CASE("compressed gossip: a node resumed from an older checkpoint sends its copy whole first") {
  EngineOptions options = compressed();
  options.consensusStep = 0.5;
  options.staleness = 1;  // the resumed node stays a round behind: still mixed
  Ring ring(options);
  for (int k = 0; k < 5; ++k) ring.round();
  // n1 restarts from its checkpoint of the round before: a new engine,
  // with no public copy (copies are not checkpointed).
  const std::int64_t resumed = ring.nodes[1]->round() - 1;
  const Eigen::VectorXd params = ring.nodes[1]->params();
  ring.nodes[1] = std::make_unique<Engine>(ring.topology, 1, options, rate(0.0), 0.0, params,
                                           ring.now, resumed);
  ring.inStep[1] = {false, false, false};  // its transport is new too
  ring.startAll();
  CHECK(ring.starts[1].frame == nullptr);  // a first round: the copy whole
  CHECK(ring.starts[1].round == resumed);
  ring.deliverAll();
  // Deliveries: n0->n1, n0->n2, n1->n2, n1->n0, n2->n0, n2->n1. Its keyframes
  // are older than the round the others are in: kept as their copy of it
  // (stale for this round), never a gap. It holds no copies: the others'
  // frames are gaps, and their next estimates to it go whole.
  REQUIRE(ring.receipts.size() == 6);
  for (const std::size_t k : {std::size_t{2}, std::size_t{3}})
    CHECK((ring.receipts[k] == Receipt::Stored || ring.receipts[k] == Receipt::Stale));
  CHECK(ring.receipts[0] == Receipt::Gap);
  CHECK(ring.receipts[5] == Receipt::Gap);
  for (std::size_t i = 0; i < 3; ++i) REQUIRE(ring.finish(i, ring.now + seconds(10)));
  ring.now += seconds(10);
  const double spread = ring.spread();
  for (int k = 0; k < 30; ++k) {
    ring.round();
    for (const Receipt receipt : ring.receipts) CHECK(receipt != Receipt::Gap);
  }
  CHECK(ring.spread() < 1e-3 * spread);
}

}  // namespace consensus_test

namespace consensus_test {

TEST_CASE("compressed gossip: a node far behind skips to its neighbours' round on their copies") {
  EngineOptions options = compressed();
  options.roundSkipping = true;
  options.peerTimeout = seconds(600);  // n2 stays live while it hangs
  Ring ring(options);
  ring.round();
  ring.round();
  // n2 hangs in round 2 (its gradient does not come) while n0 and n1 run on.
  ring.startAll();
  ring.deliverAll();
  for (std::size_t i = 0; i < 2; ++i) REQUIRE(ring.finish(i, ring.now));
  for (int k = 0; k < 5; ++k) {
    ring.now += ms(10);
    std::vector<Engine::Start> starts;
    for (std::size_t i = 0; i < 2; ++i) starts.push_back(*ring.nodes[i]->tryStart(ring.now));
    for (std::size_t from = 0; from < 2; ++from)
      for (const std::size_t to : {(from + 1) % 3, (from + 2) % 3})
        CHECK(ring.deliver(from, to, starts[from]) == Receipt::Stored);
    for (std::size_t i = 0; i < 2; ++i) REQUIRE(ring.finish(i, ring.now + seconds(10)));
    ring.now += seconds(10);
  }
  CHECK(ring.nodes[0]->round() == 8);
  const auto record = ring.finish(2, ring.now + ms(1));
  REQUIRE(record);
  CHECK(record->round == 2);
  CHECK(record->skipped);
  CHECK(record->nextRound == 7);
  CHECK(record->responders.size() == 2);
  // n2's next frame continues the copy its neighbours hold (of round 2): in
  // step, nothing resent whole, and the three reach consensus again.
  ring.now += seconds(10);
  const auto caughtUp = ring.nodes[2]->tryStart(ring.now);
  REQUIRE(caughtUp);
  CHECK(caughtUp->round == 7);
  CHECK(caughtUp->frame != nullptr);
  CHECK(caughtUp->base == 2);
  for (const std::size_t to : {std::size_t{0}, std::size_t{1}})
    CHECK(ring.deliver(2, to, *caughtUp) == Receipt::Stale);  // they are at 8: into the copy
  REQUIRE(ring.finish(2, ring.now + seconds(10)));
  const double spread = ring.spread();
  for (int k = 0; k < 30; ++k) ring.round();
  for (const Receipt receipt : ring.receipts) CHECK(receipt == Receipt::Stored);
  CHECK(ring.spread() < 1e-3 * spread);
}

}  // namespace consensus_test
