#pragma once
// Emulated stragglers (docs/design.md §8): the extra compute delay of each round,
// drawn from a seeded model, optionally only between two rounds so regimes
// can change mid-training. The daemon sleeps it; the simulator adds it to
// virtual compute time.

#include <cstdint>
#include <optional>
#include <random>
#include <string>

#include "consensusd/consensus/options.hpp"
#include "consensusd/data/names.hpp"

namespace consensusd::consensus {

enum class StragglerKind { None, Constant, Exponential, ShiftedExponential, Pareto, Bimodal };
inline constexpr data::NameTable<StragglerKind, 6> kStragglerKinds{
    {{StragglerKind::None, "none"},
     {StragglerKind::Constant, "constant"},
     {StragglerKind::Exponential, "exponential"},
     {StragglerKind::ShiftedExponential, "shifted-exponential"},
     {StragglerKind::Pareto, "pareto"},
     {StragglerKind::Bimodal, "bimodal"}}};

struct StragglerSpec {
  StragglerKind kind = StragglerKind::None;
  Duration delay{};  // constant; shift of shifted-exponential; Pareto scale (minimum)
  Duration mean{};   // exponential part
  double paretoShape = 1.2;
  double slowProbability = 0.1;  // bimodal
  double slowFactor = 20.0;      // bimodal: a slow round takes slowFactor x base
  Duration baseCompute{};        // bimodal base; zero: the measured compute time
  Duration linkDelay{};          // on every estimate the node sends (emulated slow links)
  std::int64_t fromRound = 0;
  std::int64_t toRound = 0;  // 0: no end
  std::uint64_t seed = 1;
};

// The link delay of round `round`'s estimate: the spec's, in its rounds.
Duration linkDelayAt(const StragglerSpec& spec, std::int64_t round);

class Straggler {
 public:
  explicit Straggler(const StragglerSpec& spec);
  // The extra delay of `round`, given the measured compute time (bimodal
  // uses it when no base is set). One draw per call, in round order.
  Duration extraDelay(std::int64_t round, Duration measuredCompute);
  // The extra delay of round `round`'s estimate on its way out (no draw).
  Duration linkDelay(std::int64_t round) const { return linkDelayAt(spec_, round); }

 private:
  StragglerSpec spec_;
  std::mt19937_64 rng_;
};

}  // namespace consensusd::consensus
