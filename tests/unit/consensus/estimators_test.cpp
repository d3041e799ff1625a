// The estimators (estimators.cpp): E[T(m)], censored arrivals, the forecast of in-time neighbours,
// the heterogeneity term.

#include "helpers.hpp"

using namespace consensus_test;

TEST_CASE("E[T(m)] matches the closed form for shifted-exponential arrivals") {
  const std::size_t n = 6;
  const double shift = 2.0;
  const double mean = 3.0;  // ms of the exponential part
  ArrivalHistory history(n, 20000, milliseconds(1000));
  std::mt19937_64 rng(11);
  std::exponential_distribution<double> exponential(1.0 / mean);
  for (int r = 0; r < 20000; ++r) {
    ArrivalHistory::Round round;
    round.round = r;
    for (std::size_t j = 0; j < n; ++j) {
      round.offsets.push_back(ms(shift + exponential(rng)));
      round.censored.push_back(false);
    }
    history.record(std::move(round));
  }
  for (std::size_t m = 1; m <= n; ++m) {
    // E[A_(m)] = shift + mean * sum_{i<m} 1 / (n - i)
    double expected = shift;
    for (std::size_t i = 0; i < m; ++i) expected += mean / static_cast<double>(n - i);
    const double measured =
        std::chrono::duration<double, std::milli>(history.expectedRoundTime(m)).count();
    CHECK(measured == doctest::Approx(expected).epsilon(0.02));
  }
}

TEST_CASE("late arrivals complete censored records and silent neighbours count at the cap") {
  ArrivalHistory history(2, 10, milliseconds(100));
  ArrivalHistory::Round round;
  round.round = 4;
  round.start = ms(10);
  round.offsets = {ms(1), ms(5)};
  round.censored = {false, true};
  history.record(round);
  CHECK(history.expectedRoundTime(2) == milliseconds(100));
  // Still missing 6 ms after the round start: at least that late, no later yet.
  CHECK(history.expectedRoundTime(2, ms(16)) == milliseconds(6));
  CHECK(history.expectedRoundTime(2, ms(500)) == milliseconds(100));
  history.observeLate(1, 4, ms(18));
  CHECK(history.expectedRoundTime(2) == milliseconds(8));
  CHECK(history.expectedRoundTime(0) == Duration::zero());
}

TEST_CASE("forecast: every neighbour in by the cut-off is mixed, not only the m waited for") {
  // Slots 0 and 1 always arrive together at 5 ms; slot 2 at 50 ms in even
  // rounds and at 2 ms in odd ones; our own gradient takes 1 ms.
  ArrivalHistory history(3, 10, milliseconds(1000));
  for (std::int64_t r = 0; r < 10; ++r)
    recordArrivals(history, r, ms(1), {ms(5), ms(5), ms(r % 2 == 0 ? 50 : 2)});
  const ArrivalHistory::Forecast forecast = history.forecast({0, 1, 2});
  REQUIRE(forecast.roundTime.size() == 4);
  CHECK(forecast.roundTime[0] == ms(1));
  CHECK(forecast.roundTime[1] == ms(3.5));  // 5 ms in even rounds, 2 ms in odd ones
  CHECK(forecast.roundTime[3] == ms(27.5));
  // Waiting for one: both 5 ms arrivals come together in even rounds.
  CHECK(forecast.inTime[1] == std::vector<double>{0.5, 0.5, 0.5});
  CHECK(forecast.inTime[2] == std::vector<double>{1.0, 1.0, 0.5});
  CHECK(forecast.inTime[3] == std::vector<double>{1.0, 1.0, 1.0});
  CHECK(forecast.inTime[0] == std::vector<double>{0.0, 0.0, 0.0});
}

TEST_CASE("forecast: a spike seen once per neighbour prices a wait no round showed yet") {
  // Four neighbours at 1 ms; each is 100 ms late in one round of 20, never
  // two in the same round. Whole rounds say that waiting for three costs
  // 1 ms; by the neighbours' own records two are late together with
  // P = 1 - 0.95^4 - 4 x 0.05 x 0.95^3. The forecast takes halfway.
  ArrivalHistory history(4, 20, milliseconds(1000));
  for (std::int64_t r = 0; r < 20; ++r) {
    std::vector<Duration> offsets(4, ms(1));
    if (r % 5 == 0) offsets[static_cast<std::size_t>(r / 5)] = ms(100);
    recordArrivals(history, r, ms(1), offsets);
  }
  const ArrivalHistory::Forecast forecast = history.forecast({0, 1, 2, 3});
  const double late = 1 - std::pow(0.95, 4) - 4 * 0.05 * std::pow(0.95, 3);
  const auto millis = [](Duration d) {
    return std::chrono::duration<double, std::milli>(d).count();
  };
  CHECK(millis(forecast.roundTime[3]) == doctest::Approx(1 + late * 99 / 2).epsilon(1e-6));
  // Waiting for all four: late in 4 rounds of 20, what the rounds show;
  // independence says less (1 - 0.95^4), so it does not count.
  CHECK(millis(forecast.roundTime[4]) == doctest::Approx(1 + 0.2 * 99).epsilon(1e-6));
}

TEST_CASE("forecast: neighbours late together are priced between whole rounds and independence") {
  // Both neighbours are 50 ms late in the same rounds, half of them. Whole
  // rounds: 26 ms for one or both. Independent neighbours: both late in a
  // quarter of the rounds (14 ms for one: earlier, not taken), one late in
  // three quarters (38 ms for both: halfway, 32 ms).
  ArrivalHistory history(2, 10, milliseconds(1000));
  for (std::int64_t r = 0; r < 10; ++r) {
    const Duration offset = ms(r % 2 == 0 ? 50 : 2);
    recordArrivals(history, r, ms(1), {offset, offset});
  }
  const ArrivalHistory::Forecast forecast = history.forecast({0, 1});
  CHECK(forecast.roundTime[1] == ms(26));
  CHECK(forecast.roundTime[2] == ms(32));
}

TEST_CASE("forecast: the independent estimate equals every combination of recorded values") {
  // Three neighbours and the compute, six rounds of distinct random values:
  // independence is the mean of max(C, A_(m)) over all 6^4 ways of drawing
  // each from its own record (the sweep updates the count of neighbours in
  // one value at a time, dividing a chance out: both ways of dividing run).
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> micros(1, 40'000);
  const auto us = [](int v) { return Duration(std::chrono::microseconds(v)); };
  ArrivalHistory history(3, 6, milliseconds(1000));
  std::vector<std::vector<int>> values(4);  // C, then each neighbour
  for (std::int64_t r = 0; r < 6; ++r) {
    for (auto& record : values) record.push_back(micros(rng));
    recordArrivals(history, r, us(values[0].back()),
                   {us(values[1].back()), us(values[2].back()), us(values[3].back())});
  }
  std::vector<double> whole(4, 0.0);
  std::vector<double> independent(4, 0.0);
  std::vector<std::vector<double>> inTime(4, std::vector<double>(3, 0.0));
  for (std::size_t r = 0; r < 6; ++r) {
    std::vector<int> sorted{values[1][r], values[2][r], values[3][r]};
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t m = 0; m <= 3; ++m) {
      const int cutoff = std::max(values[0][r], m == 0 ? 0 : sorted[m - 1]);
      whole[m] += cutoff / 6.0;
      for (std::size_t k = 0; k < 3; ++k) inTime[m][k] += values[k + 1][r] <= cutoff ? 1 : 0;
    }
  }
  for (std::size_t c = 0; c < 6; ++c) {
    for (std::size_t a = 0; a < 6; ++a) {
      for (std::size_t b = 0; b < 6; ++b) {
        for (std::size_t d = 0; d < 6; ++d) {
          std::vector<int> sorted{values[1][a], values[2][b], values[3][d]};
          std::sort(sorted.begin(), sorted.end());
          for (std::size_t m = 0; m <= 3; ++m)
            independent[m] += std::max(values[0][c], m == 0 ? 0 : sorted[m - 1]) / 1296.0;
        }
      }
    }
  }
  const ArrivalHistory::Forecast forecast = history.forecast({0, 1, 2});
  for (std::size_t m = 0; m <= 3; ++m) {
    const double expected = std::max(whole[m], (whole[m] + independent[m]) / 2);
    CHECK(std::chrono::duration<double, std::micro>(forecast.roundTime[m]).count() ==
          doctest::Approx(expected).epsilon(1e-7));  // whole ns
    for (std::size_t k = 0; k < 3; ++k) CHECK(forecast.inTime[m][k] == inTime[m][k] / 6.0);
  }
}

TEST_CASE("heterogeneity: the pull back along the node's own gradient, not its noise or a lag") {
  // Gradients g = c + noise (20 coordinates, ||c||^2 = 4, sd 0.1 each) and
  // mixing displacements d = eta * lag * c + noise (sd 0.01), fed as the
  // engine does: d . g with eta = 0.1.
  const auto measure = [](double lag) {
    GradientEstimator gradients(50, 1);
    gradients.record(4.0, 0.0);  // ||grad F||^2 = 4
    std::mt19937_64 rng(3);
    std::normal_distribution<double> normal(0.0, 1.0);
    const Eigen::VectorXd c = Eigen::VectorXd::Constant(20, std::sqrt(0.2));
    for (int k = 0; k < 400; ++k) {
      Eigen::VectorXd g = c;
      Eigen::VectorXd d = 0.1 * lag * c;
      for (Eigen::Index i = 0; i < 20; ++i) {
        g[i] += 0.1 * normal(rng);
        d[i] += 0.01 * normal(rng);
      }
      gradients.recordPull(d.dot(g), 0.1);
    }
    return gradients;
  };
  // Skewed data: the neighbours pull back the whole step (d = eta c).
  const GradientEstimator skewed = measure(1.0);
  CHECK(skewed.heterogeneity() == doctest::Approx(4.0).epsilon(0.1));
  CHECK(skewed.progressNormSq() <= 0.4);   // most of the gradient is pulled back
  CHECK(skewed.progressNormSq() >= 0.04);  // never below 1% of it
  // Neighbours three steps ahead on the same data pull along -g: not heterogeneity.
  const GradientEstimator ahead = measure(-3.0);
  CHECK(ahead.heterogeneity() == 0.0);
  CHECK(ahead.progressNormSq() == doctest::Approx(4.0));
  // Only noise: close to zero.
  const GradientEstimator iid = measure(0.0);
  CHECK(iid.heterogeneity() < 0.1);
  CHECK(iid.progressNormSq() > 3.9);
}

// Four neighbours of weight 0.2 (self 0.2), neighbour j in at 1 + (j - 1) *
// `spacing` ms, our gradient at 0.5 ms: E[T(m)] = 1 + (m - 1) * spacing ms,
// over `rounds` rounds of a 50-round window. Each at squared distance
// `distanceSq` (-1: unknown); L = 2 when `curvature`.
