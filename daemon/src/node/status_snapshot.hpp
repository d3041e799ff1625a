#pragma once
// The figures of a status snapshot that come from the node's parts: each
// in-neighbour as the engine and the transport see it, and the transport's
// traffic. The node adds its own state (phase, graph, trainer, telemetry)
// and publishes the whole to the StatusBoard.

#include <cstdint>

#include "consensusd/consensus/round_engine.hpp"
#include "consensusd/daemon/status.hpp"
#include "consensusd/topology/topology.hpp"
#include "network/transport.hpp"

namespace consensusd::daemon {

// Bytes received from the in-neighbours of the graph in force.
template <class Scalar>
std::uint64_t bytesReceived(const consensus::RoundEngine<Scalar>& engine,
                            const Transport& transport);

// status.neighbors, status.suspects and the traffic counters.
template <class Scalar>
void fillNeighborsAndTraffic(StatusSnapshot& status, const consensus::RoundEngine<Scalar>& engine,
                             const Transport& transport, const topology::Topology& graph,
                             consensus::Time now);

}  // namespace consensusd::daemon
