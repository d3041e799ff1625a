// Straggler models (straggler.cpp): seeded draws, means, schedule.

#include "helpers.hpp"

using namespace consensus_test;

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

TEST_CASE("straggler models: a slow link delays estimates in the model's rounds only") {
  StragglerSpec spec;
  spec.linkDelay = milliseconds(30);
  CHECK(linkDelayAt(spec, 0) == milliseconds(30));
  spec.fromRound = 10;
  spec.toRound = 19;
  CHECK(linkDelayAt(spec, 9) == Duration::zero());
  CHECK(linkDelayAt(spec, 10) == milliseconds(30));
  CHECK(linkDelayAt(spec, 19) == milliseconds(30));
  CHECK(linkDelayAt(spec, 20) == Duration::zero());
  const Straggler straggler(spec);
  CHECK(straggler.linkDelay(15) == milliseconds(30));
}
