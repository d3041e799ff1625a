#pragma once
// The simulator's nodes and their compute: each node's engine, sampler and
// straggler models; the gradients of every node computed ahead on the
// spare cores; the test accuracy over every core. Shared by the event-driven
// run (simulator.cpp) and the synchronous baseline (synchronous.cpp).

#include <cmath>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>
#include <vector>

#include "consensusd/consensus/round_engine.hpp"
#include "consensusd/consensus/straggler.hpp"
#include "consensusd/data/partition.hpp"
#include "consensusd/sim/simulator.hpp"

namespace consensusd::sim {

using Engine = consensus::RoundEngine<float>;
using Vector = Eigen::VectorXf;

// A round's gradient: what it is computed from, and what comes out.
struct GradientJob {
  std::shared_ptr<const Vector> params;  // held until the job is done
  std::vector<std::size_t> indices;      // the minibatch, drawn when the round starts
  Vector gradient;
  double loss = 0;
  data::GradientStats stats;
  std::exception_ptr error;
};

// Node i's straggler models, each with its own draws.
inline std::vector<consensus::Straggler> stragglersOf(const SimOptions& options, std::size_t i) {
  std::vector<consensus::Straggler> out;
  if (i >= options.stragglers.size()) return out;
  for (std::size_t k = 0; k < options.stragglers[i].size(); ++k) {
    consensus::StragglerSpec spec = options.stragglers[i][k];
    if (spec.kind == consensus::StragglerKind::None && spec.linkDelay == Duration::zero()) continue;
    // Distinct draws per node and per model (the first as before stacking).
    spec.seed = (spec.seed * 1000003u + options.seed * 7919u + i) ^ (k * 0x9E3779B97F4A7C15u);
    out.emplace_back(spec);
  }
  return out;
}

struct Node {
  std::unique_ptr<Engine> engine;
  data::MinibatchSampler sampler;
  std::vector<consensus::Straggler> stragglers;
  GradientJob job;  // of the round in flight
  double lossEwma = 0;
  bool lossSeen = false;
  std::optional<consensus::Time> wake;  // the pending Wake event's time
};

// The nodes' gradients, computed ahead on the spare cores. A round's
// gradient is due `compute` of virtual time after the round starts, and the
// other nodes' events of that time come in between, so a job handed out at
// the start is most often done by the time its Gradient event needs it.
// Workers take the newest job (the one needed last); the event loop runs a
// job it needs itself when no worker has taken it yet. The arithmetic is the
// same whichever thread does it, so a run does not depend on `threads`.
class Gradients {
 public:
  Gradients(const data::ModelOptions& model, const std::vector<data::Dataset>& shares,
            std::vector<Node>& nodes, std::size_t threads)
      : shares_(shares),
        nodes_(nodes),
        states_(nodes.size(), State::Idle),
        own_{data::Model<float>(model), {}} {
    for (std::size_t k = 1; k < threads; ++k) workers_.push_back({data::Model<float>(model), {}});
    for (Worker& worker : workers_) threads_.emplace_back([this, &worker] { work(worker); });
  }
  Gradients(const Gradients&) = delete;
  Gradients& operator=(const Gradients&) = delete;
  ~Gradients() {
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    queued_.notify_all();
    for (std::thread& thread : threads_) thread.join();
  }

  // Node i's job is filled in (params, indices): compute it.
  void submit(std::size_t i) {
    if (threads_.empty()) return compute(i, own_);
    {
      const std::lock_guard lock(mutex_);
      states_[i] = State::Queued;
      stack_.push_back(i);
    }
    queued_.notify_one();
  }

  // Node i's job is done when this returns (rethrows what it threw).
  void wait(std::size_t i) {
    if (!threads_.empty()) {
      std::unique_lock lock(mutex_);
      if (states_[i] == State::Queued) {
        states_[i] = State::Running;
        lock.unlock();
        compute(i, own_);
        lock.lock();
      } else {
        done_.wait(lock, [&] { return states_[i] == State::Done; });
      }
      states_[i] = State::Idle;
    }
    if (GradientJob& job = nodes_[i].job; job.error) std::rethrow_exception(job.error);
  }

 private:
  enum class State { Idle, Queued, Running, Done };
  struct Worker {
    data::Model<float> model;  // keeps work buffers: one per thread
    data::Batch<float> batch;
  };

  void compute(std::size_t i, Worker& worker) {
    GradientJob& job = nodes_[i].job;
    try {
      data::gather(shares_[i], job.indices, worker.batch);
      job.loss = static_cast<double>(
          worker.model.lossAndGradient(*job.params, worker.batch, job.gradient, &job.stats));
    } catch (...) {
      job.error = std::current_exception();
    }
    job.params.reset();  // the engine may write its buffer again
  }

  void work(Worker& worker) {
    std::unique_lock lock(mutex_);
    while (true) {
      queued_.wait(lock, [&] { return stopping_ || !stack_.empty(); });
      if (stopping_) return;
      const std::size_t i = stack_.back();
      stack_.pop_back();
      if (states_[i] != State::Queued) continue;  // the event loop took it
      states_[i] = State::Running;
      lock.unlock();
      compute(i, worker);
      lock.lock();
      states_[i] = State::Done;
      done_.notify_all();
    }
  }

  const std::vector<data::Dataset>& shares_;
  std::vector<Node>& nodes_;
  std::mutex mutex_;
  std::condition_variable queued_;
  std::condition_variable done_;
  std::vector<State> states_;
  std::vector<std::size_t> stack_;  // job ids, newest last; may hold ids since taken
  bool stopping_ = false;
  Worker own_;  // the event loop's
  std::vector<Worker> workers_;
  std::vector<std::thread> threads_;
};

// The test accuracy of a model on every core: the test set in one part per
// thread, cut at multiples of the model's evaluation chunk, so each part
// predicts exactly what the whole would and the count of correct samples
// does not depend on `threads`.
class TestAccuracy {
 public:
  TestAccuracy(const data::ModelOptions& model, const data::Dataset& test, std::size_t threads)
      : whole_(test) {
    const std::size_t chunks = (test.size() + data::kEvalChunk - 1) / data::kEvalChunk;
    const std::size_t perPart = (chunks + threads - 1) / threads * data::kEvalChunk;
    if (threads > 1 && perPart < test.size()) {
      for (std::size_t begin = 0; begin < test.size(); begin += perPart) {
        std::vector<std::size_t> indices(std::min(perPart, test.size() - begin));
        std::iota(indices.begin(), indices.end(), begin);
        parts_.push_back(data::subset(test, indices));
      }
    }
    for (std::size_t k = 0; k < std::max<std::size_t>(parts_.size(), 1); ++k)
      models_.emplace_back(model);
  }

  double operator()(const Vector& params) {
    if (parts_.empty()) return models_.front().evaluate(params, whole_).accuracy;
    std::vector<double> correct(parts_.size());
    const auto count = [&](std::size_t k) {
      correct[k] = std::round(models_[k].evaluate(params, parts_[k]).accuracy *
                              static_cast<double>(parts_[k].size()));
    };
    std::vector<std::thread> helpers;
    for (std::size_t k = 1; k < parts_.size(); ++k) helpers.emplace_back(count, k);
    count(0);
    for (std::thread& helper : helpers) helper.join();
    return std::accumulate(correct.begin(), correct.end(), 0.0) /
           static_cast<double>(whole_.size());
  }

 private:
  const data::Dataset& whole_;
  std::vector<data::Dataset> parts_;  // empty: evaluate the whole here
  std::vector<data::Model<float>> models_;
};

}  // namespace consensusd::sim
