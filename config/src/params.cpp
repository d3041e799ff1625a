#include "consensusd/config/params.hpp"

namespace consensusd::config {
namespace {

// The schema offers exactly the tables' names, so a read config always parses.
template <class Enum, std::size_t N>
Enum named(const data::NameTable<Enum, N>& table, const std::string& text) {
  return data::parseName(table, text).value();
}

}  // namespace

bool hasModel(const NodeConfig& config) {
  return config.model.kind != kNoModel && config.model.kind != kExternalModel;
}
bool isExternal(const NodeConfig& config) {
  return config.model.kind == kExternalModel;
}
bool usesFloat64(const NodeConfig& config) {
  return config.model.dtype == kFloat64;
}
bool shapeFromTrainer(const NodeConfig& config) {
  return config.model.dimension == kAutoDimension || config.model.dtype == kAuto;
}

data::DataSource dataSource(const NodeConfig& config) {
  data::DataSource source;
  source.kind = named(data::kDatasetKinds, config.data.dataset);
  source.path = config.data.path;
  source.testPath = config.data.testPath;
  source.testFraction = config.data.testFraction;
  source.csv.header = config.data.csvHeader;
  source.csv.labelColumn = static_cast<int>(config.data.labelColumn);
  source.scaling = named(data::kScalings, config.data.scaling);
  source.seed = static_cast<std::uint64_t>(config.data.seed);
  return source;
}

data::PartitionOptions partitionOptions(const NodeConfig& config, std::size_t nodes) {
  data::PartitionOptions options;
  options.kind = named(data::kPartitionKinds, config.data.partition);
  options.nodes = nodes;
  options.shardsPerNode = static_cast<std::size_t>(config.data.shardsPerNode);
  options.dirichletAlpha = config.data.dirichletAlpha;
  options.seed = static_cast<std::uint64_t>(config.data.seed);
  return options;
}

data::ModelOptions modelOptions(const NodeConfig& config, const data::Dataset& train) {
  const auto kind = data::parseName(data::kModelKinds, config.model.kind);
  if (!kind) throw data::DataError("model.kind " + config.model.kind + " has nothing to train");
  data::ModelOptions options;
  options.kind = *kind;
  options.inputs = train.dimension();
  options.classes = static_cast<std::size_t>(std::max(train.classes, 0));
  if (options.kind == data::ModelKind::Mlp) {
    options.hidden.assign(config.model.hidden.begin(), config.model.hidden.end());
  }
  options.l2 = config.train.weightDecay;
  const bool regression = !train.isClassification();
  if (options.kind == data::ModelKind::LeastSquares && !regression) {
    throw data::DataError("model.kind least-squares needs real-valued targets; " +
                          config.data.dataset + " has class labels");
  }
  if (options.kind != data::ModelKind::LeastSquares && regression) {
    throw data::DataError("model.kind " + config.model.kind + " needs class labels; " +
                          config.data.dataset + " has real-valued targets (use least-squares)");
  }
  if (options.kind == data::ModelKind::Logistic && train.classes != 2) {
    throw data::DataError("model.kind logistic needs 2 classes; " + config.data.dataset + " has " +
                          std::to_string(train.classes) + " (use softmax)");
  }
  return options;
}

data::Schedule schedule(const NodeConfig& config) {
  data::Schedule result;
  result.kind = named(data::kScheduleKinds, config.train.schedule);
  result.learningRate = config.train.learningRate;
  result.period = config.train.stepEveryRounds;
  result.factor = config.train.stepFactor;
  result.totalRounds = config.train.rounds;
  return result;
}

data::LocalTrainOptions localTrainOptions(const NodeConfig& config, const data::Dataset& train) {
  data::LocalTrainOptions options;
  options.model = modelOptions(config, train);
  options.schedule = schedule(config);
  options.momentum = config.train.momentum;
  options.batchSize = static_cast<std::size_t>(config.train.batchSize);
  options.rounds = config.train.rounds;
  options.evalEveryRounds = config.train.evalEveryRounds;
  options.untilAccuracy = config.train.untilAccuracy;
  options.maxTimeS = config.train.maxTimeS;
  options.seed = static_cast<std::uint64_t>(config.data.seed);
  options.initSeed = static_cast<std::uint64_t>(config.model.initSeed);
  return options;
}

consensus::PolicySpec policySpec(const NodeConfig& config) {
  consensus::PolicySpec spec;
  spec.kind = named(consensus::kPolicyKinds, config.consensus.policy);
  spec.backups = config.consensus.backups;
  spec.timeout = consensus::fromMilliseconds(config.consensus.timeoutMs);
  spec.quantile = config.consensus.quantile;
  spec.pullTerm = config.consensus.dynamicPull;
  spec.noiseTerm = config.consensus.dynamicNoise;
  spec.heterogeneityTerm = config.consensus.dynamicHeterogeneity;
  spec.tieMargin = config.consensus.dynamicTieMargin;
  return spec;
}

consensus::EngineOptions engineOptions(const NodeConfig& config) {
  const NodeConfig::Consensus& c = config.consensus;
  consensus::EngineOptions options;
  options.policy = policySpec(config);
  options.mixRound = named(consensus::kMixRounds, c.mixRound);
  options.publish = named(consensus::kPublishes, c.publish);
  options.mixMode = named(consensus::kMixModes, c.mix);
  options.robust = named(consensus::kRobustModes, c.robust);
  options.trim = static_cast<std::size_t>(c.trim);
  options.clipRadius = c.clipRadius;
  options.compression = named(consensus::kCompressions, c.compression);
  options.outer = named(consensus::kOuters, config.train.outer);
  options.outerLearningRate = config.train.outerLearningRate;
  options.outerMomentum = config.train.outerMomentum;
  options.consensusStep = c.consensusStep;
  options.staleness = c.staleness;
  options.maxLead = c.maxLead;
  options.roundSkipping = c.roundSkipping;
  options.skipAhead = c.skipAhead;
  options.mailboxDepth = static_cast<std::size_t>(c.mailboxDepth);
  options.minResponders = static_cast<std::size_t>(c.minResponders);
  options.maxResponders = static_cast<std::size_t>(c.maxResponders);
  options.peerTimeout = consensus::fromMilliseconds(c.peerTimeoutMs);
  options.hardDeadline = consensus::fromMilliseconds(c.hardDeadlineMs);
  options.warmupRounds = c.warmupRounds;
  options.windowRounds = static_cast<std::size_t>(c.windowRounds);
  options.batchSize = static_cast<std::size_t>(config.train.batchSize);
  return options;
}

consensus::StragglerSpec stragglerSpec(const NodeConfig& config) {
  const NodeConfig::Straggler& c = config.straggler;
  consensus::StragglerSpec spec;
  spec.kind = named(consensus::kStragglerKinds, c.kind);
  spec.delay = consensus::fromMilliseconds(c.delayMs);
  spec.mean = consensus::fromMilliseconds(c.meanMs);
  spec.paretoShape = c.paretoShape;
  spec.slowProbability = c.slowProbability;
  spec.slowFactor = c.slowFactor;
  spec.baseCompute = consensus::fromMilliseconds(c.baseComputeMs);
  spec.linkDelay = consensus::fromMilliseconds(c.linkDelayMs);
  spec.fromRound = c.fromRound;
  spec.toRound = c.toRound;
  spec.seed = static_cast<std::uint64_t>(c.seed);
  return spec;
}

}  // namespace consensusd::config
