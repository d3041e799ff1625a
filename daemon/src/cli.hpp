#pragma once
// What every command-line front end shares: exit codes (sysexits.h) and
// running a CLI11 app so that usage errors, bad input and bugs each end
// with one line on stderr and the right code.

#include <CLI/CLI.hpp>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "consensusd/topology/topology.hpp"

namespace consensusd::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitUsage = 64;        // EX_USAGE: bad command line
inline constexpr int kExitData = 65;         // EX_DATAERR: a bad data file
inline constexpr int kExitUnavailable = 69;  // EX_UNAVAILABLE: an address cannot be bound
inline constexpr int kExitSoftware = 70;     // EX_SOFTWARE: a bug
// Bad config or topology: schema::kExitConfig (78).

// A command used wrongly in a way the parser cannot see (e.g. an unknown node
// named in an option's value): one line on stderr, exit 64.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Parses argv into `app`, then runs `body`. Maps CLI11 parse errors to 64,
// data::DataError to 65, schema::InputError to 78, anything else to 70.
int run(CLI::App& app, int argc, char** argv, const std::function<int()>& body);

// Adds --version printing the program name and version.
void addVersionFlag(CLI::App& app);

// `--straggler NODE=KEY=VALUE[,KEY=VALUE]` (and `all=...` when allowed): one
// straggler model per flag and node it names, as `straggler.KEY=VALUE`
// overrides, in flag order. A node not in the topology is a UsageError; the
// keys are checked by the config schema.
struct StragglerFlag {
  std::size_t node = 0;  // topology index
  std::vector<std::string> overrides;
};
std::vector<StragglerFlag> stragglerFlags(const std::vector<std::string>& specs,
                                          const topology::Topology& graph, bool allowAll);

}  // namespace consensusd::cli
