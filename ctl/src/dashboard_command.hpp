#pragma once
// `consensusctl dashboard TOPOLOGY`: a live web page of the whole cluster,
// read from every node's status socket (docs/dashboard.md).

#include <CLI/CLI.hpp>
#include <functional>

namespace consensusd::cli {

void addDashboardCommand(CLI::App& parent, std::function<int()>& action);

}  // namespace consensusd::cli
