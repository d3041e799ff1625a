#pragma once
// `consensusctl status | watch | neighbors | history | checkpoint | stop |
// pause | resume | set-policy` (one node, by --socket or --config) and
// `consensusctl top TOPOLOGY` (every node in one live table).

#include <CLI/CLI.hpp>
#include <functional>

namespace consensusd::cli {

void addStatusCommands(CLI::App& parent, std::function<int()>& action);

}  // namespace consensusd::cli
