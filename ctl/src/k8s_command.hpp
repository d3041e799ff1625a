#pragma once
// `consensusctl k8s TOPOLOGY`: Kubernetes manifests, one StatefulSet pod per node.

#include <CLI/CLI.hpp>
#include <functional>

namespace consensusd::cli {

void addK8sCommand(CLI::App& parent, std::function<int()>& action);

}  // namespace consensusd::cli
