// A trainer's updates into the round engine, held by the emulated straggler.

#include "trainer/trainer_feed.hpp"

#include <doctest/doctest.h>

#include <vector>

#include "consensusd/topology/generators.hpp"

using consensusd::consensus::Duration;
using consensusd::consensus::StragglerKind;
using consensusd::consensus::StragglerSpec;
using consensusd::consensus::Time;
using consensusd::daemon::TrainerFeed;
using consensusd::daemon::TrainerUpdate;
using Engine = consensusd::consensus::RoundEngine<double>;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t kDimension = 3;

consensusd::topology::Topology pair() {
  consensusd::topology::GeneratorOptions options;
  options.kind = "ring";
  options.nodes = 2;
  return consensusd::topology::Topology::fromSpec(consensusd::topology::generate(options),
                                                  "<test>");
}

struct Fixture {
  consensusd::topology::Topology topology = pair();
  Engine engine{topology, 0, {}, {}, 0.0, Eigen::VectorXd::Zero(kDimension), Time{}};
  std::vector<double> delta = std::vector<double>(kDimension, 0.5);

  TrainerUpdate update(std::uint64_t samples) const {
    TrainerUpdate u;
    u.kind = consensusd::consensus::UpdateKind::Delta;
    u.samples = samples;
    u.values = std::as_bytes(std::span(delta));
    return u;
  }
};

// Whether each update of `samples` (in order) was held by a bimodal
// straggler of the given seed; every held one is released when due.
std::vector<bool> heldOf(const std::vector<std::uint64_t>& samples, std::uint64_t seed) {
  StragglerSpec spec;
  spec.kind = StragglerKind::Bimodal;
  spec.slowProbability = 0.5;
  spec.baseCompute = 10ms;
  spec.seed = seed;
  Fixture fixture;
  TrainerFeed<double> feed(spec);
  std::vector<bool> held;
  Time now{};
  for (const std::uint64_t n : samples) {
    const bool fed = feed.take(fixture.update(n), fixture.engine, now).has_value();
    held.push_back(!fed);
    if (!fed) {
      REQUIRE(feed.due());
      now = *feed.due();
      REQUIRE(feed.takeDue(fixture.engine, now));
    }
  }
  return held;
}

StragglerSpec constantDelay() {
  StragglerSpec spec;
  spec.kind = StragglerKind::Constant;
  spec.delay = 50ms;
  return spec;
}

}  // namespace

TEST_CASE("trainer feed: an update is held for the straggler's delay, then fed") {
  Fixture fixture;
  TrainerFeed<double> feed(constantDelay());
  const Time start{};
  CHECK_FALSE(feed.take(fixture.update(16), fixture.engine, start));
  REQUIRE(feed.due());
  CHECK(*feed.due() == start + Duration(50ms));
  CHECK_FALSE(feed.takeDue(fixture.engine, start + Duration(49ms)));
  const auto fed = feed.takeDue(fixture.engine, start + Duration(50ms));
  REQUIRE(fed);
  CHECK(fed->samples == std::uint64_t{16});
  CHECK_FALSE(feed.due());
}

TEST_CASE("trainer feed: a round that only mixes (0 samples) is never held") {
  Fixture fixture;
  TrainerFeed<double> feed(constantDelay());
  const auto fed = feed.take(fixture.update(0), fixture.engine, Time{});
  REQUIRE(fed);
  CHECK(fed->samples == std::uint64_t{0});
  CHECK_FALSE(feed.due());
}

TEST_CASE("trainer feed: rounds that only mix take no draw from the straggler") {
  // The same seed, with and without a mixing round after each delta: the
  // deltas are held exactly alike.
  const std::vector<std::uint64_t> deltas(24, 16);
  std::vector<std::uint64_t> interleaved;
  for (const std::uint64_t n : deltas) {
    interleaved.push_back(n);
    interleaved.push_back(0);
  }
  const std::vector<bool> alone = heldOf(deltas, 7);
  const std::vector<bool> withMixing = heldOf(interleaved, 7);
  std::vector<bool> deltasOnly;
  for (std::size_t i = 0; i < withMixing.size(); i += 2) deltasOnly.push_back(withMixing[i]);
  CHECK(deltasOnly == alone);
  for (std::size_t i = 1; i < withMixing.size(); i += 2) CHECK_FALSE(withMixing[i]);
  // Half of the deltas are slow on average: the sequence is not trivial.
  CHECK(std::count(alone.begin(), alone.end(), true) > 3);
  CHECK(std::count(alone.begin(), alone.end(), false) > 3);
}
