#pragma once
// Single-node minibatch SGD: the baseline every decentralized run is
// compared with (`consensusctl train`).

#include <cstdint>
#include <functional>
#include <vector>

#include "consensusd/data/dataset.hpp"
#include "consensusd/data/model.hpp"
#include "consensusd/data/optimizer.hpp"

namespace consensusd::data {

struct LocalTrainOptions {
  ModelOptions model;
  Schedule schedule;
  double momentum = 0.0;
  std::size_t batchSize = 32;
  std::int64_t rounds = 1000;
  std::int64_t evalEveryRounds = 100;  // 0: only at the end
  double untilAccuracy = 0.0;          // stop early at this test accuracy; 0 = off
  double maxTimeS = 0.0;               // stop after this wall time; 0 = off
  std::uint64_t seed = 1;              // minibatch order
  std::uint64_t initSeed = 1;          // initial parameters
};

struct TrainPoint {
  std::int64_t round = 0;
  std::size_t epoch = 0;
  double trainLoss = 0.0;  // EWMA of minibatch losses
  double testLoss = 0.0;
  double testAccuracy = 0.0;
  double gradNormSq = 0.0;      // EWMA
  double sampleVariance = 0.0;  // EWMA
  double samplesPerSecond = 0.0;
  double elapsedS = 0.0;
};

struct TrainResult {
  std::vector<TrainPoint> curve;  // one point per evaluation, the last at the end
};

// Calls `onEval` after each evaluation (progress lines, CSV rows).
template <class Scalar>
TrainResult trainLocal(const TrainTest& data, const LocalTrainOptions& options,
                       const std::function<void(const TrainPoint&)>& onEval = {});

}  // namespace consensusd::data
