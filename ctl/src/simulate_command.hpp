#pragma once
// `consensusctl simulate TOPOLOGY`: policy sweeps on the simulator (docs/design.md §9).

#include <CLI/CLI.hpp>
#include <functional>

namespace consensusd::cli {

void addSimulateCommand(CLI::App& parent, std::function<int()>& action);

}  // namespace consensusd::cli
