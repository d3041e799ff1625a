// consensusctl: the operator's and researcher's tool (DESIGN.md §7).

#include "cli.hpp"
#include "topology_commands.hpp"

int main(int argc, char** argv) {
  CLI::App app("consensusctl: manage consensusd topologies and nodes", "consensusctl");
  consensusd::cli::addVersionFlag(app);
  app.require_subcommand(1);
  std::function<int()> action;
  consensusd::cli::addTopologyCommands(app, action);
  return consensusd::cli::run(app, argc, argv, [&] { return action(); });
}
