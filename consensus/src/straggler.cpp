#include "consensusd/consensus/straggler.hpp"

#include <cmath>

namespace consensusd::consensus {
namespace {

double unit(std::mt19937_64& rng) {
  return (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53;
}  // (0, 1)

Duration scaled(Duration base, double factor) {
  return Duration(static_cast<Duration::rep>(static_cast<double>(base.count()) * factor));
}

bool active(const StragglerSpec& spec, std::int64_t round) {
  return round >= spec.fromRound && (spec.toRound == 0 || round <= spec.toRound);
}

}  // namespace

Straggler::Straggler(const StragglerSpec& spec) : spec_(spec), rng_(spec.seed) {}

Duration linkDelayAt(const StragglerSpec& spec, std::int64_t round) {
  return active(spec, round) ? spec.linkDelay : Duration::zero();
}

Duration Straggler::extraDelay(std::int64_t round, Duration measuredCompute) {
  // Draw even outside the active rounds, so the sequence does not depend on them.
  const double u = unit(rng_);
  if (!active(spec_, round)) return Duration::zero();
  switch (spec_.kind) {
    case StragglerKind::None:
      return Duration::zero();
    case StragglerKind::Constant:
      return spec_.delay;
    case StragglerKind::Exponential:
      return scaled(spec_.mean, -std::log(u));
    case StragglerKind::ShiftedExponential:
      return spec_.delay + scaled(spec_.mean, -std::log(u));
    case StragglerKind::Pareto:
      // Inverse CDF: x_m / u^(1/alpha) >= x_m; the extra delay is all of it.
      return scaled(spec_.delay, std::pow(u, -1.0 / spec_.paretoShape));
    case StragglerKind::Bimodal: {
      if (u >= spec_.slowProbability) return Duration::zero();
      const Duration base =
          spec_.baseCompute > Duration::zero() ? spec_.baseCompute : measuredCompute;
      return scaled(base, spec_.slowFactor - 1.0);
    }
  }
  return Duration::zero();
}

}  // namespace consensusd::consensus
