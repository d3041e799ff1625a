#include "consensusd/consensus/estimators.hpp"

#include <algorithm>
#include <cmath>

namespace consensusd::consensus {
namespace {

Duration quantileOf(std::vector<Duration> values, double q) {
  if (values.empty()) return Duration::zero();
  const auto at = static_cast<std::size_t>(
      std::lround(std::clamp(q, 0.0, 1.0) * static_cast<double>(values.size() - 1)));
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(at), values.end());
  return values[at];
}

// The EWMA weight of sample n (from 1): the first samples get equal weight so
// the start is not biased to zero.
double ewmaWeight(double alpha, std::size_t n) {
  return std::max(alpha, 1.0 / static_cast<double>(n));
}

// The distribution of how many of n independent events happen, exactly[0..n],
// after one event's chance goes from p to q: p taken out (dividing by the
// larger of p and 1 - p keeps rounding errors from growing), q put in. One
// pass: each entry of the distribution without the event is used as soon as
// it is known, so the second step rides on the first's serial recurrence.
void replaceChance(std::vector<double>& exactly, std::size_t n, double p, double q) {
  if (p <= 0.5) {
    // Without the event, ascending: r[j] = (e[j] - p r[j-1]) / (1 - p).
    const double scale = 1.0 / (1.0 - p);
    double previous = exactly[0] * scale;  // r[j - 1]
    exactly[0] = previous * (1.0 - q);
    for (std::size_t j = 1; j < n; ++j) {
      const double without = (exactly[j] - p * previous) * scale;
      exactly[j] = without * (1.0 - q) + previous * q;
      previous = without;
    }
    exactly[n] = previous * q;  // r[n] = 0
  } else {
    // Descending: r[n] = 0, r[j] = (e[j + 1] - (1 - p) r[j + 1]) / p.
    const double scale = 1.0 / p;
    double above = 0.0;  // r[j + 1]
    for (std::size_t j = n; j-- > 0;) {
      const double without = (exactly[j + 1] - (1.0 - p) * above) * scale;
      exactly[j + 1] = above * (1.0 - q) + without * q;
      above = without;
    }
    exactly[0] = above * (1.0 - q);
  }
}

// E[max(C, A_(m))] for m = 0..n if the neighbours' offsets were independent,
// each drawn from its own recorded ones: P(max <= t) = P(C <= t) P(at least m
// of the n are in by t), integrated over t between the recorded values.
// `samples` holds (value, source): source n is C, k < n neighbour k.
std::vector<double> independentRoundTimes(std::size_t n, double roundCount,
                                          std::vector<std::pair<double, std::size_t>> samples) {
  std::sort(samples.begin(), samples.end());
  std::vector<double> expected(n + 1, samples.empty() ? 0.0 : samples.front().first);
  std::vector<std::size_t> inBy(n + 1, 0);  // each source's values <= t
  // How many neighbours are in by t (Poisson-binomial), kept up to date one
  // value at a time: dividing out a neighbour's old chance and multiplying in
  // its new one is O(n), so a window costs O(window n^2), not O(window n^3).
  std::vector<double> exactly(n + 1, 0.0);
  exactly[0] = 1.0;
  for (std::size_t i = 0; i + 1 < samples.size(); ++i) {
    const std::size_t source = samples[i].second;
    if (source < n) {
      const double was = static_cast<double>(inBy[source]) / roundCount;
      const double now = static_cast<double>(inBy[source] + 1) / roundCount;
      replaceChance(exactly, n, was, now);
    }
    ++inBy[source];
    const double width = samples[i + 1].first - samples[i].first;
    if (width <= 0) continue;
    const double computed = static_cast<double>(inBy[n]) / roundCount;
    double atLeast = 0.0;
    for (std::size_t m = n + 1; m-- > 0;) {
      atLeast += exactly[m];
      expected[m] += (1.0 - computed * std::min(atLeast, 1.0)) * width;
    }
  }
  return expected;
}

}  // namespace

ArrivalHistory::ArrivalHistory(std::size_t neighbors, std::size_t window, Duration cap)
    : neighbors_(neighbors), window_(std::max<std::size_t>(window, 1)), cap_(cap) {}

void ArrivalHistory::record(Round round) {
  rounds_.push_back(std::move(round));
  while (rounds_.size() > window_) rounds_.pop_front();
}

void ArrivalHistory::observeLate(std::size_t slot, std::int64_t usableUpTo, Time arrival) {
  for (Round& round : rounds_) {
    if (round.round > usableUpTo || !round.censored[slot]) continue;
    round.censored[slot] = false;
    round.offsets[slot] = std::max(Duration::zero(), arrival - round.start);
  }
}

ArrivalHistory::Forecast ArrivalHistory::forecast(const std::vector<std::size_t>& slots,
                                                  Time now) const {
  const std::size_t n = slots.size();
  std::vector<double> totals(n + 1, 0.0);
  Forecast result{{}, std::vector<std::vector<double>>(n + 1, std::vector<double>(n, 0.0))};
  std::vector<Duration> offsets(n);
  std::vector<Duration> sorted(n);
  std::vector<std::pair<double, std::size_t>> samples;
  samples.reserve(rounds_.size() * (n + 1));
  for (const Round& round : rounds_) {
    // Not in yet: at least as late as the time elapsed since, and at most the cap.
    const Duration pending = std::clamp(now - round.start, Duration::zero(), cap_);
    for (std::size_t k = 0; k < n; ++k)
      offsets[k] = round.censored[slots[k]] ? pending : round.offsets[slots[k]];
    samples.emplace_back(static_cast<double>(round.compute.count()), n);
    for (std::size_t k = 0; k < n; ++k)
      samples.emplace_back(static_cast<double>(offsets[k].count()), k);
    sorted = offsets;
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t m = 0; m <= n; ++m) {
      const Duration cutoff = m == 0 ? round.compute : std::max(round.compute, sorted[m - 1]);
      totals[m] += static_cast<double>(cutoff.count());
    }
    // Neighbour k is in from the first cut-off at or after its offset on
    // (the cut-offs only grow with m): counted there, summed over m below.
    for (std::size_t k = 0; k < n; ++k) {
      std::size_t first = 0;  // in by our own compute
      if (offsets[k] > round.compute)
        first =
            1 + static_cast<std::size_t>(
                    std::lower_bound(sorted.begin(), sorted.end(), offsets[k]) - sorted.begin());
      result.inTime[first][k] += 1.0;
    }
  }
  for (std::size_t m = 1; m <= n; ++m) {
    for (std::size_t k = 0; k < n; ++k) result.inTime[m][k] += result.inTime[m - 1][k];
  }
  const double count = static_cast<double>(std::max<std::size_t>(rounds_.size(), 1));
  const std::vector<double> independent = independentRoundTimes(n, count, std::move(samples));
  for (std::size_t m = 0; m <= n; ++m) {
    // Whole rounds miss joint delays the window did not happen to hold;
    // independence overprices neighbours that arrive together. Where
    // independence says later, halfway between (docs/design-notes.md,
    // "Delays the window has not seen together").
    const double wholeRounds = totals[m] / count;
    result.roundTime.emplace_back(
        static_cast<Duration::rep>(std::max(wholeRounds, (wholeRounds + independent[m]) / 2)));
    for (double& share : result.inTime[m]) share /= count;
  }
  return result;
}

Duration ArrivalHistory::expectedRoundTime(std::size_t m, Time now) const {
  std::vector<std::size_t> all(neighbors_);
  for (std::size_t j = 0; j < neighbors_; ++j) all[j] = j;
  return forecast(all, now).roundTime.at(std::min(m, neighbors_));
}

Duration ArrivalHistory::offsetQuantile(std::size_t slot, double q) const {
  std::vector<Duration> values;
  values.reserve(rounds_.size());
  for (const Round& round : rounds_)
    values.push_back(round.censored[slot] ? cap_ : round.offsets[slot]);
  return quantileOf(std::move(values), q);
}

Duration ArrivalHistory::pooledQuantile(double q) const {
  std::vector<Duration> values;
  for (const Round& round : rounds_) {
    for (std::size_t j = 0; j < neighbors_; ++j)
      values.push_back(round.censored[j] ? cap_ : round.offsets[j]);
  }
  return quantileOf(std::move(values), q);
}

Duration ArrivalHistory::meanBlocked() const {
  if (rounds_.empty()) return Duration::zero();
  Duration total{};
  for (const Round& round : rounds_) total += round.blocked;
  return total / static_cast<Duration::rep>(rounds_.size());
}

Duration ArrivalHistory::meanCycle() const {
  if (rounds_.empty()) return Duration::zero();
  Duration total{};
  for (const Round& round : rounds_) total += round.duration + round.blocked;
  return total / static_cast<Duration::rep>(rounds_.size());
}

GradientEstimator::GradientEstimator(std::size_t window, std::size_t batchSize)
    : alpha_(2.0 / (static_cast<double>(std::max<std::size_t>(window, 1)) + 1.0)),
      batchSize_(std::max<std::size_t>(batchSize, 1)),
      window_(std::max<std::size_t>(window, 1)) {}

void GradientEstimator::record(double gradNormSq, double sampleVariance) {
  const double weight = ewmaWeight(alpha_, ++samples_);
  normSq_ += weight * (gradNormSq - normSq_);
  variance_ += weight * (sampleVariance - variance_);
}

void GradientEstimator::recordStep(double curvature, double stepNormSq) {
  steps_.emplace_back(curvature, stepNormSq);
  curvatureSum_ += curvature;
  stepSum_ += stepNormSq;
  if (steps_.size() > window_) {
    curvatureSum_ -= steps_.front().first;
    stepSum_ -= steps_.front().second;
    steps_.pop_front();
  }
}

double GradientEstimator::gradNormSq() const {
  return std::max(normSq_ - variance_ / static_cast<double>(batchSize_),
                  1e-12 * std::max(normSq_, 1e-30));
}

double GradientEstimator::smoothness() const {
  if (stepSum_ <= 0) return 0.0;
  return std::max(curvatureSum_ / stepSum_, 0.0);
}

void GradientEstimator::recordPull(double pullDotGradient, double eta) {
  if (eta <= 0) return;
  pullDot_ += ewmaWeight(alpha_, ++pulls_) * (pullDotGradient / eta - pullDot_);
}

double GradientEstimator::heterogeneity() const {
  return pulls_ < 2 ? 0.0 : std::max(pullDot_, 0.0);
}

double GradientEstimator::progressNormSq() const {
  const double full = gradNormSq();
  return std::max(full - heterogeneity(), 0.01 * full);
}

}  // namespace consensusd::consensus
