// consensusctl: the operator's and researcher's tool (docs/design.md §7).

#include "compose_command.hpp"
#include "consensusd/daemon/command_line.hpp"
#include "dashboard_command.hpp"
#include "k8s_command.hpp"
#include "keygen_command.hpp"
#include "simulate_command.hpp"
#include "slurm_command.hpp"
#include "status_commands.hpp"
#include "topology_commands.hpp"
#include "train_command.hpp"

// cli::run maps every exception to an exit code; only CLI11 set-up could throw.
int main(int argc, char** argv) {  // NOLINT(bugprone-exception-escape)
  CLI::App app("consensusctl: manage consensusd topologies and nodes", "consensusctl");
  consensusd::cli::addVersionFlag(app);
  app.require_subcommand(1);
  std::function<int()> action;
  consensusd::cli::addTopologyCommands(app, action);
  consensusd::cli::addTrainCommand(app, action);
  consensusd::cli::addStatusCommands(app, action);
  consensusd::cli::addDashboardCommand(app, action);
  consensusd::cli::addComposeCommand(app, action);
  consensusd::cli::addK8sCommand(app, action);
  consensusd::cli::addSlurmCommand(app, action);
  consensusd::cli::addSimulateCommand(app, action);
  consensusd::cli::addKeygenCommand(app, action);
  return consensusd::cli::run(app, argc, argv, [&] { return action(); });
}
