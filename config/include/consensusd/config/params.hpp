#pragma once
// NodeConfig (validated YAML values) onto the parameter structs of the data
// and consensus modules. Choice strings were checked against the schema,
// whose lists are the modules' name tables, so they always parse here.

#include <cstddef>
#include <cstdint>

#include "consensusd/config/node_config.hpp"
#include "consensusd/consensus/options.hpp"
#include "consensusd/consensus/straggler.hpp"
#include "consensusd/data/local_trainer.hpp"
#include "consensusd/data/partition.hpp"
#include "consensusd/data/source.hpp"

namespace consensusd::config {

// The two choices that are the config's own, not a module's enum.
inline constexpr const char* kNoModel = "none";  // model.kind: zero gradients, exchange only
inline constexpr const char* kExternalModel = "external";  // model.kind: an attached trainer
inline constexpr const char* kFloat64 = "float64";
// model.dimension / model.dtype: taken from the first trainer (kind: external).
inline constexpr const char* kAuto = "auto";
inline constexpr std::int64_t kAutoDimension = -1;
bool hasModel(const NodeConfig& config);  // a built-in model (not external, not none)
bool isExternal(const NodeConfig& config);
bool usesFloat64(const NodeConfig& config);
bool shapeFromTrainer(const NodeConfig& config);  // dimension or dtype: auto

data::DataSource dataSource(const NodeConfig& config);
data::PartitionOptions partitionOptions(const NodeConfig& config, std::size_t nodes);
// Inputs and classes come from the loaded training set; a model that does not
// fit the data (least squares on class labels, logistic on 10 classes) is a
// data::DataError.
data::ModelOptions modelOptions(const NodeConfig& config, const data::Dataset& train);
data::Schedule schedule(const NodeConfig& config);
data::LocalTrainOptions localTrainOptions(const NodeConfig& config, const data::Dataset& train);
consensus::PolicySpec policySpec(const NodeConfig& config);
consensus::EngineOptions engineOptions(const NodeConfig& config);
consensus::StragglerSpec stragglerSpec(const NodeConfig& config);

}  // namespace consensusd::config
