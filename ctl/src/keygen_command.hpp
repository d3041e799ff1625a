#pragma once
// `consensusctl keygen`: CurveZMQ key pairs for security.curve.
//   keygen FILE [--node ID]            one key pair (on the machine that keeps it)
//   keygen --topology T --dir D [-o F] a key pair per node, and the topology
//                                      with every public_key filled in

#include <CLI/CLI.hpp>
#include <functional>

namespace consensusd::cli {

void addKeygenCommand(CLI::App& parent, std::function<int()>& action);

}  // namespace consensusd::cli
