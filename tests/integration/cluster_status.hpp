#pragma once
// A Cluster's nodes as seen through their status sockets, and the overrides
// that make integration runs fast (synthetic data, no evaluations).

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cluster.hpp"
#include "consensusd/ctl/status_client.hpp"

namespace consensusd::testing {

inline const std::vector<std::string> kFast{"data.dataset=synthetic-logistic",
                                            "model.kind=logistic", "train.eval_every_rounds=0",
                                            "log.progress_every_s=1"};

inline std::vector<std::string> with(std::vector<std::string> base,
                                     const std::vector<std::string>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

inline nlohmann::json ask(const Cluster& cluster, std::size_t i, const nlohmann::json& request) {
  return cli::askDaemon(cluster.socket(i), request, std::chrono::seconds(5));
}

inline bool answers(const Cluster& cluster, std::size_t i) {
  try {
    return ask(cluster, i, {{"cmd", "status"}}).value("ok", false);
  } catch (const std::exception&) {
    return false;
  }
}

inline std::int64_t roundOf(const Cluster& cluster, std::size_t i) {
  return ask(cluster, i, {{"cmd", "status"}}).value("round", std::int64_t{-1});
}

}  // namespace consensusd::testing
