#include <doctest/doctest.h>
#include <zlib.h>

#include <Eigen/Dense>
#include <cmath>
#include <fstream>
#include <numeric>
#include <set>
#include <string>

#include "consensusd/data/dataset.hpp"
#include "consensusd/data/local_trainer.hpp"
#include "consensusd/data/model.hpp"
#include "consensusd/data/optimizer.hpp"
#include "consensusd/data/partition.hpp"
#include "consensusd/data/source.hpp"
#include "expect_error.hpp"
#include "process.hpp"

using namespace consensusd::data;
using consensusd::testing::TempDir;

namespace {

template <class F>
std::string errorFrom(F&& body) {
  return consensusd::testing::errorText<DataError>(std::forward<F>(body));
}

std::string bigEndian(std::uint32_t value) {
  return {static_cast<char>(value >> 24), static_cast<char>(value >> 16),
          static_cast<char>(value >> 8), static_cast<char>(value)};
}

void writeGzip(const std::string& path, const std::string& bytes) {
  gzFile out = gzopen(path.c_str(), "wb");
  REQUIRE(out != nullptr);
  gzwrite(out, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(out);
}

// Three 2x2 images with pixel values i*4+p, labels 0, 2, 1.
std::string imagesIdx(std::uint32_t count = 3) {
  std::string bytes = bigEndian(0x803) + bigEndian(count) + bigEndian(2) + bigEndian(2);
  for (char p = 0; p < 12; ++p) bytes += p;
  return bytes;
}
std::string labelsIdx(std::uint32_t count = 3) {
  return bigEndian(0x801) + bigEndian(count) + std::string("\x00\x02\x01", 3);
}

Dataset smallClassification(std::size_t n, int classes, std::uint64_t seed) {
  SyntheticOptions options;
  options.samples = n;
  options.testSamples = 1;
  options.dimension = 5;
  options.seed = seed;
  Dataset data = syntheticLeastSquares(options).train;
  data.targets.resize(0);
  data.classes = classes;
  for (std::size_t i = 0; i < n; ++i)
    data.labels.push_back(
        static_cast<std::int32_t>((i * 7 + seed) % static_cast<std::size_t>(classes)));
  return data;
}

// Every model kind, with L2 on, against central differences in float64.
void checkGradient(const ModelOptions& options, const Dataset& data) {
  Model<double> model(options);
  Eigen::VectorXd params(static_cast<Eigen::Index>(model.dimension()));
  model.initialize(params, 3);
  params += 0.1 * Eigen::VectorXd::Random(params.size());  // off the symmetric start
  Batch<double> batch;
  std::vector<std::size_t> indices{0, 1, 2, 3, 4, 5, 6, 7};
  gather(data, indices, batch);
  Eigen::VectorXd grad(params.size());
  model.lossAndGradient(params, batch, grad);
  const double h = 1e-6;
  for (Eigen::Index i = 0; i < params.size(); ++i) {
    Eigen::VectorXd plus = params;
    Eigen::VectorXd minus = params;
    plus[i] += h;
    minus[i] -= h;
    const double numeric = (model.loss(plus, batch) - model.loss(minus, batch)) / (2 * h);
    CHECK(grad[i] == doctest::Approx(numeric).epsilon(1e-5).scale(1.0));
  }
}

}  // namespace

TEST_CASE("IDX: gzip or plain, values and labels as stored") {
  const TempDir dir;
  writeGzip(dir.path() + "/images.gz", imagesIdx());
  dir.write("labels", labelsIdx());
  const Dataset data = readIdx(dir.path() + "/images.gz", dir.path() + "/labels");
  CHECK(data.size() == 3);
  CHECK(data.dimension() == 4);
  CHECK(data.features(3, 2) == 11.0f);
  CHECK(data.labels == std::vector<std::int32_t>{0, 2, 1});
  CHECK(data.classes == 3);
}

TEST_CASE("IDX: bad files give one line with file and byte") {
  const TempDir dir;
  const std::string images = dir.path() + "/images.gz";
  const std::string labels = dir.path() + "/labels.gz";
  writeGzip(labels, labelsIdx());
  writeGzip(images, bigEndian(0x801) + imagesIdx().substr(4));
  CHECK(errorFrom([&] { readIdx(images, labels); }) ==
        images + ": byte 0: wrong IDX magic 0x00000801, expected 0x00000803");
  writeGzip(images, imagesIdx().substr(0, 20));
  CHECK(errorFrom([&] { readIdx(images, labels); }) ==
        images + ": byte 20: expected 12 data bytes after the header, found 4");
  writeGzip(images, imagesIdx());
  writeGzip(labels, labelsIdx(2).substr(0, 10));
  CHECK(errorFrom([&] { readIdx(images, labels); }) ==
        labels + ": byte 4: 2 labels for 3 images in " + images);
  // A gzip stream cut in the middle.
  writeGzip(images, imagesIdx() + std::string(4000, '\x07'));
  std::ifstream in(images, std::ios::binary);
  std::string gz((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  dir.write("images.gz", gz.substr(0, gz.size() / 2));
  const std::string truncated = errorFrom([&] { readIdx(images, labels); });
  CHECK(truncated.rfind(images + ": byte ", 0) == 0);
  CHECK(truncated.find("corrupt or truncated gzip data") != std::string::npos);
  CHECK(errorFrom([&] { readIdx(dir.path() + "/none.gz", labels); }) ==
        dir.path() + "/none.gz: cannot open file");
}

TEST_CASE("Fashion-MNIST from the Debian package") {
  const TrainTest data = readIdxFolder("/usr/share/datasets/fashion-mnist");
  CHECK(data.train.size() == 60000);
  CHECK(data.test.size() == 10000);
  CHECK(data.train.dimension() == 784);
  CHECK(data.train.classes == 10);
  std::vector<std::size_t> all(data.train.size());
  std::iota(all.begin(), all.end(), 0);
  CHECK(classHistogram(data.train, all) == std::vector<std::size_t>(10, 6000));
  CHECK(data.train.features.maxCoeff() == 255.0f);
}

TEST_CASE("LIBSVM: sparse rows, binary and multiclass labels, errors with line and column") {
  const TempDir dir;
  const std::string binary =
      dir.write("b.svm", "+1 1:0.5 3:2\n# comment\n-1 2:1\n\n+1 3:-1 # trailing\n");
  const Dataset data = readLibsvm(binary);
  CHECK(data.size() == 3);
  CHECK(data.dimension() == 3);
  CHECK(data.classes == 2);
  CHECK(data.labels == std::vector<std::int32_t>{1, 0, 1});
  CHECK(data.features(2, 0) == 2.0f);
  CHECK(data.features(0, 1) == 0.0f);
  const Dataset multi = readLibsvm(dir.write("m.svm", "3 1:1\n7 1:2\n5 1:3\n"));
  CHECK(multi.labels == std::vector<std::int32_t>{0, 2, 1});
  CHECK(multi.classes == 3);
  CHECK(readLibsvm(binary, 10).dimension() == 10);

  const std::string path = dir.path() + "/bad.svm";
  dir.write("bad.svm", "1 1:1\n1 0:2\n");
  CHECK(errorFrom([&] { readLibsvm(path); }) == path + ":2:3: index 0 out of range [1, 10000000]");
  dir.write("bad.svm", "1 1:1 5:2\n");
  CHECK(errorFrom([&] { readLibsvm(path, 4); }) == path + ":1:7: index 5 out of range [1, 4]");
  dir.write("bad.svm", "1 3:1 2:2\n");
  CHECK(errorFrom([&] { readLibsvm(path); }) == path + ":1:7: indices must increase");
  dir.write("bad.svm", "1 3:x\n");
  CHECK(errorFrom([&] { readLibsvm(path); }) == path + ":1:5: value 'x' is not a finite number");
  dir.write("bad.svm", "yes 3:1\n");
  CHECK(errorFrom([&] { readLibsvm(path); }) == path + ":1:1: label is not a number");
  dir.write("bad.svm", "1 3\n");
  CHECK(errorFrom([&] { readLibsvm(path); }) == path + ":1:3: expected INDEX:VALUE, got '3'");
  // An index that would allocate ~400 GB is refused before any allocation.
  dir.write("bad.svm", "1 99999999999:1\n");
  CHECK(errorFrom([&] { readLibsvm(path); }) ==
        path + ":1:3: index 99999999999 out of range [1, 10000000]");
  // Within the index bound, features x samples held dense are bounded too.
  std::string wide;
  for (int i = 0; i < 300; ++i) wide += "1 9999999:1\n";
  dir.write("bad.svm", wide);
  CHECK(errorFrom([&] { readLibsvm(path); }) ==
        path + ": 9999999 features x 300 samples held dense is more than 2147483648 values");
}

TEST_CASE("CSV: header, label column, regression targets, errors with line and column") {
  const TempDir dir;
  CsvOptions options;
  options.header = true;
  options.labelColumn = -1;
  const Dataset data = readCsv(dir.write("a.csv", "x,y,label\n1,2,0\n3, 4 ,1\n"), options);
  CHECK(data.size() == 2);
  CHECK(data.dimension() == 2);
  CHECK(data.features(1, 1) == 4.0f);
  CHECK(data.labels == std::vector<std::int32_t>{0, 1});
  const Dataset regression = readCsv(dir.write("r.csv", "0.5,1\n1.5,2\n"));
  CHECK_FALSE(regression.isClassification());
  CHECK(regression.targets[1] == 1.5f);

  const std::string path = dir.write("bad.csv", "1,2,3\n4,abc,6\n");
  CHECK(errorFrom([&] { readCsv(path); }) == path + ":2:3: non-numeric field 'abc'");
  dir.write("bad.csv", "1,2,3\n4,5\n");
  CHECK(errorFrom([&] { readCsv(path); }) == path + ":2:1: 2 fields, expected 3");
  options.header = false;
  options.labelColumn = 5;
  dir.write("bad.csv", "1,2,3\n");
  CHECK(errorFrom([&] { readCsv(path, options); }) ==
        path + ":1:1: label column 5 is outside the 3 fields");
}

TEST_CASE("synthetic least squares: without noise the normal equations return x*") {
  SyntheticOptions options;
  options.noise = 0;
  options.samples = 200;
  options.dimension = 6;
  Eigen::VectorXd optimum;
  const TrainTest data = syntheticLeastSquares(options, &optimum);
  Eigen::MatrixXd a(200, 7);
  a.leftCols(6) = data.train.features.transpose().cast<double>();
  a.col(6).setOnes();
  const Eigen::VectorXd solved = a.colPivHouseholderQr().solve(data.train.targets.cast<double>());
  CHECK((solved - optimum).norm() < 1e-4);
  Eigen::VectorXd again;
  syntheticLeastSquares(options, &again);
  CHECK(again == optimum);
}

TEST_CASE("scaling uses training statistics only") {
  TrainTest data;
  data.train.features = (Eigen::MatrixXf(2, 3) << 0, 5, 10, 1, 1, 1).finished();
  data.test.features = (Eigen::MatrixXf(2, 1) << 20, 3).finished();
  TrainTest unit = data;
  scale(unit, Scaling::Unit);
  CHECK(unit.train.features(0, 1) == doctest::Approx(0.5));
  CHECK(unit.train.features(1, 2) == 0.0f);  // constant feature
  CHECK(unit.test.features(0, 0) == doctest::Approx(2.0));
  TrainTest standard = data;
  scale(standard, Scaling::Standardize);
  CHECK(standard.train.features.row(0).mean() == doctest::Approx(0.0));
  CHECK(standard.train.features.row(0).squaredNorm() / 3 == doctest::Approx(1.0));
  CHECK(standard.test.features(1, 0) == doctest::Approx(2.0));  // (3 - 1) / 1
}

TEST_CASE("partitions: every sample exactly once, deterministic, no empty node") {
  const Dataset data = smallClassification(1000, 10, 1);
  for (const PartitionKind kind : {PartitionKind::Iid, PartitionKind::Contiguous,
                                   PartitionKind::Shards, PartitionKind::Dirichlet}) {
    CAPTURE(static_cast<int>(kind));
    PartitionOptions options;
    options.kind = kind;
    options.nodes = 16;
    options.dirichletAlpha = 0.1;
    options.seed = 4;
    const auto parts = partition(data, options);
    REQUIRE(parts.size() == 16);
    std::vector<int> seen(data.size(), 0);
    for (const auto& part : parts) {
      CHECK_FALSE(part.empty());
      CHECK(std::is_sorted(part.begin(), part.end()));
      for (const std::size_t i : part) ++seen[i];
    }
    CHECK(std::all_of(seen.begin(), seen.end(), [](int count) { return count == 1; }));
    CHECK(partition(data, options) == parts);
    options.seed = 5;
    if (kind != PartitionKind::Contiguous) CHECK(partition(data, options) != parts);
  }
}

TEST_CASE("partitions: shards give about c classes, small alpha skews, iid balances") {
  const Dataset data = smallClassification(4000, 10, 2);
  const auto classesOf = [&](const std::vector<std::size_t>& part) {
    const auto histogram = classHistogram(data, part);
    return std::count_if(histogram.begin(), histogram.end(), [](std::size_t c) { return c > 0; });
  };
  PartitionOptions options;
  options.nodes = 10;
  options.kind = PartitionKind::Shards;
  options.shardsPerNode = 2;
  for (const auto& part : partition(data, options)) CHECK(classesOf(part) <= 3);
  options.kind = PartitionKind::Iid;
  for (const auto& part : partition(data, options)) {
    CHECK(classesOf(part) == 10);
    CHECK(part.size() == 400);
  }
  options.kind = PartitionKind::Dirichlet;
  options.dirichletAlpha = 0.05;
  double skewed = 0;
  for (const auto& part : partition(data, options)) {
    const auto histogram = classHistogram(data, part);
    skewed += static_cast<double>(*std::max_element(histogram.begin(), histogram.end())) /
              static_cast<double>(part.size());
  }
  CHECK(skewed / 10 > 0.6);  // the top class holds most of a node's data
  CHECK_THROWS_WITH_AS(partition(syntheticLeastSquares({}).train, options),
                       "partition: dirichlet needs class labels", DataError);
}

TEST_CASE("every model's gradient matches finite differences (float64, L2 on)") {
  const Dataset labels = smallClassification(16, 3, 7);
  ModelOptions options;
  options.inputs = 5;
  options.classes = 3;
  options.l2 = 0.01;
  options.kind = ModelKind::Softmax;
  checkGradient(options, labels);
  options.kind = ModelKind::Mlp;
  options.hidden = {4};
  checkGradient(options, labels);
  options.hidden = {4, 3};
  checkGradient(options, labels);
  options.hidden.clear();
  options.kind = ModelKind::Logistic;
  checkGradient(options, smallClassification(16, 2, 8));
  options.kind = ModelKind::LeastSquares;
  SyntheticOptions synthetic;
  synthetic.dimension = 5;
  checkGradient(options, syntheticLeastSquares(synthetic).train);
}

TEST_CASE("gradient statistics equal the brute-force per-sample computation") {
  const Dataset data = smallClassification(32, 3, 9);
  ModelOptions options;
  options.kind = ModelKind::Mlp;
  options.inputs = 5;
  options.classes = 3;
  options.hidden = {6};
  options.l2 = 0.05;
  Model<double> model(options);
  Eigen::VectorXd params(static_cast<Eigen::Index>(model.dimension()));
  model.initialize(params, 1);
  std::vector<std::size_t> indices(12);
  std::iota(indices.begin(), indices.end(), 0);
  Batch<double> batch;
  gather(data, indices, batch);
  Eigen::VectorXd grad(params.size());
  GradientStats stats;
  model.lossAndGradient(params, batch, grad, &stats);
  CHECK(stats.gradNormSq == doctest::Approx(grad.squaredNorm()));

  ModelOptions noL2 = options;
  noL2.l2 = 0;
  Model<double> plain(noL2);
  Eigen::VectorXd mean = Eigen::VectorXd::Zero(params.size());
  std::vector<Eigen::VectorXd> perSample;
  for (const std::size_t i : indices) {
    Batch<double> one;
    gather(data, {i}, one);
    Eigen::VectorXd g(params.size());
    plain.lossAndGradient(params, one, g);
    perSample.push_back(g);
    mean += g / static_cast<double>(indices.size());
  }
  double variance = 0;
  for (const auto& g : perSample) variance += (g - mean).squaredNorm();
  variance /= static_cast<double>(indices.size() - 1);
  CHECK(stats.sampleVariance == doctest::Approx(variance).epsilon(1e-9));
}

TEST_CASE("float32 and float64 models agree") {
  const Dataset data = smallClassification(64, 4, 3);
  ModelOptions options;
  options.kind = ModelKind::Mlp;
  options.inputs = 5;
  options.classes = 4;
  options.hidden = {8};
  Model<float> single(options);
  Model<double> twice(options);
  Eigen::VectorXd params(static_cast<Eigen::Index>(twice.dimension()));
  twice.initialize(params, 5);
  const Evaluation a = twice.evaluate(params, data);
  const Evaluation b = single.evaluate(params.cast<float>(), data);
  CHECK(a.loss == doctest::Approx(b.loss).epsilon(1e-5));
  CHECK(a.accuracy == b.accuracy);
}

TEST_CASE("schedules and the SGD step") {
  Schedule schedule;
  schedule.learningRate = 0.1;
  CHECK(schedule.at(5000) == 0.1);
  schedule.kind = ScheduleKind::Step;
  schedule.period = 100;
  schedule.factor = 0.5;
  CHECK(schedule.at(99) == doctest::Approx(0.1));
  CHECK(schedule.at(250) == doctest::Approx(0.025));
  schedule.kind = ScheduleKind::InverseSqrt;
  CHECK(schedule.at(300) == doctest::Approx(0.05));
  schedule.kind = ScheduleKind::Cosine;
  schedule.totalRounds = 1000;
  CHECK(schedule.at(0) == doctest::Approx(0.1));
  CHECK(schedule.at(500) == doctest::Approx(0.05));
  CHECK(schedule.at(1000) == doctest::Approx(0.0));

  Sgd<double> sgd(2, 0.5);
  Eigen::VectorXd x = Eigen::VectorXd::Zero(2);
  const Eigen::VectorXd g = Eigen::VectorXd::Ones(2);
  sgd.step(x, g, 0.1);
  sgd.step(x, g, 0.1);
  CHECK(x[0] == doctest::Approx(-0.1 - 0.15));  // v1 = 1, v2 = 1.5
}

TEST_CASE("the sampler visits every sample once per epoch, the same way from the same seed") {
  MinibatchSampler sampler(10, 3, 42);
  MinibatchSampler again(10, 3, 42);
  std::multiset<std::size_t> epoch;
  for (int b = 0; b < 3; ++b) {
    const auto& batch = sampler.next();
    CHECK(batch == again.next());
    epoch.insert(batch.begin(), batch.end());
  }
  CHECK(epoch.size() == 9);
  CHECK(std::set<std::size_t>(epoch.begin(), epoch.end()).size() == 9);
  CHECK(sampler.epoch() == 1);
  sampler.next();
  CHECK(sampler.epoch() == 2);
}

TEST_CASE("the local trainer fits synthetic problems") {
  SyntheticOptions synthetic;
  synthetic.dimension = 10;
  synthetic.samples = 4000;
  Eigen::VectorXd truth;
  const TrainTest logistic = syntheticLogistic(synthetic, &truth);
  LocalTrainOptions options;
  options.model.kind = ModelKind::Logistic;
  options.model.inputs = 10;
  options.schedule.learningRate = 0.5;
  options.rounds = 2000;
  options.evalEveryRounds = 500;
  const TrainResult result = trainLocal<float>(logistic, options);
  CHECK(result.curve.size() == 4);
  // Labels are Bernoulli draws: the true model itself is the yardstick.
  const Eigen::VectorXf scores =
      (truth.head(10).cast<float>().transpose() * logistic.test.features).transpose().array() +
      static_cast<float>(truth[10]);
  double bayes = 0;
  for (Eigen::Index i = 0; i < scores.size(); ++i) {
    bayes += (scores[i] > 0) == (logistic.test.labels[static_cast<std::size_t>(i)] == 1) ? 1 : 0;
  }
  bayes /= static_cast<double>(scores.size());
  CHECK(result.curve.back().testAccuracy > bayes - 0.03);
  CHECK(result.curve.back().testLoss < std::log(2.0) - 0.2);  // from log 2 at the zero start

  synthetic.noise = 0.01;
  const TrainTest regression = syntheticLeastSquares(synthetic);
  options.model.kind = ModelKind::LeastSquares;
  options.schedule.learningRate = 0.05;
  const TrainResult fit = trainLocal<double>(regression, options);
  CHECK(fit.curve.back().testLoss < 1e-3);
}
