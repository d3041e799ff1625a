#pragma once
// NodeConfig (validated YAML values) onto the parameter structs of the data
// and consensus modules. Choice strings were checked against the schema, so the parse
// functions here cannot fail on them.

#include <cstddef>

#include "consensusd/config/node_config.hpp"
#include "consensusd/consensus/options.hpp"
#include "consensusd/consensus/straggler.hpp"
#include "consensusd/data/local_trainer.hpp"
#include "consensusd/data/partition.hpp"
#include "consensusd/data/source.hpp"

namespace consensusd::config {

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
