#pragma once
// What the wait policies learn from past rounds (docs/design.md §3).
//
// ArrivalHistory keeps, over a sliding window of rounds, the local compute
// time and each neighbour's arrival offset (time from round start until a
// usable estimate was there). An offset not seen by the cut-off is censored;
// when the estimate arrives later (even too late to mix) the record is
// completed. For E[T(m)] one still missing counts as arriving at the time of
// the decision, at most at the hard deadline; the quantiles count it at the
// hard deadline. E[T(m)] is the bootstrap mean over the recorded rounds of
// max(C, A_(m)) (whole rounds, so correlation between neighbours is kept),
// moved halfway toward the same mean for independent neighbours drawn from
// their own records when that is later: delays that never fell in one
// round together still count.
//
// GradientEstimator smooths ||grad F||^2, sigma^2 and the smoothness L over
// about a window of rounds: one minibatch is mostly noise (docs/design.md §3).

#include <cstdint>
#include <deque>
#include <vector>

#include "consensusd/consensus/options.hpp"

namespace consensusd::consensus {

class ArrivalHistory {
 public:
  ArrivalHistory(std::size_t neighbors, std::size_t window, Duration cap);

  struct Round {
    std::int64_t round = 0;
    Time start{};
    Duration compute{};
    Duration blocked{};             // waiting on the lead bound before the start
    Duration duration{};            // start to cut-off
    std::vector<Duration> offsets;  // per neighbour slot
    std::vector<bool> censored;
  };

  void record(Round round);
  // A usable estimate for rounds <= `usableUpTo` from `slot` arrived at `arrival`:
  // completes censored records of those rounds.
  void observeLate(std::size_t slot, std::int64_t usableUpTo, Time arrival);

  std::size_t size() const { return rounds_.size(); }
  bool full() const { return rounds_.size() >= window_; }

  // E[max(C, A_(m))] over the window as of `now`; A_(0) = 0. An estimate
  // still missing counts as arriving now (it is at least that late), at most
  // at `cap`: the last round, whose late estimates are often still in flight
  // at the next start, must not count them as never coming.
  Duration expectedRoundTime(std::size_t m, Time now = Time::max()) const;
  // What waiting for the m first of `slots` (m = 0..slots.size()) would give,
  // over the recorded rounds: the round time E[max(C, A_(m))], and the share
  // of rounds in which each slot's estimate was in by that cut-off (it is
  // mixed then, whatever m was: neighbours that arrive together all count).
  struct Forecast {
    std::vector<Duration> roundTime;          // [m]
    std::vector<std::vector<double>> inTime;  // [m][k], k indexes `slots`
  };
  Forecast forecast(const std::vector<std::size_t>& slots, Time now = Time::max()) const;
  // The q-quantile of one neighbour's offsets (censored as `cap`).
  Duration offsetQuantile(std::size_t slot, double q) const;
  // The q-quantile of all offsets of all neighbours over the window.
  Duration pooledQuantile(double q) const;
  // Mean time blocked by the lead bound per round.
  Duration meanBlocked() const;
  // Mean time from one round start to the next (duration + blocked).
  Duration meanCycle() const;

 private:
  std::size_t neighbors_;
  std::size_t window_;
  Duration cap_;
  std::deque<Round> rounds_;
};

class GradientEstimator {
 public:
  // `window`: rounds of smoothing (EWMA weight 2 / (window + 1)).
  GradientEstimator(std::size_t window, std::size_t batchSize);

  // One round: the minibatch ||g||^2 and per-sample variance; and the step
  // as (g_k - g_{k-1}) . (x_k - x_{k-1}) (noise bias removed by the caller)
  // and ||x_k - x_{k-1}||^2.
  void record(double gradNormSq, double sampleVariance);
  void recordStep(double curvature, double stepNormSq);
  // One round's mixing displacement d = x_mixed - x_k against the same
  // round's minibatch gradient g_k (taken at x_k: its noise is independent
  // of d), as d . g_k, and the learning rate.
  void recordPull(double pullDotGradient, double eta);

  std::size_t samples() const { return samples_; }
  // ||grad F||^2 = E||g||^2 - sigma^2 / B, floored at a tiny positive value.
  double gradNormSq() const;
  double variance() const { return variance_; }
  // L = sum curvature / sum ||dx||^2 over the window (noise averages out).
  double smoothness() const;
  // E[d . g] / eta, floored at 0: how much of the local gradient the
  // neighbours pull back every round. With a data bias h (grad F_i =
  // grad F + h) the steady pull is eta h, so this is h . grad F_i; a
  // neighbour ahead on the same data pulls along -g instead, which counts 0.
  double heterogeneity() const;
  // ||grad F_i||^2 less the heterogeneity, = grad F . grad F_i: what a step
  // moves the network by (at least 1% of ||grad F_i||^2).
  double progressNormSq() const;

 private:
  double alpha_;
  std::size_t batchSize_;
  std::size_t window_;
  std::size_t samples_ = 0;
  double normSq_ = 0.0;
  double variance_ = 0.0;
  std::deque<std::pair<double, double>> steps_;
  double curvatureSum_ = 0.0;
  double stepSum_ = 0.0;
  std::size_t pulls_ = 0;
  double pullDot_ = 0.0;  // EWMA of d . g / eta
};

}  // namespace consensusd::consensus
