#include "consensusd/data/local_trainer.hpp"

#include <chrono>

namespace consensusd::data {

template <class Scalar>
TrainResult trainLocal(const TrainTest& data, const LocalTrainOptions& options,
                       const std::function<void(const TrainPoint&)>& onEval) {
  using Vector = typename Model<Scalar>::Vector;
  using Clock = std::chrono::steady_clock;
  constexpr double kSmoothing = 0.05;  // EWMA weight of the newest minibatch

  Model<Scalar> model(options.model);
  Vector params(static_cast<Eigen::Index>(model.dimension()));
  Vector gradient(params.size());
  model.initialize(params, options.initSeed);
  Sgd<Scalar> sgd(model.dimension(), options.momentum);
  MinibatchSampler sampler(data.train.size(), options.batchSize, options.seed);
  Batch<Scalar> batch;
  GradientStats stats;

  TrainResult result;
  TrainPoint point;
  const Clock::time_point start = Clock::now();
  Clock::duration training{};
  std::size_t samples = 0;
  const auto evaluateNow = [&](std::int64_t round) {
    const Evaluation test = model.evaluate(params, data.test);
    point.round = round;
    point.epoch = sampler.epoch();
    point.testLoss = test.loss;
    point.testAccuracy = test.accuracy;
    point.elapsedS = std::chrono::duration<double>(Clock::now() - start).count();
    point.samplesPerSecond = static_cast<double>(samples) /
                             std::max(1e-9, std::chrono::duration<double>(training).count());
    result.curve.push_back(point);
    if (onEval) onEval(point);
  };

  std::int64_t round = 0;
  while (options.rounds == 0 || round < options.rounds) {
    const Clock::time_point stepStart = Clock::now();
    gather(data.train, sampler.next(), batch);
    const double loss = static_cast<double>(model.lossAndGradient(params, batch, gradient, &stats));
    sgd.step(params, gradient, options.schedule.at(round));
    training += Clock::now() - stepStart;
    samples += batch.size();
    const double weight = round == 0 ? 1.0 : kSmoothing;
    point.trainLoss += weight * (loss - point.trainLoss);
    point.gradNormSq += weight * (stats.gradNormSq - point.gradNormSq);
    point.sampleVariance += weight * (stats.sampleVariance - point.sampleVariance);
    ++round;

    const bool outOfTime =
        options.maxTimeS > 0 &&
        std::chrono::duration<double>(Clock::now() - start).count() >= options.maxTimeS;
    const bool last = round == options.rounds || outOfTime;
    if (last || (options.evalEveryRounds > 0 && round % options.evalEveryRounds == 0)) {
      evaluateNow(round);
      if (last || (options.untilAccuracy > 0 && point.testAccuracy >= options.untilAccuracy)) break;
    }
  }
  return result;
}

template TrainResult trainLocal<float>(const TrainTest&, const LocalTrainOptions&,
                                       const std::function<void(const TrainPoint&)>&);
template TrainResult trainLocal<double>(const TrainTest&, const LocalTrainOptions&,
                                        const std::function<void(const TrainPoint&)>&);

}  // namespace consensusd::data
