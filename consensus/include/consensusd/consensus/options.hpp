#pragma once
// Parameters of one node's round (docs/design.md §2-3), in core units. Time is
// std::chrono::nanoseconds since the driver's epoch: the core never reads a
// clock, the daemon passes steady_clock readings and the simulator its
// virtual time.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "consensusd/consensus/codec.hpp"
#include "consensusd/data/names.hpp"

namespace consensusd::consensus {

using Time = std::chrono::nanoseconds;  // since the driver's epoch
using Duration = std::chrono::nanoseconds;

// Config values are milliseconds as doubles.
inline Duration fromMilliseconds(double ms) {
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double, std::milli>(ms));
}

enum class MixRound { Newest, Same };
enum class MixMode { Absorb, Renormalize, Symmetric };
// Robust mixing against a neighbour that sends garbage (opt-in): clip each
// neighbour's difference to a radius, or a coordinate-wise trimmed mean.
enum class Robust { None, Clip, TrimmedMean };
enum class PolicyKind { All, Static, Timeout, Quantile, Dynamic };

inline constexpr data::NameTable<MixRound, 2> kMixRounds{
    {{MixRound::Newest, "newest"}, {MixRound::Same, "same"}}};
inline constexpr data::NameTable<MixMode, 3> kMixModes{{{MixMode::Absorb, "absorb"},
                                                        {MixMode::Renormalize, "renormalize"},
                                                        {MixMode::Symmetric, "symmetric"}}};
inline constexpr data::NameTable<Robust, 3> kRobustModes{
    {{Robust::None, "none"}, {Robust::Clip, "clip"}, {Robust::TrimmedMean, "trimmed-mean"}}};
inline constexpr data::NameTable<PolicyKind, 5> kPolicyKinds{{{PolicyKind::All, "all"},
                                                              {PolicyKind::Static, "static"},
                                                              {PolicyKind::Timeout, "timeout"},
                                                              {PolicyKind::Quantile, "quantile"},
                                                              {PolicyKind::Dynamic, "dynamic"}}};

// Each round's update after the mix: plain x + u, or DiLoCo's outer step
// with Nesterov momentum on u (data/optimizer.hpp; docs/trainers.md).
enum class Outer { Plain, Nesterov };
inline constexpr data::NameTable<Outer, 2> kOuters{
    {{Outer::Plain, "plain"}, {Outer::Nesterov, "nesterov"}}};

// When a round's estimate leaves for the neighbours: at the round's start
// (x_k, sent while the update is computed), or with the update (x_k + u:
// the mix then averages the neighbours' results, as FedAvg's average does,
// one exchange per round of local steps; docs/trainers.md).
enum class Publish { Start, Update };
inline constexpr data::NameTable<Publish, 2> kPublishes{
    {{Publish::Start, "start"}, {Publish::Update, "update"}}};

struct PolicySpec {
  PolicyKind kind = PolicyKind::Dynamic;
  std::int64_t backups = 1;                         // static: b
  Duration timeout{std::chrono::milliseconds(20)};  // timeout
  double quantile = 0.5;                            // quantile: q
  bool pullTerm = true;    // dynamic: the consensus pull counts in the gain
  bool noiseTerm = false;  // dynamic: DBW's minibatch-noise term S2(m) (off: consensus/README.md)
  // dynamic: the descent leaves out the part of the gradient the neighbours
  // pull back every round (the node's data differing from theirs); off by
  // default: docs/design-notes.md, "Who keeps a missing neighbour's weight"
  bool heterogeneityTerm = false;
  // dynamic: once the arrival window is full, every count of neighbours
  // whose progress per second at the node's own pace is within this fraction
  // of the best ties with it, and ties go to more neighbours
  // (docs/design-notes.md, "A margin for mixing")
  double tieMargin = 0.05;
};

struct EngineOptions {
  PolicySpec policy;
  MixRound mixRound = MixRound::Newest;
  MixMode mixMode = MixMode::Renormalize;
  std::int64_t staleness = 0;  // s
  std::int64_t maxLead = 20;
  bool roundSkipping = true;
  std::int64_t skipAhead = 2;
  Robust robust = Robust::None;
  std::size_t trim = 1;   // trimmed mean: values dropped at each end, per coordinate
  double clipRadius = 0;  // clip: radius; 0 = the median distance of this round's responders
  std::size_t mailboxDepth = 4;
  // Estimates as compressed differences to public copies (codec.hpp); the
  // mix then moves x by gamma sum_j w_ij (c_j - c_i) (CHOCO-SGD's consensus
  // step; docs/protocol.md, "Compressed estimates").
  Compression compression = Compression::None;
  double consensusStep = 1.0;  // gamma
  Outer outer = Outer::Plain;
  Publish publish = Publish::Start;
  double outerLearningRate = 0.7;  // DiLoCo's
  double outerMomentum = 0.9;
  std::size_t minResponders = 1;  // m_min
  std::size_t maxResponders = 0;  // 0: the degree
  Duration peerTimeout{std::chrono::seconds(3)};
  Duration hardDeadline{std::chrono::seconds(10)};
  std::int64_t warmupRounds = 2;  // dynamic: rounds with `all` first (each can be long)
  std::size_t windowRounds = 50;  // estimator window
  std::size_t batchSize = 32;     // B, for the noise term of the dynamic rule
};

}  // namespace consensusd::consensus
