#pragma once
// Gradients (and test evaluations) on their own thread, one job at a time,
// so computing overlaps the wait for neighbours (docs/design.md §2 step 2). The
// engine thread submits a job and polls readyFd() for the result.

#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "consensusd/consensus/straggler.hpp"
#include "consensusd/data/dataset.hpp"
#include "consensusd/data/model.hpp"
#include "consensusd/data/optimizer.hpp"
#include "consensusd/data/partition.hpp"
#include "os/event_fd.hpp"
#include "os/thread_name.hpp"

namespace consensusd::daemon {

template <class Scalar>
class ComputeWorker {
 public:
  using Vector = Eigen::Matrix<Scalar, Eigen::Dynamic, 1>;
  struct Job {
    std::int64_t round = 0;
    std::shared_ptr<const Vector> params;  // the round's published snapshot, read only
    bool evaluate = false;
  };
  struct Result {
    std::int64_t round = 0;
    Vector gradient;
    double loss = 0;
    data::GradientStats stats;
    std::optional<data::Evaluation> evaluation;
    std::exception_ptr failure;  // a bug in the model code: rethrown on the engine thread
  };

  using Clock = std::chrono::steady_clock;
  using Duration = consensus::Duration;

  // Without a model (kind: none) gradients are zeros of `dimension`: rounds
  // measure the exchange alone.
  ComputeWorker(const data::TrainTest& data, data::Dataset share,
                const std::optional<data::ModelOptions>& model, std::size_t dimension,
                std::size_t batchSize, std::uint64_t seed, consensus::StragglerSpec straggler)
      : data_(data),
        share_(std::move(share)),
        model_(model ? std::optional<data::Model<Scalar>>(*model) : std::nullopt),
        dimension_(model_ ? model_->dimension() : dimension),
        sampler_(share_.size(), batchSize, seed),
        straggler_(straggler),
        readyFd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
        failAtRound_(failpointRound()),
        thread_([this] {
          nameThisThread("compute");
          loop();
        }) {}

  ~ComputeWorker() {
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
    ::close(readyFd_);
  }
  ComputeWorker(const ComputeWorker&) = delete;
  ComputeWorker& operator=(const ComputeWorker&) = delete;

  int readyFd() const { return readyFd_; }
  std::size_t dimension() const { return dimension_; }
  Vector initialParams(std::uint64_t seed) const {
    Vector params = Vector::Zero(static_cast<Eigen::Index>(dimension_));
    if (model_) model_->initialize(params, seed);
    return params;
  }

  void submit(std::int64_t round, std::shared_ptr<const Vector> params, bool evaluate) {
    {
      const std::lock_guard lock(mutex_);
      job_.emplace();
      job_->round = round;
      job_->params = std::move(params);
      job_->evaluate = evaluate;
    }
    wake_.notify_all();
  }

  // A gradient buffer back from the engine, for the next job: at 16 MiB a
  // fresh one per round costs an allocation and page faults. An empty one
  // (the engine had none to give) leaves the spare as it is.
  void recycle(Vector buffer) {
    if (buffer.size() == 0) return;
    const std::lock_guard lock(mutex_);
    spare_ = std::move(buffer);
  }

  std::optional<Result> take() {
    drainFd(readyFd_);
    const std::lock_guard lock(mutex_);
    std::optional<Result> out;
    out.swap(result_);
    if (out && out->failure) std::rethrow_exception(out->failure);
    return out;
  }

 private:
  void loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return stopping_ || job_.has_value(); });
      if (stopping_) return;
      Job job = std::move(*job_);
      job_.reset();
      Result result;
      result.gradient.swap(spare_);
      lock.unlock();

      const Clock::time_point start = Clock::now();
      result.round = job.round;
      const Vector& params = *job.params;
      // Without a model the gradient is zeros, and so is every buffer the
      // engine hands back (swapGradient): zero only a fresh one.
      if (model_ || result.gradient.size() != params.size()) result.gradient.setZero(params.size());
      try {
        if (job.round == failAtRound_) throw std::logic_error("failpoint compute-throw");
        if (model_) {
          data::gather(share_, sampler_.next(), batch_);
          result.loss = static_cast<double>(
              model_->lossAndGradient(params, batch_, result.gradient, &result.stats));
          if (job.evaluate) result.evaluation = model_->evaluate(params, data_.test);
        }
      } catch (...) {  // no exception leaves this thread (STYLE.md, errors)
        result.failure = std::current_exception();
      }
      const Duration delay = straggler_.extraDelay(job.round, Clock::now() - start);
      job.params.reset();  // let go before the result: the engine may then write x_k in place

      lock.lock();
      // The emulated straggler sleeps here, interruptibly (stop must stay prompt).
      if (delay > Duration::zero() && wake_.wait_for(lock, delay, [this] { return stopping_; }))
        return;
      result_ = std::move(result);
      notify(readyFd_);
    }
  }

  // Crash testing (tests only): CONSENSUSD_FAILPOINT=compute-throw@R makes
  // the gradient of round R throw, as a bug in model code would.
  static std::int64_t failpointRound() {
    const char* spec = std::getenv("CONSENSUSD_FAILPOINT");
    const std::string prefix = "compute-throw@";
    if (spec == nullptr || std::string(spec).rfind(prefix, 0) != 0) return -1;
    return std::atoll(spec + prefix.size());
  }

  const data::TrainTest& data_;
  data::Dataset share_;
  std::optional<data::Model<Scalar>> model_;
  std::size_t dimension_;
  data::MinibatchSampler sampler_;
  data::Batch<Scalar> batch_;
  consensus::Straggler straggler_;
  int readyFd_;
  std::int64_t failAtRound_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::optional<Job> job_;
  std::optional<Result> result_;
  Vector spare_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace consensusd::daemon
