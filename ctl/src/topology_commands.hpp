#pragma once
// `consensusctl topology gen|check|info`.

#include <CLI/CLI.hpp>
#include <functional>

namespace consensusd::cli {

// Registers the subcommands under `parent`; `action` receives the one that ran.
void addTopologyCommands(CLI::App& parent, std::function<int()>& action);

}  // namespace consensusd::cli
