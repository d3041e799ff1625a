#pragma once
// One consensusd node: loads its data share, resumes from its newest valid
// checkpoint, and runs rounds with its neighbours over ZeroMQ until told to
// stop (SIGTERM/SIGINT, the status socket's `stop`, or the config's stop
// condition). Threads (tensorpipe-style single owners, checked in builds
// with assertions, owner_thread.hpp):
//   - this thread, the engine: owns the Transport (sockets), the RoundEngine
//     (parameters), Telemetry and the CheckpointWriter; polls the sockets,
//     the compute thread's eventfd, a signalfd and the command eventfd;
//   - a compute thread: gradients, test evaluations, emulated straggler delay;
//   - the status server (its own thread, outside): reads snapshots from the
//     StatusBoard and posts commands to it.

#include "consensusd/config/load.hpp"
#include "consensusd/daemon/status.hpp"

namespace consensusd::daemon {

// Returns the process exit code. `signalFd` is a signalfd for SIGTERM/SIGINT
// (blocked in every thread); `wakeFd` an eventfd the status server writes
// after submitting a command.
int runNode(const config::LoadedConfig& loaded, StatusBoard& board, int signalFd, int wakeFd);

}  // namespace consensusd::daemon
