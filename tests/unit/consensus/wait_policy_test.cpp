// Wait policies (wait_policy.cpp) through the engine, on scripted arrivals: all, static, timeout,
// quantile, the hard deadline, and the dynamic rule's choices.

#include "helpers.hpp"

using namespace consensus_test;

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
  const GradientStats stats;
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

TEST_CASE("dynamic on a link that takes seconds: the forecast sees it, and no round waits for it") {
  // A hub with three neighbours in 20-40 ms and one whose link takes 4 s an
  // estimate, one estimate at a time (the daemon's flow control), parts of
  // it heard every 100 ms while it arrives. The first rounds (warm-up, all)
  // wait the 4 s; then the rule leaves the slow one out, and a round that
  // does so ends when the three are in: never on the slow link's time.
  EngineOptions options;
  options.policy.kind = PolicyKind::Dynamic;
  options.roundSkipping = false;
  options.warmupRounds = 2;
  options.maxLead = 1'000'000;  // the slow neighbour's rounds lag far behind
  Hub hub(options, 0.05);
  Time now{};
  Time slowBegan{};  // the slow neighbour's estimate on its way since
  std::int64_t slowRound = 0;
  Time nextPart = ms(100);
  Time nextHello = ms(1'000);
  std::vector<RoundRecord> records;
  while (now < ms(60'000)) {
    const auto start = hub.engine.tryStart(now);
    REQUIRE(start);
    const std::int64_t k = start->round;
    const Time t0 = now;
    // Events of this round in time order, until it ends.
    std::vector<std::pair<Time, std::size_t>> events{
        {t0 + ms(10), 0}, {t0 + ms(20), 1}, {t0 + ms(30), 2}, {t0 + ms(40), 3}};
    std::optional<RoundRecord> record;
    std::size_t e = 0;
    while (!record) {
      const Time slowIn = slowBegan + ms(4'000);
      Time at = std::min({nextPart, slowIn, nextHello});
      if (e < events.size()) at = std::min(at, events[e].first);
      if (const auto wake = hub.engine.nextWakeup(now)) at = std::min(at, *wake);
      now = at;
      if (e < events.size() && events[e].first == now) {
        if (events[e].second == 0)
          hub.gradient(now, 1.0);
        else
          hub.send(events[e].second, k, 1.0, now);
        ++e;
      } else if (now == slowIn) {
        hub.send(4, slowRound, 1.0, now);
        slowBegan = now;  // the next begins at once, of the hub's round
        slowRound = hub.engine.round();
        nextPart = now + ms(100);
      } else if (now == nextHello) {
        for (std::size_t j = 1; j <= 3; ++j) hub.engine.onKeepAlive(j, hub.engine.round(), now);
        nextHello = now + ms(1'000);
      } else if (now == nextPart) {
        hub.engine.onArriving(4, slowRound, now);
        nextPart = now + ms(100);
      }
      record = hub.engine.tryFinish(now);
    }
    records.push_back(*record);
  }
  REQUIRE(records.size() > 100);
  // Warm-up: every neighbour, on the slow link's time.
  CHECK(records[0].responders.size() == 4);
  CHECK(records[0].end - records[0].start >= ms(3'900));
  // The timing model has the slow link's seconds, not a censored guess.
  CHECK(hub.engine.arrivals().offsetQuantile(3, 0.5) >= ms(3'000));
  std::size_t without = 0;
  for (std::size_t r = 2; r < records.size(); ++r) {
    const RoundRecord& record = records[r];
    if (record.target == 4) continue;
    ++without;
    INFO("round " << record.round << " waited for " << record.target);
    CHECK(record.reason == CutoffReason::Count);
    CHECK(record.end - record.start <= ms(40));
  }
  CHECK(without >= records.size() * 9 / 10);
}
