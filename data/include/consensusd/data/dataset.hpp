#pragma once
// Training and test data in memory, and the readers that fill it: IDX
// (MNIST / Fashion-MNIST, gzip or plain), LIBSVM text, CSV, and synthetic
// problems with a known optimum. Bad files raise DataError with one line:
// `FILE:LINE:COL: what` for text, `FILE: byte N: what` for binary.

#include <Eigen/Core>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "consensusd/data/names.hpp"

namespace consensusd::data {

class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One sample per column (features x samples), float32 whatever the model's
// dtype: batches are converted when they are gathered.
struct Dataset {
  Eigen::MatrixXf features;
  std::vector<std::int32_t> labels;  // classification: 0..classes-1
  Eigen::VectorXf targets;           // regression (least squares)
  int classes = 0;                   // 0 for regression

  std::size_t size() const { return static_cast<std::size_t>(features.cols()); }
  std::size_t dimension() const { return static_cast<std::size_t>(features.rows()); }
  bool isClassification() const { return classes > 0; }
};

struct TrainTest {
  Dataset train;
  Dataset test;
  std::string
      description;  // e.g. "fashion-mnist: 60000 train, 10000 test, 784 features, 10 classes"
};

// IDX files as published (train-images-idx3-ubyte.gz, ...), gzip or plain.
// Pixels are left as 0..255; see scale().
TrainTest readIdxFolder(const std::string& folder);
Dataset readIdx(const std::string& imagesFile, const std::string& labelsFile);

// LIBSVM text: "label idx:value ..." with 1-based increasing indices.
// Labels -1/+1 or 0/1 become classes 0/1; other integer labels become
// 0..K-1 in sorted order. `dimension` 0 takes the largest index seen.
// Bounds checked before allocating (features are held dense): an index above
// kMaxLibsvmFeatures (without a dimension), or more than kMaxDenseValues
// features x samples, is a DataError.
inline constexpr std::size_t kMaxLibsvmFeatures = 10'000'000;
inline constexpr std::size_t kMaxDenseValues = std::size_t{1} << 31;  // 8 GiB of floats
Dataset readLibsvm(const std::string& file, std::size_t dimension = 0);

struct CsvOptions {
  bool header = false;
  int labelColumn = 0;  // negative counts from the end (-1 = last)
  char delimiter = ',';
};
Dataset readCsv(const std::string& file, const CsvOptions& options = {});

// Synthetic problems with a known optimum, from a seed.
struct SyntheticOptions {
  std::size_t samples = 10000;
  std::size_t testSamples = 2000;
  std::size_t dimension = 20;
  double noise = 0.1;
  std::uint64_t seed = 1;
};
// y = A x* + noise; `optimum` receives x* (bias last, so dimension + 1).
TrainTest syntheticLeastSquares(const SyntheticOptions& options,
                                Eigen::VectorXd* optimum = nullptr);
// Labels drawn from the logistic model of a seeded x* (classes 0/1).
TrainTest syntheticLogistic(const SyntheticOptions& options, Eigen::VectorXd* truth = nullptr);

enum class Scaling { None, Unit, Standardize };
inline constexpr NameTable<Scaling, 3> kScalings{
    {{Scaling::None, "none"}, {Scaling::Unit, "unit"}, {Scaling::Standardize, "standardize"}}};

// Unit: to [0, 1] by the training set's per-feature min/max; Standardize:
// zero mean, unit variance by training statistics. The same transform is
// applied to the test set (never fitted on it).
void scale(TrainTest& data, Scaling scaling);

// Splits a single file into train and test: the last `testFraction`, after a
// seeded shuffle.
TrainTest splitTrainTest(const Dataset& all, double testFraction, std::uint64_t seed);

}  // namespace consensusd::data
