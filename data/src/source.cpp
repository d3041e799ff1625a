#include "consensusd/data/source.hpp"

namespace consensusd::data {
namespace {

std::string describe(const std::string& name, const TrainTest& data) {
  std::string text = name + ": " + std::to_string(data.train.size()) + " train, " +
                     std::to_string(data.test.size()) + " test, " +
                     std::to_string(data.train.dimension()) + " features";
  if (data.train.isClassification()) text += ", " + std::to_string(data.train.classes) + " classes";
  return text;
}

// Test and train must agree on dimension and class count.
void align(TrainTest& data) {
  data.train.classes = data.test.classes = std::max(data.train.classes, data.test.classes);
}

}  // namespace

TrainTest load(const DataSource& source) {
  TrainTest data;
  std::string name;
  SyntheticOptions synthetic;
  synthetic.seed = source.seed;
  switch (source.kind) {
    case DatasetKind::FashionMnist:
    case DatasetKind::Mnist:
      data = readIdxFolder(source.path);
      name = source.kind == DatasetKind::Mnist ? "mnist" : "fashion-mnist";
      break;
    case DatasetKind::Libsvm:
    case DatasetKind::Csv: {
      const bool libsvm = source.kind == DatasetKind::Libsvm;
      Dataset train = libsvm ? readLibsvm(source.path) : readCsv(source.path, source.csv);
      if (source.testPath.empty()) {
        data = splitTrainTest(train, source.testFraction, source.seed);
      } else {
        data.test = libsvm ? readLibsvm(source.testPath, train.dimension())
                           : readCsv(source.testPath, source.csv);
        data.train = std::move(train);
        if (data.test.dimension() != data.train.dimension()) {
          throw DataError(source.testPath + ": " + std::to_string(data.test.dimension()) +
                          " features, the training file has " +
                          std::to_string(data.train.dimension()));
        }
      }
      name = source.path;
      break;
    }
    case DatasetKind::SyntheticLeastSquares:
      data = syntheticLeastSquares(synthetic);
      name = "synthetic-least-squares";
      break;
    case DatasetKind::SyntheticLogistic:
      data = syntheticLogistic(synthetic);
      name = "synthetic-logistic";
      break;
  }
  align(data);
  scale(data, source.scaling);
  data.description = describe(name, data);
  return data;
}

}  // namespace consensusd::data
