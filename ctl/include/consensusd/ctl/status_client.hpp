#pragma once
// Talking to a daemon's status socket: one JSON request, one JSON answer.

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

namespace consensusd::cli {

// Throws std::runtime_error when the socket cannot be reached or answers
// nothing within `timeout`.
nlohmann::json askDaemon(const std::string& socketPath, const nlohmann::json& request,
                         std::chrono::milliseconds timeout = std::chrono::seconds(3));

}  // namespace consensusd::cli
