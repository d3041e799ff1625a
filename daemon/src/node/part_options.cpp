#include "node/part_options.hpp"

#include "consensusd/config/params.hpp"

namespace consensusd::daemon {

TrainerOptions trainerOptions(const config::NodeConfig& cfg, const config::LoadedConfig& loaded) {
  TrainerOptions options;
  options.socket = cfg.trainer.socket;
  if (loaded.trainerGroup) options.group = static_cast<gid_t>(*loaded.trainerGroup);
  options.dimension = cfg.model.dimension == config::kAutoDimension
                          ? 0
                          : static_cast<std::size_t>(cfg.model.dimension);
  if (cfg.model.dtype == config::kAuto)
    options.dtype.reset();
  else
    options.dtype = config::usesFloat64(cfg) ? wire::Dtype::Float64 : wire::Dtype::Float32;
  return options;
}

TransportOptions transportOptions(const config::LoadedConfig& loaded,
                                  const topology::Topology& graph, std::size_t self,
                                  std::size_t dimension, wire::Dtype dtype) {
  const config::NodeConfig& cfg = loaded.config;
  const consensus::EngineOptions engine = config::engineOptions(cfg);
  TransportOptions options;
  options.bind = cfg.node.bind.empty() ? graph.node(self).endpoint : cfg.node.bind;
  options.expect = {graph.hash(), dimension, dtype, engine.compression};
  options.curve = loaded.curve;
  options.peerTimeout = engine.peerTimeout;
  options.staleness = cfg.consensus.staleness;
  options.linkDelay = [spec = config::stragglerSpec(cfg)](std::int64_t round) {
    return consensus::linkDelayAt(spec, round);
  };
  return options;
}

}  // namespace consensusd::daemon
