#pragma once
// Where a node's data comes from, as one value: the dataset kind, its files,
// scaling and seed. load() turns it into a train/test pair.

#include <cstdint>
#include <optional>
#include <string>

#include "consensusd/data/dataset.hpp"
#include "consensusd/data/names.hpp"

namespace consensusd::data {

enum class DatasetKind {
  FashionMnist,
  Mnist,
  Libsvm,
  Csv,
  SyntheticLeastSquares,
  SyntheticLogistic
};
inline constexpr NameTable<DatasetKind, 6> kDatasetKinds{
    {{DatasetKind::FashionMnist, "fashion-mnist"},
     {DatasetKind::Mnist, "mnist"},
     {DatasetKind::Libsvm, "libsvm"},
     {DatasetKind::Csv, "csv"},
     {DatasetKind::SyntheticLeastSquares, "synthetic-least-squares"},
     {DatasetKind::SyntheticLogistic, "synthetic-logistic"}}};

struct DataSource {
  DatasetKind kind = DatasetKind::FashionMnist;
  std::string path = "/usr/share/datasets/fashion-mnist";  // IDX folder, or LIBSVM/CSV file
  std::string testPath;  // LIBSVM/CSV: separate test file; "" = split off testFraction
  double testFraction = 0.2;
  CsvOptions csv;
  Scaling scaling = Scaling::Unit;
  std::uint64_t seed = 1;  // test split and synthetic data
};

TrainTest load(const DataSource& source);

}  // namespace consensusd::data
