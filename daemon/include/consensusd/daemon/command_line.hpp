#pragma once
// What both programs (consensusd, consensusctl) share: exit codes (sysexits.h) and
// running a CLI11 app so that usage errors, bad input and bugs each end
// with one line on stderr and the right code.

#include <CLI/CLI.hpp>
#include <functional>
#include <stdexcept>
#include <string>

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

}  // namespace consensusd::cli
