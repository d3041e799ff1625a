// The synchronous baseline of the simulator (simulateSynchronous): every
// node waits for every other at each step, so one loop over steps needs no
// events.

#include <algorithm>

#include "compute.hpp"

namespace consensusd::sim {
namespace {

using consensus::Time;

// The synchronous baseline: one loop over steps, no events needed (every
// node waits for every other at each step).
class SynchronousRun {
 public:
  SynchronousRun(const topology::Topology& topology, const data::TrainTest& data,
                 const std::vector<data::Dataset>& shares, const SimOptions& options)
      : topology_(topology),
        shares_(shares),
        options_(options),
        model_(options.model),
        testAccuracy_(options.model, data.test, std::max<std::size_t>(options.threads, 1)),
        x_(static_cast<Eigen::Index>(model_.dimension())),
        sgd_(model_.dimension(), options.momentum) {
    model_.initialize(x_, options.initSeed);
    for (std::size_t i = 0; i < topology.size(); ++i) {
      samplers_.emplace_back(shares[i].size(), options.engine.batchSize, options.seed * 7919u + i);
      stragglers_.push_back(stragglersOf(options, i));
    }
  }

  SimResult run() {
    const std::size_t n = topology_.size();
    const double bytes =
        static_cast<double>(options_.link.estimateBytes != 0 ? options_.link.estimateBytes
                                                             : model_.dimension() * sizeof(float));
    Vector gradient(x_.size());
    Vector sum(x_.size());
    data::Batch<float> batch;
    Time now{};
    Time nextSample{};
    double lossEwma = 0;
    // Samples at or before `until`, of x as it is now.
    const auto sampleUntil = [&](Time until, std::int64_t step) {
      for (; nextSample <= until && nextSample <= options_.maxTime;
           nextSample += options_.sampleEvery)
        if (sample(nextSample, step, lossEwma)) return true;
      return false;
    };
    for (std::int64_t step = 0;; ++step) {
      if (sampleUntil(now, step)) return finish(step);
      // Every node's gradient at x; the step waits for the slowest.
      sum.setZero();
      double loss = 0;
      Duration slowest{};
      Duration slowLink{};
      for (std::size_t i = 0; i < n; ++i) {
        data::gather(shares_[i], samplers_[i].next(), batch);
        loss += static_cast<double>(model_.lossAndGradient(x_, batch, gradient));
        sum += gradient;
        Duration compute = options_.compute;
        for (consensus::Straggler& straggler : stragglers_[i]) {
          compute += straggler.extraDelay(step, options_.compute);
          slowLink = std::max(slowLink, straggler.linkDelay(step));
        }
        slowest = std::max(slowest, compute);
      }
      // (At least a microsecond: a step of no time would never reach the next sample.)
      const Duration took =
          std::max<Duration>(slowest + allReduce(bytes, slowLink), std::chrono::microseconds(1));
      if (now + took > options_.maxTime) {  // not done by the end: the last samples without it
        sampleUntil(options_.maxTime, step);
        return finish(step);
      }
      lossEwma = step == 0 ? loss / static_cast<double>(n)
                           : lossEwma + 0.05 * (loss / static_cast<double>(n) - lossEwma);
      sgd_.step(x_, sum / static_cast<float>(n), options_.schedule.at(step));
      now += took;
      result_.rounds += static_cast<std::int64_t>(n);
      result_.bytesSent += static_cast<std::uint64_t>(2.0 * bytes * static_cast<double>(n - 1));
    }
  }

 private:
  SimResult finish(std::int64_t steps) {
    result_.nodeRounds.assign(topology_.size(), steps);
    result_.nodeParams.assign(topology_.size(), x_);
    return std::move(result_);
  }

  // A ring all-reduce of `bytes`: 2(N-1) steps, each as slow as the slowest
  // link of the ring (nodes in the topology's order) carrying 1/N of it.
  Duration allReduce(double bytes, Duration slowLink) const {
    const std::size_t n = topology_.size();
    if (n < 2) return Duration::zero();
    double slowness = 1;
    if (options_.link.spread > 0)
      for (std::size_t i = 0; i < n; ++i)
        slowness = std::max(slowness, linkSlowness(options_.link, options_.seed, i, (i + 1) % n));
    const double part = bytes / static_cast<double>(n) / options_.link.bytesPerSecond;
    const Duration oneStep =
        std::chrono::duration_cast<Duration>(
            (options_.link.latency + std::chrono::duration<double>(part)) * slowness) +
        slowLink;
    return oneStep * static_cast<std::int64_t>(2 * (n - 1));
  }

  bool sample(Time at, std::int64_t step, double lossEwma) {
    Sample row;
    row.timeS = std::chrono::duration<double>(at).count();
    row.meanRound = static_cast<double>(step);
    row.meanLoss = step > 0 ? lossEwma : std::numeric_limits<double>::quiet_NaN();
    row.accuracy = row.minAccuracy = row.maxAccuracy = testAccuracy_(x_);
    row.meanTarget = static_cast<double>(topology_.size() - 1);
    const double n = static_cast<double>(topology_.size());
    row.sentBytesPerNode = static_cast<double>(result_.bytesSent) / n;
    const double samples = row.meanRound * static_cast<double>(options_.engine.batchSize);
    row.sentBytesPerSample = samples > 0 ? row.sentBytesPerNode / samples : 0.0;
    result_.samples.push_back(row);
    return options_.stopAtAccuracy > 0 && row.accuracy >= options_.stopAtAccuracy;
  }

  const topology::Topology& topology_;
  const std::vector<data::Dataset>& shares_;
  const SimOptions& options_;
  data::Model<float> model_;
  TestAccuracy testAccuracy_;
  Vector x_;
  data::Sgd<float> sgd_;
  std::vector<data::MinibatchSampler> samplers_;
  std::vector<std::vector<consensus::Straggler>> stragglers_;
  SimResult result_;
};

}  // namespace

SimResult simulateSynchronous(const topology::Topology& topology, const data::TrainTest& data,
                              const std::vector<data::Dataset>& shares, const SimOptions& options) {
  return SynchronousRun(topology, data, shares, options).run();
}

}  // namespace consensusd::sim
