#pragma once
// `consensusctl compose TOPOLOGY`: a docker-compose testbed, one service per node.

#include <CLI/CLI.hpp>
#include <functional>

namespace consensusd::cli {

void addComposeCommand(CLI::App& parent, std::function<int()>& action);

}  // namespace consensusd::cli
