// The simulator: deterministic from its seed, and round timings a person can
// work out by hand on 2- and 4-node graphs.
#include <doctest/doctest.h>

#include <cmath>

#include "consensusd/data/partition.hpp"
#include "consensusd/data/source.hpp"
#include "consensusd/sim/simulator.hpp"
#include "consensusd/topology/generators.hpp"

using namespace consensusd;
using consensus::PolicyKind;
using namespace std::chrono_literals;

namespace {

topology::GeneratorOptions generator(const std::string& kind, std::size_t nodes) {
  topology::GeneratorOptions options;
  options.kind = kind;
  options.nodes = nodes;
  return options;
}

consensus::StragglerSpec straggler(consensus::StragglerKind kind, consensus::Duration delay,
                                   consensus::Duration mean) {
  consensus::StragglerSpec spec;
  spec.kind = kind;
  spec.delay = delay;
  spec.mean = mean;
  return spec;
}

struct Setup {
  topology::Topology graph;
  data::TrainTest data;
  std::vector<data::Dataset> shares;
  sim::SimOptions options;

  Setup(const std::string& kind, std::size_t nodes)
      : graph(topology::Topology::fromSpec(topology::generate(generator(kind, nodes)), "<test>")) {
    data::DataSource source;
    source.kind = data::DatasetKind::SyntheticLogistic;
    data = data::load(source);
    data::PartitionOptions partition;
    partition.nodes = nodes;
    for (const auto& part : data::partition(data.train, partition))
      shares.push_back(data::subset(data.train, part));
    options.model.kind = data::ModelKind::Logistic;
    options.model.inputs = data.train.dimension();
    options.model.classes = 2;
    options.engine.policy.kind = PolicyKind::All;
    options.engine.roundSkipping = false;
    options.link.latency = 0ms;
    options.link.bytesPerSecond = 1e15;
    options.sampleEvery = 1005ms;  // rows between round boundaries: no ties to break
    options.maxTime = 1005ms;
    options.nodeEvalSamples = 100;
  }
  sim::SimResult run() const { return sim::simulate(graph, data, shares, options); }
};

}  // namespace

TEST_CASE("the same seed gives the same run and another seed another") {
  Setup setup("ring", 6);
  setup.options.engine.policy.kind = PolicyKind::Dynamic;
  setup.options.stragglers.assign(6, {straggler(consensus::StragglerKind::Exponential, 0ms, 5ms)});
  setup.options.sampleEvery = 100ms;
  const auto a = setup.run();
  const auto b = setup.run();
  REQUIRE(a.samples.size() == b.samples.size());
  for (std::size_t k = 0; k < a.samples.size(); ++k) {
    CHECK(a.samples[k].meanRound == b.samples[k].meanRound);
    CHECK(a.samples[k].accuracy == b.samples[k].accuracy);
    CHECK(a.samples[k].consensusDistance == b.samples[k].consensusDistance);
  }
  CHECK(a.events == b.events);
  setup.options.seed = 2;
  CHECK(setup.run().events != a.events);
}

TEST_CASE("gradients computed ahead on other threads give the same run, bit for bit") {
  Setup setup("random-regular", 12);
  setup.options.engine.policy.kind = PolicyKind::Dynamic;
  setup.options.stragglers.assign(12, {straggler(consensus::StragglerKind::Exponential, 0ms, 5ms)});
  setup.options.sampleEvery = 100ms;
  const auto one = setup.run();
  setup.options.threads = 3;  // more workers than this machine's cores: jobs change hands
  const auto three = setup.run();
  REQUIRE(one.samples.size() == three.samples.size());
  CHECK(std::isnan(one.samples.front().meanLoss));  // no gradient is in at time 0
  for (std::size_t k = 1; k < one.samples.size(); ++k) {
    CHECK(one.samples[k].meanLoss == three.samples[k].meanLoss);
    CHECK(one.samples[k].accuracy == three.samples[k].accuracy);
  }
  CHECK(one.events == three.events);
  for (std::size_t i = 0; i < one.nodeParams.size(); ++i)
    CHECK(one.nodeParams[i] == three.nodeParams[i]);
}

TEST_CASE("two nodes: a round lasts max(compute, latency + size / bandwidth)") {
  Setup setup("chain", 2);
  // Compute 10 ms, message instantaneous: 100 rounds in 1.005 s.
  auto result = setup.run();
  CHECK(result.nodeRounds == std::vector<std::int64_t>{100, 100});
  CHECK(result.samples.back().meanRound == 100.0);
  // 21 float32 parameters = 84 bytes at 84 kB/s: 1 ms, plus 14 ms latency.
  setup.options.link.latency = 14ms;
  setup.options.link.bytesPerSecond = 84'000;
  result = setup.run();
  CHECK(result.nodeRounds == std::vector<std::int64_t>{67, 67});  // 1005 / 15
  CHECK(result.samples.back().meanBackups == 0.0);
  CHECK(result.samples.back().accuracy > 0.5);  // real gradients moved the model
}

TEST_CASE("two nodes, publish: update: a round lasts compute + latency + size / bandwidth") {
  // The estimate leaves with the update (x + u), so sending no longer
  // overlaps computing: 10 + 14 + 1 ms a round.
  Setup setup("chain", 2);
  setup.options.engine.publish = consensus::Publish::Update;
  setup.options.link.latency = 14ms;
  setup.options.link.bytesPerSecond = 84'000;
  const auto result = setup.run();
  CHECK(result.nodeRounds == std::vector<std::int64_t>{40, 40});  // 1005 / 25
  CHECK(result.samples.back().meanBackups == 0.0);
  CHECK(result.samples.back().accuracy > 0.5);
}

TEST_CASE("two nodes: a node's straggler models add up, each in its own rounds") {
  Setup setup("chain", 2);
  setup.options.stragglers.assign(2, {});
  consensus::StragglerSpec early = straggler(consensus::StragglerKind::Constant, 20ms, 0ms);
  early.toRound = 19;
  consensus::StragglerSpec later = straggler(consensus::StragglerKind::Constant, 5ms, 0ms);
  later.fromRound = 10;
  setup.options.stragglers[0] = {early, later};
  // Node 0 paces both: rounds 0-9 take 30 ms, 10-19 35 ms (both models),
  // then 15 ms: round 20 + j starts at 650 + 15 j <= 1005, so it is in 43.
  // Node 1 is one round ahead: its gradient is done 10 ms into the round and
  // node 0's estimate was in at the start (as in the four-node case below).
  const auto result = setup.run();
  CHECK(result.nodeRounds == std::vector<std::int64_t>{43, 44});
}

TEST_CASE("two nodes: a slow link delays the estimates, as in the daemon's test of link_delay_ms") {
  // The daemon test "straggler.link_delay_ms holds back a node's estimates":
  // n1's estimates take 100 ms. n0 cannot finish round k before n1's estimate
  // of k is in (100 ms after n1 started k), and n1 cannot finish k before n0
  // started it: n0 finishes rounds at 100, 110, 200, 210, ..., 1000, two
  // per 100 ms (the daemon test asks for at least that), 19 of them by
  // 1.005 s; n1 finishes round k when n0 starts it, one more.
  Setup setup("chain", 2);
  setup.options.stragglers.assign(2, {});
  consensus::StragglerSpec slowLink;
  slowLink.linkDelay = 100ms;
  setup.options.stragglers[1] = {slowLink};
  auto result = setup.run();
  CHECK(result.nodeRounds == std::vector<std::int64_t>{19, 20});
  // A link that turns slow at round 10: rounds 0-9 at compute speed (done
  // at 100 ms), then n1's estimate of round 10 arrives at 200 and the
  // pattern repeats: 200, 210, 300, ..., 1000, 27 rounds by 1.005 s.
  setup.options.stragglers[1][0].fromRound = 10;
  result = setup.run();
  CHECK(result.nodeRounds == std::vector<std::int64_t>{27, 28});
}

TEST_CASE("links of mixed speed: log-normal slowness per link, the same both ways, from the seed") {
  sim::LinkModel link;
  CHECK(sim::linkSlowness(link, 1, 0, 1) == 1.0);  // spread 0: every link alike
  link.spread = 0.5;
  double sum = 0;
  double sumSq = 0;
  constexpr int kLinks = 20'000;
  for (int k = 0; k < kLinks; ++k) {
    const auto a = static_cast<std::size_t>(k);
    const double s = sim::linkSlowness(link, 1, a, a + 1 + a % 7);
    CHECK(s == sim::linkSlowness(link, 1, a + 1 + a % 7, a));
    sum += std::log(s);
    sumSq += std::log(s) * std::log(s);
  }
  const double mean = sum / kLinks;
  const double sd = std::sqrt(sumSq / kLinks - mean * mean);
  CHECK(std::abs(mean) < 0.02);  // standard error 0.0035
  CHECK(sd == doctest::Approx(0.5).epsilon(0.03));
  CHECK(sim::linkSlowness(link, 2, 0, 1) != sim::linkSlowness(link, 1, 0, 1));

  // Two nodes, messages slower than compute: a round lasts 40 ms x s of their link.
  Setup setup("chain", 2);
  setup.options.link.latency = 40ms;
  setup.options.link.spread = 0.5;
  const double s = sim::linkSlowness(setup.options.link, setup.options.seed, 0, 1);
  REQUIRE(s > 0.3);  // messages still slower than the 10 ms gradient
  const auto round = std::chrono::duration_cast<consensus::Duration>(40ms * s);
  const auto rounds = static_cast<std::int64_t>(1005ms / round);
  CHECK(setup.run().nodeRounds == std::vector<std::int64_t>{rounds, rounds});
}

TEST_CASE(
    "four nodes, one three times slower: all waits for it, static b = 1 stops at the lead bound") {
  Setup setup("ring", 4);
  setup.options.stragglers.assign(4, {});
  setup.options.stragglers[0] = {straggler(consensus::StragglerKind::Constant, 20ms, 0ms)};
  // all: node 0 starts round k at 30k ms (33 at 990 ms). A node h hops away
  // can be h rounds ahead: nodes 1 and 3 started round 34 and wait for node
  // 0's estimate of it; node 2 finished 34 with theirs and waits in 35.
  auto result = setup.run();
  CHECK(result.nodeRounds == std::vector<std::int64_t>{33, 34, 35, 34});
  // static b = 1: the others mix among themselves at 10 ms a round until the
  // lead bound holds them max_lead rounds ahead of node 0.
  setup.options.engine.policy.kind = PolicyKind::Static;
  setup.options.engine.policy.backups = 1;
  setup.options.engine.maxLead = 5;
  result = setup.run();
  CAPTURE(result.nodeRounds);
  CHECK(result.nodeRounds[0] == 33);
  for (std::size_t i = 1; i < 4; ++i) {
    CHECK(result.nodeRounds[i] >= 33 + 5);
    CHECK(result.nodeRounds[i] <= 33 + 5 + 1);
  }
  CHECK(result.samples.back().meanBackups > 0.0);
  CHECK(result.samples.back().meanTarget == 1.0);  // waits for 2 - 1 of its 2 neighbours
}

TEST_CASE("the samples say what the policy decided: the count it waited for and why it stopped") {
  Setup setup("ring", 4);
  setup.options.stragglers.assign(4, {});
  setup.options.stragglers[0] = {straggler(consensus::StragglerKind::Constant, 20ms, 0ms)};
  setup.options.engine.policy.kind = PolicyKind::All;
  auto result = setup.run();
  CHECK(result.samples.back().meanTarget == 2.0);
  CHECK(result.samples.back().timeoutShare == 0.0);
  CHECK(result.samples.back().deadlineShare == 0.0);
  // A 5 ms cut-off: n1 and n3 stop waiting for n0, 20 ms slower, in most rounds.
  setup.options.engine.policy.kind = PolicyKind::Timeout;
  setup.options.engine.policy.timeout = 5ms;
  result = setup.run();
  CAPTURE(result.samples.back().timeoutShare);
  CHECK(result.samples.back().meanTarget == 2.0);
  CHECK(result.samples.back().timeoutShare > 0.2);
  CHECK(result.samples.back().deadlineShare == 0.0);
}

TEST_CASE("first crossing, raw and smoothed") {
  std::vector<sim::Sample> samples(6);
  const double accuracy[] = {0.5, 0.81, 0.7, 0.8, 0.85, 0.9};
  for (std::size_t k = 0; k < 6; ++k) {
    samples[k].timeS = static_cast<double>(k);
    samples[k].accuracy = accuracy[k];
  }
  CHECK(sim::firstCrossing(samples, 0.8) == 1.0);
  CHECK(sim::firstCrossing(samples, 0.8, 3) == 5.0);  // means 0.67, 0.77, 0.78, then 0.85
  CHECK_FALSE(sim::firstCrossing(samples, 0.95));
}

TEST_CASE("two slow neighbours side by side do not pace the whole ring") {
  // Nodes 0 and 1 take 30 ms, the other four 10 ms; waiting for 1 of 2, 1 s.
  // Each slow node has one slow and one fast neighbour: skipping to the lower
  // of its neighbours' rounds would never move it, and the lead bound would
  // hold the fast nodes within max_lead rounds of its 33. The median of two
  // is halfway between them: the slow pair skips toward the fast nodes, which
  // run at nearly their own pace (100 rounds).
  Setup setup("ring", 6);
  setup.options.stragglers.assign(6, {});
  setup.options.stragglers[0] = {straggler(consensus::StragglerKind::Constant, 20ms, 0ms)};
  setup.options.stragglers[1] = {straggler(consensus::StragglerKind::Constant, 20ms, 0ms)};
  setup.options.engine.policy.kind = PolicyKind::Static;
  setup.options.engine.policy.backups = 1;
  setup.options.engine.maxLead = 5;
  setup.options.engine.roundSkipping = true;
  auto result = setup.run();
  CAPTURE(result.nodeRounds);
  for (std::size_t i = 0; i < 2; ++i) CHECK(result.nodeRounds[i] >= 66);  // skipped forward
  for (std::size_t i = 2; i < 6; ++i) CHECK(result.nodeRounds[i] >= 80);
  setup.options.engine.roundSkipping = false;
  result = setup.run();
  CAPTURE(result.nodeRounds);
  for (std::size_t i = 2; i < 6; ++i) CHECK(result.nodeRounds[i] < 66);  // paced by the pair
}

TEST_CASE("robust mixing keeps honest nodes close to a clean run when a neighbour lies") {
  Setup setup("random-regular", 12);  // degree 4: the liar is one of five values at its neighbours
  setup.options.maxTime = 3005ms;     // 300 rounds
  setup.options.sampleEvery = 3005ms;
  constexpr std::size_t kLiar = 3;
  const auto finalParams = [&](consensus::Robust robust, std::optional<sim::Attack> attack) {
    setup.options.engine.robust = robust;
    setup.options.attackers.clear();
    if (attack) setup.options.attackers.push_back({kLiar, *attack, 4.0});
    return setup.run().nodeParams;
  };
  const auto clean = finalParams(consensus::Robust::None, std::nullopt);
  // The largest relative distance of an honest node from where it ends in the clean run.
  const auto worstHonest = [&](const std::vector<Eigen::VectorXf>& params) {
    double worst = 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (i == kLiar) continue;
      const double d = static_cast<double>((params[i] - clean[i]).norm() / clean[i].norm());
      worst = std::isfinite(d) ? std::max(worst, d) : 1e30;
    }
    return worst;
  };
  // The yardstick: how far another minibatch seed alone moves the nodes (~0.07).
  setup.options.seed = 2;
  const double seedSpread = worstHonest(finalParams(consensus::Robust::None, std::nullopt));
  setup.options.seed = 1;
  REQUIRE(seedSpread > 0.01);

  // Undefended, one liar drags every honest node away (so the checks can fail):
  // sign flips shrink them to zero (0.98), shifts blow them up (~500).
  // Defended, shifts are absorbed (0.04-0.08); sign flips still bias the
  // trimmed or clipped mix toward zero by the honest spread each round (0.22-0.30).
  const auto run = [&](consensus::Robust robust, sim::Attack attack) {
    return worstHonest(finalParams(robust, attack)) / seedSpread;
  };
  CHECK(run(consensus::Robust::None, sim::Attack::SignFlip) > 10);
  CHECK(run(consensus::Robust::None, sim::Attack::Shift) > 1000);
  for (const consensus::Robust robust : {consensus::Robust::Clip, consensus::Robust::TrimmedMean}) {
    CAPTURE(static_cast<int>(robust));
    CHECK(run(robust, sim::Attack::SignFlip) < 5);
    CHECK(run(robust, sim::Attack::Shift) < 1.5);
    // Without an attack the defence changes little.
    CHECK(worstHonest(finalParams(robust, std::nullopt)) < seedSpread / 2);
  }
}

TEST_CASE("two nodes at 100 Mbit/s: a 100 MB estimate takes 8 s, as in the daemon's shaped test") {
  // The daemon test "two hosts at 100 Mbit/s" (tests/integration/
  // big_models_test.cpp): each node's download held to 100 Mbit/s, an
  // estimate of 100 MB, policy all. Both send at a round's start; each
  // estimate is in 8 s later, so rounds end at 8, 16, ..., 40 s: five by
  // 40.005 s, each with its neighbour mixed (the daemon's rounds, on a real
  // link, take 1.10-1.15 times as long).
  Setup setup("chain", 2);
  setup.options.link.downloadBytesPerSecond.assign(2, 100e6 / 8);
  setup.options.link.estimateBytes = 100'000'000;
  setup.options.maxTime = 40'005ms;
  setup.options.sampleEvery = 40'005ms;
  const auto result = setup.run();
  CHECK(result.nodeRounds == std::vector<std::int64_t>{5, 5});
  // A node whose download is shared by two neighbours' estimates (a ring of
  // three): 16 s a round.
  Setup ring("ring", 3);
  ring.options.link.downloadBytesPerSecond.assign(3, 100e6 / 8);
  ring.options.link.estimateBytes = 100'000'000;
  ring.options.maxTime = 40'005ms;
  ring.options.sampleEvery = 40'005ms;
  CHECK(ring.run().nodeRounds == std::vector<std::int64_t>{2, 2, 2});
}

TEST_CASE(
    "compressed estimates: the bytes a codec saves, and a run that ends where float32's does") {
  Setup setup("ring", 4);
  setup.options.maxTime = 2005ms;
  setup.options.sampleEvery = 2005ms;
  const auto run = [&](consensus::Compression codec) {
    setup.options.engine.compression = codec;
    return setup.run();
  };
  // Where bandwidth is free, rounds are the same: what compression costs is
  // its error, smaller than what another minibatch seed changes.
  const sim::SimResult plain = run(consensus::Compression::None);
  setup.options.seed = 2;
  const sim::SimResult otherSeed = run(consensus::Compression::None);
  setup.options.seed = 1;
  const auto distance = [&](const sim::SimResult& result) {
    double worst = 0;
    for (std::size_t i = 0; i < 4; ++i)
      worst =
          std::max(worst, static_cast<double>((result.nodeParams[i] - plain.nodeParams[i]).norm() /
                                              plain.nodeParams[i].norm()));
    return worst;
  };
  const double seedSpread = distance(otherSeed);
  REQUIRE(seedSpread > 0.01);
  const std::size_t dimension = static_cast<std::size_t>(plain.nodeParams[0].size());
  for (const consensus::Compression codec :
       {consensus::Compression::Bf16, consensus::Compression::Fp16, consensus::Compression::Int8}) {
    CAPTURE(static_cast<int>(codec));
    const sim::SimResult compressed = run(codec);
    CHECK(compressed.nodeRounds == plain.nodeRounds);
    CHECK(distance(compressed) < seedSpread / 4);
    // Bytes: one keyframe per edge, then a frame every round (the one in
    // progress at the end too).
    const std::uint64_t edges = 8;
    const auto rounds = static_cast<std::uint64_t>(plain.nodeRounds[0]);
    CHECK(compressed.bytesSent ==
          edges * (dimension * 4 + rounds * consensus::frameBytes(codec, dimension)));
  }
  CHECK(plain.bytesSent ==
        8 * (static_cast<std::uint64_t>(plain.nodeRounds[0]) + 1) * dimension * 4);
  // Per training sample: a node's bytes over its rounds' B samples each.
  const sim::Sample& last = plain.samples.back();
  CHECK(last.sentBytesPerSample ==
        doctest::Approx(last.sentBytesPerNode /
                        (last.meanRound * static_cast<double>(setup.options.engine.batchSize))));
  CHECK(last.sentBytesPerSample > 0);

  // Where the link sets the pace, int8's frames buy rounds: 20 ms an
  // estimate against 1 ms of compute, 6 ms a frame (25 bytes for 21 values).
  setup.options.compute = 1ms;
  setup.options.link.bytesPerSecond = static_cast<double>(dimension * 4) / 0.02;  // 20 ms each
  const sim::SimResult slowPlain = run(consensus::Compression::None);
  const sim::SimResult slowInt8 = run(consensus::Compression::Int8);
  CHECK(slowInt8.nodeRounds[0] > 3 * slowPlain.nodeRounds[0]);
}

TEST_CASE("the synchronous baseline: exact averages, and a step as slow as the slowest node") {
  Setup setup("ring", 4);
  // Compute 10 ms, an all-reduce of no time: 101 steps by 1.005 s (0 .. 100).
  const auto result =
      sim::simulateSynchronous(setup.graph, setup.data, setup.shares, setup.options);
  CHECK(result.nodeRounds == std::vector<std::int64_t>(4, 100));
  CHECK(result.samples.back().consensusDistance == 0.0);
  CHECK(result.samples.back().meanTarget == 3.0);
  CHECK(result.samples.back().accuracy > 0.5);
  // The same steps by hand: each node's minibatch drawn as the simulator draws it.
  data::Model<float> model(setup.options.model);
  Eigen::VectorXf x(static_cast<Eigen::Index>(model.dimension()));
  model.initialize(x, setup.options.initSeed);
  std::vector<data::MinibatchSampler> samplers;
  for (std::size_t i = 0; i < 4; ++i)
    samplers.emplace_back(setup.shares[i].size(), setup.options.engine.batchSize,
                          setup.options.seed * 7919u + i);
  data::Batch<float> batch;
  Eigen::VectorXf gradient(x.size());
  for (std::int64_t step = 0; step < 100; ++step) {
    Eigen::VectorXf sum = Eigen::VectorXf::Zero(x.size());
    for (std::size_t i = 0; i < 4; ++i) {
      data::gather(setup.shares[i], samplers[i].next(), batch);
      model.lossAndGradient(x, batch, gradient);
      sum += gradient;
    }
    x -= static_cast<float>(setup.options.schedule.at(step)) * sum / 4.0F;
  }
  CHECK((result.nodeParams[0] - x).norm() == doctest::Approx(0.0).epsilon(1e-6));

  // One node 20 ms slower every step paces all: 1005 / 30 = 33 steps. A
  // ring all-reduce of 84 bytes over 4 nodes at 84 kB/s with 1 ms latency:
  // 6 steps of 1.25 ms, 7.5 ms a step: 1005 / 37.5 = 26.
  setup.options.stragglers.assign(4, {});
  setup.options.stragglers[2] = {straggler(consensus::StragglerKind::Constant, 20ms, 0ms)};
  CHECK(sim::simulateSynchronous(setup.graph, setup.data, setup.shares, setup.options)
            .nodeRounds[0] == 33);
  setup.options.link.latency = 1ms;
  setup.options.link.bytesPerSecond = 84'000;
  const auto linked =
      sim::simulateSynchronous(setup.graph, setup.data, setup.shares, setup.options);
  CHECK(linked.nodeRounds[0] == 26);
  CHECK(linked.bytesSent == 26u * 2 * 84 * 3);
}
