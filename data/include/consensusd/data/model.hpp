#pragma once
// Models as dense networks over one flat parameter vector (what goes on the
// wire): least squares, logistic regression and softmax regression are one
// layer with different heads; the MLP adds 1-2 ReLU hidden layers before a
// softmax head. Batched with Eigen, float32 or float64.
//
// A Model keeps work buffers between calls: one Model per thread.

#include <Eigen/Core>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "consensusd/data/dataset.hpp"
#include "consensusd/data/names.hpp"

namespace consensusd::data {

enum class ModelKind { LeastSquares, Logistic, Softmax, Mlp };
inline constexpr NameTable<ModelKind, 4> kModelKinds{{{ModelKind::LeastSquares, "least-squares"},
                                                      {ModelKind::Logistic, "logistic"},
                                                      {ModelKind::Softmax, "softmax"},
                                                      {ModelKind::Mlp, "mlp"}}};

struct ModelOptions {
  ModelKind kind = ModelKind::Softmax;
  std::size_t inputs = 0;
  std::size_t classes = 10;         // softmax and mlp outputs
  std::vector<std::size_t> hidden;  // mlp only: 1 or 2 widths
  double l2 = 0.0;                  // (l2 / 2) ||W||^2 on weights, not biases
};

// The per-round statistics the dynamic wait policy needs (docs/design.md §3).
struct GradientStats {
  // ||g||^2 of the minibatch mean gradient, L2 term included (for the
  // single-process trainer: the round engine measures its own).
  double gradNormSq = 0.0;
  // tr Cov of per-sample gradients, unbiased: (sum_s ||g_s||^2 - B ||g||^2) / (B - 1)
  // over the data term. Per-sample norms come from the backward pass at no
  // extra GEMM: for a dense layer ||g_s||^2 = ||delta_s||^2 (||a_s||^2 + 1),
  // so the cost is O(B * sum of layer widths).
  double sampleVariance = 0.0;
};

template <class Scalar>
struct Batch {
  Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic> x;  // inputs x B
  std::vector<std::int32_t> labels;                         // classification
  Eigen::Matrix<Scalar, Eigen::Dynamic, 1> targets;         // least squares
  std::size_t size() const { return static_cast<std::size_t>(x.cols()); }
};

// Copies the samples `indices` of `data` into `batch` (reusing its memory).
template <class Scalar>
void gather(const Dataset& data, const std::vector<std::size_t>& indices, Batch<Scalar>& batch);

// Model::evaluate runs the data set through in chunks of this many samples
// from the first: a part cut at a multiple of it gives the same predictions.
inline constexpr std::size_t kEvalChunk = 1024;

struct Evaluation {
  double loss = 0.0;
  double accuracy = 0.0;  // NaN for least squares
};

template <class Scalar>
class Model {
 public:
  using Vector = Eigen::Matrix<Scalar, Eigen::Dynamic, 1>;
  using Matrix = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic>;

  explicit Model(ModelOptions options);

  const ModelOptions& options() const { return options_; }
  std::size_t dimension() const { return dimension_; }

  // He initialisation for ReLU layers, N(0, 1/fan_in) for the output layer
  // of an MLP, zeros for one-layer models; biases zero.
  void initialize(Eigen::Ref<Vector> params, std::uint64_t seed) const;

  // Mean loss over the batch (L2 included); the mean gradient into `grad`.
  Scalar lossAndGradient(const Eigen::Ref<const Vector>& params, const Batch<Scalar>& batch,
                         Eigen::Ref<Vector> grad, GradientStats* stats = nullptr);
  Scalar loss(const Eigen::Ref<const Vector>& params, const Batch<Scalar>& batch);

  // Mean loss and accuracy over a whole data set, in chunks.
  Evaluation evaluate(const Eigen::Ref<const Vector>& params, const Dataset& data);

 private:
  struct Layer {
    Eigen::Index in;
    Eigen::Index out;
    Eigen::Index offset;  // of W (out x in, column-major); b follows
  };
  // Fills activations_ (a_0 = x, ..., a_L = output scores).
  void forward(const Eigen::Ref<const Vector>& params, const Matrix& x);
  // (l2 / 2) ||W||^2 over all weight matrices.
  double penalty(const Eigen::Ref<const Vector>& params) const;
  // Per-sample losses of the head, and d loss / d scores into deltas_.back().
  Scalar headLoss(const Batch<Scalar>& batch, bool wantDelta);

  ModelOptions options_;
  std::vector<Layer> layers_;
  std::size_t dimension_ = 0;
  std::vector<Matrix> activations_;
  std::vector<Matrix> deltas_;
  Batch<Scalar> chunk_;
};

extern template class Model<float>;
extern template class Model<double>;

}  // namespace consensusd::data
