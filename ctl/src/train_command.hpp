#pragma once
// `consensusctl train --config FILE`: single-node SGD on the node's data
// (the consensus section is ignored), with progress and a CSV curve.

#include <CLI/CLI.hpp>
#include <functional>

namespace consensusd::cli {

void addTrainCommand(CLI::App& parent, std::function<int()>& action);

}  // namespace consensusd::cli
