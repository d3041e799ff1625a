// The round engine (round_engine.cpp): what it keeps of late, stale, duplicate and future
// estimates, which round it mixes, policy switches, and the plausible-round horizon.

#include "helpers.hpp"

using namespace consensus_test;

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
  // (Rounds within skip_ahead of ours: farther, a fresh node takes them whole, as a joiner.)
  for (std::int64_t r = 0; r < 3; ++r) hub.send(1, r, static_cast<double>(r), ms(0));
  REQUIRE(hub.engine.tryStart(ms(0)));
  hub.gradient(ms(0));
  REQUIRE(hub.engine.tryFinish(ms(0)));
  CHECK(hub.engine.params()[0] == doctest::Approx(0.5 * 2.0));
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
  // We were away (restarted from an old checkpoint of round 1): n1 went on to round 1000.
  const Topology pair = graph("chain", 2);
  EngineOptions options = withPolicy(PolicyKind::All);
  options.roundSkipping = true;
  options.peerTimeout = milliseconds(100);
  Engine a(pair, 0, options, rate(0.0), 0.0, Eigen::VectorXd::Zero(1), Time{}, 1);
  const Eigen::VectorXd theirs = Eigen::VectorXd::Constant(1, 1.0);
  CHECK(a.onKeepAlive(1, 1000, ms(0)) == Receipt::Implausible);
  CHECK(a.onEstimate(1, 1000, theirs.data(), ms(20)) == Receipt::Implausible);
  CHECK(a.onKeepAlive(1, 1000, ms(50)) == Receipt::Stored);
  CHECK(a.onEstimate(1, 1000, theirs.data(), ms(60)) == Receipt::Stored);
  CHECK(a.newestRound(0) == 1000);
  // One round later it has skipped to n1's round and mixed n1's estimate.
  REQUIRE(a.tryStart(ms(61)));
  a.onGradient(1, Eigen::VectorXd::Zero(1), 0.0, GradientStats{}, ms(62));
  const auto record = a.tryFinish(ms(62));
  REQUIRE(record);
  CHECK(record->skipped);
  CHECK_FALSE(record->adopted);  // its own state counts: it is no newcomer
  CHECK(a.round() == 1000);
  CHECK(a.params()[0] == doctest::Approx(0.5));
  CHECK(a.onKeepAlive(1, 1001, ms(63)) == Receipt::Stored);  // in reach again
}

// The joining tests' engine: waits for all, skips rounds, 100 ms peer timeout.
EngineOptions joiningOptions() {
  EngineOptions options = withPolicy(PolicyKind::All);
  options.roundSkipping = true;
  options.peerTimeout = milliseconds(100);
  return options;
}

TEST_CASE("a fresh node joining a running cluster takes its neighbours' estimates, not its x_0") {
  const Topology ring = graph("ring", 3);
  const EngineOptions options = joiningOptions();
  Engine a(ring, 0, options, rate(0.1), 0.0, Eigen::VectorXd::Zero(1), Time{});
  // The neighbours' claims of round 500 are believed after half a peer timeout.
  const Eigen::VectorXd two = Eigen::VectorXd::Constant(1, 2.0);
  const Eigen::VectorXd four = Eigen::VectorXd::Constant(1, 4.0);
  for (int t = 0; t <= 60; t += 10) {
    a.onKeepAlive(1, 500, ms(t));
    a.onKeepAlive(2, 500, ms(t));
  }
  CHECK(a.onEstimate(1, 500, two.data(), ms(61)) == Receipt::Stored);
  CHECK(a.onEstimate(2, 500, four.data(), ms(61)) == Receipt::Stored);
  REQUIRE(a.tryStart(ms(62)));
  a.onGradient(0, Eigen::VectorXd::Constant(1, 1.0), 0.0, GradientStats{}, ms(62));
  const auto joined = a.tryFinish(ms(62));
  REQUIRE(joined);
  CHECK(joined->skipped);
  CHECK(joined->adopted);
  CHECK(joined->selfWeight == 0.0);
  CHECK(a.round() == 500);
  CHECK(a.params()[0] == doctest::Approx(3.0));  // their average: x_0 (and its step) counts not

  // Believed but with nothing of theirs at that round yet, it does not jump
  // alone (it would send its x_0 as their round's estimate): it waits there.
  Engine c(ring, 0, options, rate(0.0), 0.0, Eigen::VectorXd::Zero(1), Time{});
  for (int t = 0; t <= 60; t += 10) {
    c.onKeepAlive(1, 500, ms(t));
    c.onKeepAlive(2, 500, ms(t));
  }
  REQUIRE(c.tryStart(ms(62)));
  c.onGradient(0, Eigen::VectorXd::Zero(1), 0.0, GradientStats{}, ms(62));
  const Time late = ms(62) + options.hardDeadline;
  for (Time t = ms(70); t <= late; t += ms(10)) {  // the neighbours keep talking
    c.onKeepAlive(1, 500, t);
    c.onKeepAlive(2, 500, t);
  }
  const auto waited = c.tryFinish(late);
  REQUIRE(waited);
  CHECK_FALSE(waited->skipped);
  CHECK(c.round() == 1);
  CHECK(c.onEstimate(1, 500, two.data(), late) == Receipt::Stored);
  CHECK(c.onEstimate(2, 500, four.data(), late) == Receipt::Stored);
  REQUIRE(c.tryStart(late));
  c.onGradient(1, Eigen::VectorXd::Zero(1), 0.0, GradientStats{}, late);
  const auto then = c.tryFinish(late);
  REQUIRE(then);
  CHECK(then->adopted);
  CHECK(c.params()[0] == doctest::Approx(3.0));

  // Nodes that start together skip nothing: x_0 is mixed as ever.
  Engine b(ring, 0, options, rate(0.0), 0.0, Eigen::VectorXd::Zero(1), Time{});
  REQUIRE(b.tryStart(ms(0)));
  b.onEstimate(1, 0, two.data(), ms(1));
  b.onEstimate(2, 0, four.data(), ms(1));
  b.onGradient(0, Eigen::VectorXd::Zero(1), 0.0, GradientStats{}, ms(2));
  const auto together = b.tryFinish(ms(2));
  REQUIRE(together);
  CHECK_FALSE(together->adopted);
  CHECK(b.params()[0] == doctest::Approx(2.0));  // (0 + 2 + 4) / 3, Metropolis on a ring
}

TEST_CASE("a joiner that ran rounds alone up to its neighbours' round still takes their state") {
  // Its neighbours were seen far ahead, out of reach; it trained alone
  // meanwhile (faster than they do, waiting for nobody) until their round
  // came into reach. Its round caught up with theirs; its x did not.
  const Topology ring = graph("ring", 3);
  const EngineOptions options = joiningOptions();
  Engine a(ring, 0, options, rate(0.0), 0.0, Eigen::VectorXd::Zero(1), Time{});
  a.onKeepAlive(1, 500, ms(0));  // a claim beyond reach: not believed
  Time t = ms(0);
  bool computing = false;
  while (a.round() < 499 && t < ms(5000)) {
    if (!computing && a.tryStart(t)) {
      a.onGradient(a.round(), Eigen::VectorXd::Zero(1), 0.0, GradientStats{}, t);
      computing = true;
    }
    if (computing && a.tryFinish(t)) computing = false;
    t += ms(1);
  }
  REQUIRE(a.round() == 499);
  REQUIRE(a.joining());
  const Eigen::VectorXd two = Eigen::VectorXd::Constant(1, 2.0);
  const Eigen::VectorXd four = Eigen::VectorXd::Constant(1, 4.0);
  CHECK(a.onEstimate(1, 500, two.data(), t) == Receipt::Stored);  // in reach now
  CHECK(a.onEstimate(2, 500, four.data(), t) == Receipt::Stored);
  REQUIRE(a.tryStart(t));
  a.onGradient(499, Eigen::VectorXd::Zero(1), 0.0, GradientStats{}, t);
  const auto joined = a.tryFinish(t);
  REQUIRE(joined);
  CHECK(joined->adopted);
  CHECK_FALSE(a.joining());
  CHECK(a.params()[0] == doctest::Approx(3.0));  // theirs alone, not (0 + 2 + 4) / 3
}

TEST_CASE("two fresh nodes joining side by side take the cluster's state, not each other's x_0") {
  // n0 and n1 join together; n2 has run 500 rounds.
  const Topology ring = graph("ring", 3);
  const EngineOptions options = joiningOptions();
  const Eigen::VectorXd fellow = Eigen::VectorXd::Constant(1, 8.0);
  const Eigen::VectorXd cluster = Eigen::VectorXd::Constant(1, 4.0);
  const auto believeAhead = [](Engine& e, Time from, Time to) {
    for (Time t = from; t <= to; t += ms(10)) e.onKeepAlive(2, 500, t);
  };

  // Both held: only the cluster's estimate is taken.
  {
    EngineOptions noSkip = options;
    noSkip.roundSkipping = false;
    Engine a(ring, 0, noSkip, rate(0.0), 0.0, Eigen::VectorXd::Zero(1), Time{});
    believeAhead(a, ms(0), ms(60));
    REQUIRE(a.tryStart(ms(61)));
    CHECK(a.onEstimate(1, 0, fellow.data(), ms(61)) == Receipt::Stored);
    CHECK(a.onEstimate(2, 500, cluster.data(), ms(61)) == Receipt::Stored);
    a.onGradient(0, Eigen::VectorXd::Zero(1), 0.0, GradientStats{}, ms(62));
    const auto joined = a.tryFinish(ms(62));
    REQUIRE(joined);
    CHECK(joined->adopted);
    CHECK(joined->responders == std::vector<std::size_t>{2});
    CHECK(a.params()[0] == doctest::Approx(4.0));
    CHECK(a.round() == 500);
  }

  // Only the fellow's in time: mixed as ever, and the node still joins
  // when the cluster's estimate comes.
  Engine b(ring, 0, options, rate(0.0), 0.0, Eigen::VectorXd::Zero(1), Time{});
  believeAhead(b, ms(0), ms(60));
  REQUIRE(b.tryStart(ms(61)));
  CHECK(b.onEstimate(1, 0, fellow.data(), ms(61)) == Receipt::Stored);
  b.onGradient(0, Eigen::VectorXd::Zero(1), 0.0, GradientStats{}, ms(62));
  const Time late = ms(62) + options.hardDeadline;
  believeAhead(b, ms(70), late);
  const auto first = b.tryFinish(late);
  REQUIRE(first);
  CHECK_FALSE(first->adopted);
  CHECK(first->responders == std::vector<std::size_t>{1});
  CHECK(b.round() == 1);
  CHECK(b.onEstimate(2, 500, cluster.data(), late) == Receipt::Stored);
  REQUIRE(b.tryStart(late));
  b.onGradient(1, Eigen::VectorXd::Zero(1), 0.0, GradientStats{}, late);
  const auto then = b.tryFinish(late);
  REQUIRE(then);
  CHECK(then->adopted);
  CHECK(b.params()[0] == doctest::Approx(4.0));

  // The fellow's round ends (waiting for one of two, at once) before the
  // cluster's node is heard at all, or while its claims are not believed
  // yet: it stays joining either way, and joins once they are.
  EngineOptions oneOfTwo = options;
  oneOfTwo.policy.kind = PolicyKind::Static;
  oneOfTwo.policy.backups = 1;
  for (const bool claimed : {false, true}) {
    CAPTURE(claimed);
    Engine c(ring, 0, oneOfTwo, rate(0.0), 0.0, Eigen::VectorXd::Zero(1), Time{});
    if (claimed) CHECK(c.onKeepAlive(2, 500, ms(0)) == Receipt::Implausible);
    REQUIRE(c.tryStart(ms(1)));
    CHECK(c.onEstimate(1, 0, fellow.data(), ms(1)) == Receipt::Stored);
    c.onGradient(0, Eigen::VectorXd::Zero(1), 0.0, GradientStats{}, ms(2));
    const auto early = c.tryFinish(ms(2));
    REQUIRE(early);
    CHECK_FALSE(early->adopted);
    CHECK(early->responders == std::vector<std::size_t>{1});
    CHECK(c.joining());
    believeAhead(c, ms(10), ms(60));
    CHECK(c.onEstimate(2, 500, cluster.data(), ms(60)) == Receipt::Stored);
    REQUIRE(c.tryStart(ms(61)));
    c.onGradient(1, Eigen::VectorXd::Zero(1), 0.0, GradientStats{}, ms(61));
    const auto joined = c.tryFinish(ms(61));
    REQUIRE(joined);
    CHECK(joined->adopted);
    CHECK(c.params()[0] == doctest::Approx(4.0));
  }
}

TEST_CASE("a joiner adopts no forged state: one estimate far ahead is not believed") {
  // A liar speaking for n1 sends one estimate of round 10^6: a fresh node
  // takes it for nothing (its round is checked first), mixes its honest
  // neighbours as ever, and never adopts the lie.
  const Topology ring = graph("ring", 3);
  EngineOptions options = withPolicy(PolicyKind::All);
  options.roundSkipping = true;
  options.peerTimeout = milliseconds(100);
  Engine a(ring, 0, options, rate(0.0), 0.0, Eigen::VectorXd::Zero(1), Time{});
  const Eigen::VectorXd lie = Eigen::VectorXd::Constant(1, 1e6);
  const Eigen::VectorXd honest = Eigen::VectorXd::Constant(1, 3.0);
  REQUIRE(a.tryStart(ms(0)));
  CHECK(a.onEstimate(1, 1'000'000, lie.data(), ms(1)) == Receipt::Implausible);
  CHECK(a.onEstimate(1, 0, honest.data(), ms(2)) == Receipt::Stored);
  CHECK(a.onEstimate(2, 0, honest.data(), ms(2)) == Receipt::Stored);
  a.onGradient(0, Eigen::VectorXd::Zero(1), 0.0, GradientStats{}, ms(2));
  const auto record = a.tryFinish(ms(2));
  REQUIRE(record);
  CHECK_FALSE(record->adopted);
  CHECK(a.round() == 1);
  CHECK(a.params()[0] == doctest::Approx(2.0));  // (0 + 3 + 3) / 3
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

TEST_CASE("the pull term's distance: each neighbour's newest estimate against the x it came to") {
  // Measured in the mix's pass when mixed, else at the round's end or the
  // next start, or on arrival when not kept: the same x either way.
  EngineOptions options = withPolicy(PolicyKind::Dynamic);
  options.mixRound = MixRound::Same;
  Hub hub(options);
  const auto distances = [&](Time now) {
    std::vector<double> out;
    for (const NeighborView& view : *hub.engine.policyContext(now).neighbors)
      out.push_back(view.distanceSq);
    return out;
  };
  REQUIRE(hub.engine.tryStart(ms(0)));  // x_0 = 0
  for (const std::size_t node : {1u, 2u, 3u, 4u})
    hub.send(node, 0, static_cast<double>(node), ms(1));
  hub.send(2, 1, 6.0, ms(1));  // ahead: kept, not mixed this round
  hub.gradient(ms(1));
  REQUIRE(hub.engine.tryFinish(ms(1)));
  CHECK(hub.engine.params()[0] == doctest::Approx(2.0));  // (0 + 1 + 2 + 3 + 4) / 5
  // Three coordinates: n1, n3, n4 as mixed, n2 its round 1, all against x_0.
  CHECK(distances(ms(1)) == std::vector<double>{3.0, 108.0, 27.0, 48.0});
  hub.send(3, 1, 6.0, ms(2));  // between the rounds: against x_1 = 2 at the start
  REQUIRE(hub.engine.tryStart(ms(2)));
  CHECK(distances(ms(2)) == std::vector<double>{3.0, 108.0, 48.0, 48.0});
  CHECK(hub.engine.onEstimate(4, 0, Eigen::VectorXd::Constant(3, 10.0).eval().data(), ms(3)) ==
        Receipt::Stale);  // not kept: measured on arrival, against x_1
  CHECK(distances(ms(3)) == std::vector<double>{3.0, 108.0, 48.0, 192.0});
}

TEST_CASE("a delta with its gradient: applied as given, its step size is the trainer's") {
  EngineOptions options = withPolicy(PolicyKind::Static);
  options.policy.backups = 4;  // mix with nobody: x_{k+1} = x_k + d
  options.minResponders = 0;
  Hub hub(options, 0.01);
  const Eigen::VectorXd g = Eigen::Vector3d(1.0, 2.0, 3.0);
  double expectedEta = 0;
  Eigen::VectorXd x = Eigen::VectorXd::Zero(3);
  for (const double eta : {0.3, 0.5, 0.0}) {
    REQUIRE(hub.engine.tryStart(ms(0)));
    const Eigen::VectorXd delta = -eta * g;
    hub.engine.onDelta(hub.engine.round(), delta, g, 1.0, GradientStats{14.0, 0.0}, ms(0));
    const auto record = hub.engine.tryFinish(ms(0));
    REQUIRE(record);
    // -g.d / ||g||^2 = eta, averaged over rounds (weight 0.1), not the schedule's 0.01.
    expectedEta = eta == 0.3 ? eta : expectedEta + 0.1 * (eta - expectedEta);
    CHECK(record->learningRate == doctest::Approx(expectedEta));
    x += delta;
    CHECK((hub.engine.params() - x).norm() == doctest::Approx(0.0));
  }
  // A plain delta (no gradient) leaves the average alone; a gradient steps at the schedule's.
  REQUIRE(hub.engine.tryStart(ms(0)));
  hub.engine.onGradient(hub.engine.round(), g, 1.0, GradientStats{}, ms(0), UpdateKind::Delta);
  const auto plain = hub.engine.tryFinish(ms(0));
  REQUIRE(plain);
  CHECK(plain->learningRate == doctest::Approx(0.01));
  CHECK((hub.engine.params() - (x + g)).norm() == doctest::Approx(0.0));
}

TEST_CASE("outer: nesterov takes DiLoCo's outer step on deltas and on -eta g") {
  EngineOptions options = withPolicy(PolicyKind::Static);
  options.policy.backups = 4;  // mix with nobody: only the outer step moves x
  options.minResponders = 0;
  options.outer = Outer::Nesterov;
  options.outerLearningRate = 0.7;
  options.outerMomentum = 0.9;
  Hub hub(options, 0.1);
  CHECK(hub.engine.keepsVelocity());
  Eigen::VectorXd x = Eigen::VectorXd::Zero(3);
  Eigen::VectorXd v = Eigen::VectorXd::Zero(3);
  const auto expectStep = [&](const Eigen::VectorXd& u) {
    v = 0.9 * v + u;
    x += 0.7 * (u + 0.9 * v);
    CHECK((hub.engine.params() - x).norm() == doctest::Approx(0.0).epsilon(1e-12));
    CHECK((hub.engine.velocity() - v).norm() == doctest::Approx(0.0).epsilon(1e-12));
  };
  for (const Eigen::Vector3d& delta : {Eigen::Vector3d(1, -2, 0.5), Eigen::Vector3d(0.25, 1, 3)}) {
    REQUIRE(hub.engine.tryStart(ms(0)));
    hub.engine.onGradient(hub.engine.round(), delta, 1.0, GradientStats{}, ms(0),
                          UpdateKind::Delta);
    REQUIRE(hub.engine.tryFinish(ms(0)));
    expectStep(delta);
  }
  const Eigen::VectorXd g = Eigen::Vector3d(2, 0, -1);
  REQUIRE(hub.engine.tryStart(ms(0)));
  hub.engine.onGradient(hub.engine.round(), g, 1.0, GradientStats{}, ms(0));
  REQUIRE(hub.engine.tryFinish(ms(0)));
  expectStep(-0.1 * g);
  // A checkpoint's velocity comes back as the outer momentum.
  Hub resumed(options, 0.1);
  resumed.engine.restoreVelocity(v);
  CHECK((resumed.engine.velocity() - v).norm() == 0.0);
  // Its own momentum besides train.momentum would be two velocities in one checkpoint.
  CHECK_THROWS_AS(Hub(options, 0.1, 0.9), std::invalid_argument);
}

TEST_CASE("the mailbox keeps an owned estimate in place and copies one without an owner") {
  Mailbox<double> mailbox(2, 3);
  auto received = std::make_shared<Eigen::VectorXd>(Eigen::Vector3d(1.0, 2.0, 3.0));
  CHECK(mailbox.store(4, received->data(), ms(0), 0, received) == Receipt::Stored);
  CHECK(mailbox.exact(4)->values == received->data());  // no copy
  CHECK(received.use_count() == 2);

  Eigen::VectorXd scratch = Eigen::Vector3d(7.0, 8.0, 9.0);
  CHECK(mailbox.store(5, scratch.data(), ms(1), 0) == Receipt::Stored);
  scratch.setZero();  // the caller's buffer is reused at once: the entry kept its own copy
  CHECK(mailbox.exact(5)->values[1] == 8.0);
  CHECK(mailbox.store(5, scratch.data(), ms(1), 0) == Receipt::Duplicate);

  mailbox.discardBefore(5);  // the message goes back when its entry is dropped
  CHECK(mailbox.exact(4) == nullptr);
  CHECK(received.use_count() == 1);
}

TEST_CASE("a published round's parameters are never written while someone holds them") {
  EngineOptions options = withPolicy(PolicyKind::Static);
  options.policy.backups = 4;  // nobody to wait for: x_{k+1} = x_k - eta g
  options.minResponders = 0;
  Hub hub(options, 1.0);
  std::vector<std::shared_ptr<const Eigen::VectorXd>> held;
  std::vector<Eigen::VectorXd> seen;
  for (int k = 0; k < 6; ++k) {
    auto start = hub.engine.tryStart(ms(k));
    REQUIRE(start);
    CHECK(start->params.get() == &hub.engine.params());  // shared, not a copy
    if (k % 2 == 0) {  // a send in flight or a slow compute job keeps every other round's
      held.push_back(start->params);
      seen.push_back(*start->params);
    }
    hub.gradient(ms(k), 1.0);
    REQUIRE(hub.engine.tryFinish(ms(k)));
  }
  CHECK(hub.engine.params() == Eigen::VectorXd::Constant(3, -6.0));
  for (std::size_t i = 0; i < held.size(); ++i) CHECK(*held[i] == seen[i]);
}

TEST_CASE("swapGradient takes the buffer and hands one back, and refuses without a swap") {
  EngineOptions options = withPolicy(PolicyKind::Static);
  options.policy.backups = 4;
  options.minResponders = 0;
  Hub hub(options, 0.5);
  Eigen::VectorXd gradient = Eigen::VectorXd::Constant(3, 2.0);
  const double* const given = gradient.data();
  hub.engine.swapGradient(0, gradient, 0.0, GradientStats{}, ms(0));  // not started: refused
  CHECK(gradient.data() == given);
  REQUIRE(hub.engine.tryStart(ms(0)));
  Eigen::VectorXd wrongSize = Eigen::VectorXd::Zero(4);
  CHECK_THROWS_AS(hub.engine.swapGradient(0, wrongSize, 0.0, GradientStats{}, ms(0)),
                  std::logic_error);
  hub.engine.swapGradient(0, gradient, 0.0, GradientStats{}, ms(0));
  CHECK(gradient.data() != given);  // the engine's previous buffer, for the next gradient
  CHECK(gradient == Eigen::VectorXd::Zero(3));
  REQUIRE(hub.engine.tryFinish(ms(0)));
  CHECK(hub.engine.params() == Eigen::VectorXd::Constant(3, -1.0));
  // What comes back is zeros or an update given before, never anything the
  // engine wrote (a driver without a model keeps its zeros without zeroing).
  for (std::int64_t round = 1; round < 5; ++round) {
    REQUIRE(hub.engine.tryStart(ms(0)));
    gradient.setConstant(2.0);
    hub.engine.swapGradient(round, gradient, 0.0, GradientStats{}, ms(0));
    CHECK((gradient == Eigen::VectorXd::Zero(3) || gradient == Eigen::VectorXd::Constant(3, 2.0)));
    REQUIRE(hub.engine.tryFinish(ms(0)));
  }
}

TEST_CASE("a neighbour with an estimate half here is suspect only after four peer timeouts") {
  EngineOptions options = withPolicy(PolicyKind::All);
  options.peerTimeout = milliseconds(100);
  Hub hub(options);
  REQUIRE(hub.engine.tryStart(ms(0)));
  hub.engine.onKeepAlive(1, 0, ms(10));
  hub.engine.onArriving(2, 0, ms(10));  // a part of its estimate of round 0
  CHECK(hub.engine.suspect(0, ms(109)) == false);
  CHECK(hub.engine.suspect(0, ms(110)));        // silent for a peer timeout
  CHECK_FALSE(hub.engine.suspect(1, ms(409)));  // its transfer stalled: not dead yet
  CHECK(hub.engine.suspect(1, ms(410)));
  hub.send(2, 0, 1.0, ms(50));  // the rest came: a peer timeout again from here
  CHECK_FALSE(hub.engine.suspect(1, ms(149)));
  CHECK(hub.engine.suspect(1, ms(150)));
}

TEST_CASE(
    "a neighbour that said goodbye is counted out at once, lead bound included, until it is back") {
  const Topology pair = graph("chain", 2);
  EngineOptions options = withPolicy(PolicyKind::All);
  options.maxLead = 1;
  options.roundSkipping = false;
  Engine a(pair, 0, options, rate(0.0), 0.0, Eigen::VectorXd::Zero(1), Time{});
  CHECK(a.onKeepAlive(1, 0, ms(1)) == Receipt::Stored);
  REQUIRE(a.tryStart(ms(1)));
  a.onGradient(0, Eigen::VectorXd::Zero(1), 0.0, GradientStats{}, ms(2));
  CHECK_FALSE(a.tryFinish(ms(3)));  // policy all: waits for n1
  // n1 stops (SIGTERM): its goodbye ends the round now, not a peer timeout later.
  CHECK(a.onKeepAlive(1, 0, ms(4), Presence::Left) == Receipt::Stored);
  CHECK(a.presence(0) == Presence::Left);
  CHECK(a.suspect(0, ms(4)));
  // Rounds go on alone, past the lead bound over its round 0.
  for (std::int64_t round = 0; round < 4; ++round) {
    if (round > 0) {
      REQUIRE(a.tryStart(ms(5)));
      a.onGradient(round, Eigen::VectorXd::Zero(1), 0.0, GradientStats{}, ms(5));
    }
    const auto alone = a.tryFinish(ms(5));
    REQUIRE(alone);
    CHECK(alone->responders.empty());
    CHECK(alone->live == 0);
  }
  // Restarted at its round 0, it says hello: no longer gone, but further
  // behind than the lead bound lets a neighbour fall (max_lead + skip_ahead):
  // it catches up by skipping, and is not waited for meanwhile.
  CHECK(a.onKeepAlive(1, 0, ms(6)) == Receipt::Stored);
  CHECK(a.presence(0) == Presence::Working);
  CHECK_FALSE(a.suspect(0, ms(6)));
  REQUIRE(a.tryStart(ms(6)));
  a.onGradient(4, Eigen::VectorXd::Zero(1), 0.0, GradientStats{}, ms(6));
  const auto behind = a.tryFinish(ms(6));
  REQUIRE(behind);
  CHECK(behind->live == 0);
  // Within reach again: waited for, and bounding our lead.
  CHECK(a.onKeepAlive(1, 3, ms(7)) == Receipt::Stored);
  CHECK_FALSE(a.tryStart(ms(7)));  // round 5 is more than 1 ahead of its round 3

  // With two neighbours: the last estimate of one that then left is mixed,
  // but does not stand in for the other, which is still waited for.
  const Topology ring = graph("ring", 3);
  Engine b(ring, 0, withPolicy(PolicyKind::All), rate(0.0), 0.0, Eigen::VectorXd::Zero(1), Time{});
  const Eigen::VectorXd three = Eigen::VectorXd::Constant(1, 3.0);
  REQUIRE(b.tryStart(ms(0)));
  b.onGradient(0, Eigen::VectorXd::Zero(1), 0.0, GradientStats{}, ms(0));
  CHECK(b.onEstimate(1, 0, three.data(), ms(1)) == Receipt::Stored);
  CHECK(b.onKeepAlive(1, 0, ms(1), Presence::Left) == Receipt::Stored);
  CHECK_FALSE(b.tryFinish(ms(2)));  // n2 works and is live: waited for
  CHECK(b.onEstimate(2, 0, three.data(), ms(3)) == Receipt::Stored);
  const auto both = b.tryFinish(ms(3));
  REQUIRE(both);
  CHECK(both->responders == std::vector<std::size_t>{1, 2});
}

TEST_CASE("an idle neighbour (no trainer) is not waited for until it says it computes again") {
  const Topology pair = graph("chain", 2);
  EngineOptions options = withPolicy(PolicyKind::All);
  Engine a(pair, 0, options, rate(0.0), 0.0, Eigen::VectorXd::Zero(1), Time{});
  const Eigen::VectorXd theirs = Eigen::VectorXd::Constant(1, 1.0);
  // Round 0: n1 is live and not idle, so the round waits for its estimate.
  CHECK(a.onKeepAlive(1, 0, ms(1)) == Receipt::Stored);
  REQUIRE(a.tryStart(ms(1)));
  a.onGradient(0, Eigen::VectorXd::Zero(1), 0.0, GradientStats{}, ms(2));
  CHECK_FALSE(a.tryFinish(ms(3)));
  // Its trainer is gone: the round ends now, without it (not at the hard deadline).
  CHECK(a.onKeepAlive(1, 0, ms(4), Presence::Idle) == Receipt::Stored);
  CHECK(a.presence(0) == Presence::Idle);
  CHECK(a.suspect(0, ms(4)));
  const auto alone = a.tryFinish(ms(4));
  REQUIRE(alone);
  CHECK(alone->responders.empty());
  CHECK(alone->live == 0);
  // A trainer again: waited for again.
  CHECK(a.onKeepAlive(1, 0, ms(5)) == Receipt::Stored);
  CHECK(a.presence(0) == Presence::Working);
  REQUIRE(a.tryStart(ms(5)));
  a.onGradient(1, Eigen::VectorXd::Zero(1), 0.0, GradientStats{}, ms(5));
  CHECK_FALSE(a.tryFinish(ms(6)));
  CHECK(a.onEstimate(1, 1, theirs.data(), ms(7)) == Receipt::Stored);
  const auto mixed = a.tryFinish(ms(7));
  REQUIRE(mixed);
  CHECK(mixed->responders == std::vector<std::size_t>{1});
}

namespace {

// A graph of the given ids and undirected edges (Metropolis weights).
Topology graphOf(const std::vector<std::string>& ids,
                 const std::vector<std::pair<std::string, std::string>>& edges) {
  consensusd::topology::TopologySpec spec;
  spec.name = "test";
  int port = 7000;
  for (const std::string& id : ids) {
    consensusd::topology::NodeSpec node;
    node.id = id;
    node.endpoint = "tcp://127.0.0.1:" + std::to_string(port++);
    spec.nodes.push_back(node);
  }
  for (const auto& [from, to] : edges) {
    consensusd::topology::EdgeSpec edge;
    edge.from = from;
    edge.to = to;
    spec.edges.push_back(edge);
  }
  return Topology::fromSpec(spec, "<test>");
}

}  // namespace

TEST_CASE(
    "a new topology between rounds: neighbours kept by id, new ones added, gone ones dropped") {
  // A ring n0-n1-n2-n3; then n1 leaves and n4 comes between n0 and n2.
  const Topology before =
      graphOf({"n0", "n1", "n2", "n3"}, {{"n0", "n1"}, {"n1", "n2"}, {"n2", "n3"}, {"n3", "n0"}});
  const Topology after =
      graphOf({"n0", "n2", "n3", "n4"}, {{"n0", "n4"}, {"n4", "n2"}, {"n2", "n3"}, {"n3", "n0"}});
  EngineOptions options = withPolicy(PolicyKind::All);
  options.peerTimeout = milliseconds(100);
  Engine a(before, 0, options, rate(0.0), 0.0, Eigen::VectorXd::Zero(1), Time{});
  const Eigen::VectorXd four = Eigen::VectorXd::Constant(1, 4.0);
  const Eigen::VectorXd six = Eigen::VectorXd::Constant(1, 6.0);
  CHECK(a.onEstimate(3, 0, four.data(), ms(1)) == Receipt::Stored);  // n3 (index 3)
  CHECK(a.onKeepAlive(1, 0, ms(1)) == Receipt::Stored);              // n1 (index 1)

  a.setTopology(after, 0, ms(2));
  REQUIRE(a.degree() == 2);
  CHECK(a.nodeOfSlot(0) == 2);  // n3, now index 2: its estimate is still held
  CHECK(a.newestRound(0) == 0);
  CHECK(a.nodeOfSlot(1) == 3);  // n4: new, nothing held
  CHECK(a.newestRound(1) == -1);
  // It may not run yet: no round waits for it until it speaks (twice, as a suspect).
  CHECK(a.suspect(1, ms(2)));
  CHECK(a.onKeepAlive(3, 0, ms(3)) == Receipt::Stored);
  CHECK(a.suspect(1, ms(3)));
  CHECK(a.onKeepAlive(3, 0, ms(4)) == Receipt::Stored);
  CHECK_FALSE(a.suspect(1, ms(4)));
  // Index 1 is n2 now: no neighbour of ours.
  CHECK(a.onKeepAlive(1, 0, ms(3)) == Receipt::NotNeighbor);

  // The round waits for both (policy all) and mixes with the new weights.
  REQUIRE(a.tryStart(ms(4)));
  a.onGradient(0, Eigen::VectorXd::Zero(1), 0.0, GradientStats{}, ms(4));
  CHECK_FALSE(a.tryFinish(ms(5)));
  CHECK_THROWS_AS(a.setTopology(before, 0, ms(5)), std::logic_error);  // not mid-round
  CHECK(a.onEstimate(3, 0, six.data(), ms(6)) == Receipt::Stored);
  const auto record = a.tryFinish(ms(6));
  REQUIRE(record);
  CHECK(record->responders == std::vector<std::size_t>{2, 3});
  CHECK(a.params()[0] == doctest::Approx(10.0 / 3.0));  // Metropolis on a ring: 1/3 each
}
