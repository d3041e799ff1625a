#pragma once
// What the node's parts are built with, from its config: the trainer
// endpoint (model.kind: external) and the transport.

#include <cstddef>

#include "consensusd/config/load.hpp"
#include "network/transport.hpp"
#include "trainer/trainer_endpoint.hpp"

namespace consensusd::daemon {

TrainerOptions trainerOptions(const config::NodeConfig& cfg, const config::LoadedConfig& loaded);

// The transport of node `self` of `graph` (its endpoint, unless node.bind),
// for estimates of `dimension` values of `dtype`.
TransportOptions transportOptions(const config::LoadedConfig& loaded,
                                  const topology::Topology& graph, std::size_t self,
                                  std::size_t dimension, wire::Dtype dtype);

}  // namespace consensusd::daemon
