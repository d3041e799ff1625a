#pragma once
// The start of a node whose shape (model.dimension/dtype: auto) its first
// trainer decides.

#include <memory>

#include "consensusd/config/load.hpp"
#include "os/service_notify.hpp"
#include "trainer/trainer_endpoint.hpp"

namespace consensusd::daemon {

// Binds the trainer socket and waits for the first trainer, whose
// parameters decide the node's, before the node binds its port or joins
// its neighbours. Null when stopped (SIGTERM/SIGINT) first.
std::unique_ptr<TrainerEndpoint> awaitTrainerShape(const config::LoadedConfig& loaded, int signalFd,
                                                   ServiceNotifier& service);

}  // namespace consensusd::daemon
