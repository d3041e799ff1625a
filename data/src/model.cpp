#include "consensusd/data/model.hpp"

#include <cmath>
#include <limits>
#include <numeric>
#include <random>

namespace consensusd::data {
namespace {

template <class Scalar>
Scalar softplus(Scalar z) {
  return std::max(z, Scalar(0)) + std::log1p(std::exp(-std::abs(z)));
}

}  // namespace

template <class Scalar>
void gather(const Dataset& data, const std::vector<std::size_t>& indices, Batch<Scalar>& batch) {
  const auto n = static_cast<Eigen::Index>(indices.size());
  batch.x.resize(data.features.rows(), n);
  batch.labels.clear();
  if (data.targets.size() > 0) batch.targets.resize(n);
  for (Eigen::Index k = 0; k < n; ++k) {
    const auto j = static_cast<Eigen::Index>(indices[static_cast<std::size_t>(k)]);
    batch.x.col(k) = data.features.col(j).template cast<Scalar>();
    if (data.isClassification()) batch.labels.push_back(data.labels[static_cast<std::size_t>(j)]);
    if (data.targets.size() > 0) batch.targets[k] = static_cast<Scalar>(data.targets[j]);
  }
}

template <class Scalar>
Model<Scalar>::Model(ModelOptions options) : options_(std::move(options)) {
  if (options_.inputs == 0) throw DataError("model: the data set has no features");
  std::vector<std::size_t> widths{options_.inputs};
  switch (options_.kind) {
    case ModelKind::LeastSquares:
    case ModelKind::Logistic:
      widths.push_back(1);
      break;
    case ModelKind::Mlp:
      if (options_.hidden.empty() || options_.hidden.size() > 2) {
        throw DataError("model: mlp needs 1 or 2 hidden layers");
      }
      widths.insert(widths.end(), options_.hidden.begin(), options_.hidden.end());
      [[fallthrough]];
    case ModelKind::Softmax:
      if (options_.classes < 2) throw DataError("model: softmax needs at least 2 classes");
      widths.push_back(options_.classes);
      break;
  }
  Eigen::Index offset = 0;
  for (std::size_t l = 0; l + 1 < widths.size(); ++l) {
    const auto in = static_cast<Eigen::Index>(widths[l]);
    const auto out = static_cast<Eigen::Index>(widths[l + 1]);
    layers_.push_back({in, out, offset});
    offset += out * in + out;
  }
  dimension_ = static_cast<std::size_t>(offset);
  activations_.resize(layers_.size());
  deltas_.resize(layers_.size());
}

template <class Scalar>
void Model<Scalar>::initialize(Eigen::Ref<Vector> params, std::uint64_t seed) const {
  params.setZero();
  if (layers_.size() == 1) return;  // convex one-layer models start at zero
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const Layer& layer = layers_[l];
    const double gain = l + 1 < layers_.size() ? 2.0 : 1.0;  // He for ReLU, 1/fan_in for the output
    const double stddev = std::sqrt(gain / static_cast<double>(layer.in));
    for (Eigen::Index i = 0; i < layer.out * layer.in; ++i) {
      params[layer.offset + i] = static_cast<Scalar>(stddev * normal(rng));
    }
  }
}

template <class Scalar>
double Model<Scalar>::penalty(const Eigen::Ref<const Vector>& params) const {
  double sum = 0;
  for (const Layer& layer : layers_) {
    sum += static_cast<double>(params.segment(layer.offset, layer.out * layer.in).squaredNorm());
  }
  return 0.5 * options_.l2 * sum;
}

template <class Scalar>
void Model<Scalar>::forward(const Eigen::Ref<const Vector>& params, const Matrix& x) {
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const Layer& layer = layers_[l];
    const Eigen::Map<const Matrix> w(params.data() + layer.offset, layer.out, layer.in);
    const Eigen::Map<const Vector> b(params.data() + layer.offset + layer.out * layer.in,
                                     layer.out);
    const Matrix& input = l == 0 ? x : activations_[l - 1];
    Matrix& z = activations_[l];
    z.noalias() = w * input;
    z.colwise() += b;
    if (l + 1 < layers_.size()) z = z.cwiseMax(Scalar(0));
  }
}

template <class Scalar>
Scalar Model<Scalar>::headLoss(const Batch<Scalar>& batch, bool wantDelta) {
  const Matrix& scores = activations_.back();
  Matrix& delta = deltas_.back();
  const Eigen::Index n = scores.cols();
  if (wantDelta) delta.resize(scores.rows(), n);
  double total = 0;
  switch (options_.kind) {
    case ModelKind::LeastSquares:
      for (Eigen::Index s = 0; s < n; ++s) {
        const Scalar residual = scores(0, s) - batch.targets[s];
        total += 0.5 * static_cast<double>(residual * residual);
        if (wantDelta) delta(0, s) = residual;
      }
      break;
    case ModelKind::Logistic:
      for (Eigen::Index s = 0; s < n; ++s) {
        const Scalar z = scores(0, s);
        const Scalar y = batch.labels[static_cast<std::size_t>(s)] == 1 ? Scalar(1) : Scalar(0);
        total += static_cast<double>(softplus(z) - y * z);
        if (wantDelta) delta(0, s) = Scalar(1) / (Scalar(1) + std::exp(-z)) - y;
      }
      break;
    case ModelKind::Softmax:
    case ModelKind::Mlp:
      for (Eigen::Index s = 0; s < n; ++s) {
        const auto label = static_cast<Eigen::Index>(batch.labels[static_cast<std::size_t>(s)]);
        const Scalar top = scores.col(s).maxCoeff();
        const Scalar sum = (scores.col(s).array() - top).exp().sum();
        total += static_cast<double>(std::log(sum) + top - scores(label, s));
        if (wantDelta) {
          delta.col(s) = (scores.col(s).array() - top).exp() / sum;
          delta(label, s) -= Scalar(1);
        }
      }
      break;
  }
  return static_cast<Scalar>(total / static_cast<double>(std::max<Eigen::Index>(n, 1)));
}

template <class Scalar>
Scalar Model<Scalar>::lossAndGradient(const Eigen::Ref<const Vector>& params,
                                      const Batch<Scalar>& batch, Eigen::Ref<Vector> grad,
                                      GradientStats* stats) {
  forward(params, batch.x);
  Scalar loss = headLoss(batch, true);
  const auto n = static_cast<Eigen::Index>(batch.size());
  const Scalar invN = Scalar(1) / static_cast<Scalar>(n);
  Eigen::Array<Scalar, 1, Eigen::Dynamic> perSample;
  if (stats != nullptr) perSample.setZero(n);
  for (std::size_t l = layers_.size(); l-- > 0;) {
    const Layer& layer = layers_[l];
    const Matrix& input = l == 0 ? batch.x : activations_[l - 1];
    const Matrix& delta = deltas_[l];  // per-sample d loss_s / d z_l
    Eigen::Map<Matrix> gw(grad.data() + layer.offset, layer.out, layer.in);
    Eigen::Map<Vector> gb(grad.data() + layer.offset + layer.out * layer.in, layer.out);
    gw.noalias() = (delta * input.transpose()) * invN;
    gb.noalias() = delta.rowwise().sum() * invN;
    if (stats != nullptr) {
      perSample += delta.colwise().squaredNorm().array() *
                   (input.colwise().squaredNorm().array() + Scalar(1));
    }
    if (l > 0) {
      const Eigen::Map<const Matrix> w(params.data() + layer.offset, layer.out, layer.in);
      Matrix& below = deltas_[l - 1];
      below.noalias() = w.transpose() * delta;
      below.array() *= (activations_[l - 1].array() > Scalar(0)).template cast<Scalar>();
    }
  }
  const double dataNormSq = static_cast<double>(grad.squaredNorm());
  if (options_.l2 > 0) {
    for (const Layer& layer : layers_) {
      const Eigen::Index weights = layer.out * layer.in;
      grad.segment(layer.offset, weights) +=
          static_cast<Scalar>(options_.l2) * params.segment(layer.offset, weights);
    }
    loss += static_cast<Scalar>(penalty(params));
  }
  if (stats != nullptr) {
    stats->gradNormSq = static_cast<double>(grad.squaredNorm());
    const double sumSq = static_cast<double>(perSample.sum());
    const double nd = static_cast<double>(n);
    stats->sampleVariance = n > 1 ? std::max(0.0, (sumSq - nd * dataNormSq) / (nd - 1)) : 0.0;
  }
  return loss;
}

template <class Scalar>
Scalar Model<Scalar>::loss(const Eigen::Ref<const Vector>& params, const Batch<Scalar>& batch) {
  forward(params, batch.x);
  return headLoss(batch, false) + static_cast<Scalar>(penalty(params));
}

template <class Scalar>
Evaluation Model<Scalar>::evaluate(const Eigen::Ref<const Vector>& params, const Dataset& data) {
  double totalLoss = 0;
  std::size_t correct = 0;
  std::vector<std::size_t> indices;
  for (std::size_t begin = 0; begin < data.size(); begin += kEvalChunk) {
    indices.resize(std::min(kEvalChunk, data.size() - begin));
    std::iota(indices.begin(), indices.end(), begin);
    gather(data, indices, chunk_);
    forward(params, chunk_.x);
    totalLoss += static_cast<double>(headLoss(chunk_, false)) * static_cast<double>(indices.size());
    const Matrix& scores = activations_.back();
    for (Eigen::Index s = 0; s < scores.cols() && data.isClassification(); ++s) {
      Eigen::Index predicted = 0;
      if (scores.rows() == 1) {
        predicted = scores(0, s) > 0 ? 1 : 0;
      } else {
        scores.col(s).maxCoeff(&predicted);
      }
      if (predicted == chunk_.labels[static_cast<std::size_t>(s)]) ++correct;
    }
  }
  Evaluation result;
  const auto n = static_cast<double>(std::max<std::size_t>(data.size(), 1));
  result.loss = totalLoss / n + penalty(params);
  result.accuracy = data.isClassification() ? static_cast<double>(correct) / n
                                            : std::numeric_limits<double>::quiet_NaN();
  return result;
}

template void gather<float>(const Dataset&, const std::vector<std::size_t>&, Batch<float>&);
template void gather<double>(const Dataset&, const std::vector<std::size_t>&, Batch<double>&);
template class Model<float>;
template class Model<double>;

}  // namespace consensusd::data
