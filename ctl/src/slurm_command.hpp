#pragma once
// `consensusctl slurm TOPOLOGY`: a SLURM batch job, one task per node.

#include <CLI/CLI.hpp>
#include <functional>

namespace consensusd::cli {

void addSlurmCommand(CLI::App& parent, std::function<int()>& action);

}  // namespace consensusd::cli
