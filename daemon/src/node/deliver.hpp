#pragma once
// A validated message from the transport to the round engine, which checks
// its round first: an estimate (kept where it was received, or a compressed
// frame onto the neighbour's copy), a part of one still arriving, a
// decision, or a keep-alive saying whether the neighbour works.

#include <Eigen/Core>

#include "consensusd/consensus/round_engine.hpp"
#include "network/transport.hpp"

namespace consensusd::daemon {

// `aligned`: where an estimate whose bytes are not aligned for Scalar is copied.
template <class Scalar>
consensus::Receipt deliver(consensus::RoundEngine<Scalar>& engine, const Inbound& message,
                           Eigen::Matrix<Scalar, Eigen::Dynamic, 1>& aligned, consensus::Time now);

}  // namespace consensusd::daemon
