#pragma once
// What the dashboard knows of a cluster: each node's last status answer,
// its state (including stopped and never started), its lag behind the
// newest round, each edge's share of estimates that arrived in time over
// the last minute, and per-node time series over the last minutes. Fed one
// poll at a time; no sockets here. Not thread-safe: the caller locks.

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "consensusd/topology/topology.hpp"
#include "dashboard_layout.hpp"

namespace consensusd::cli {

class ClusterView {
 public:
  // `keepS`: how many seconds of series to keep; `refreshMs`: the polls'
  // pace, told to the page.
  ClusterView(const topology::Topology& graph, double keepS, int refreshMs = 1000);

  // One poll at `t` seconds: answers[i] is node i's answer line, none if
  // it did not answer. A line that is not a status object counts as none.
  void update(std::vector<std::optional<std::string>> answers, double t);

  // The page's data as JSON text: graph, layout, nodes (each with its
  // status as the node sent it), edges, and the series points after
  // `since` (all kept points for since < 0). Written by hand, the statuses
  // spliced in as received, and kept until the next update for the next
  // page that asks with the same `since`: the page is the dashboard's
  // largest cost, and every open page asks for the same one.
  std::string toJson(double since) const;

 private:
  struct Point {
    double t;
    std::vector<std::optional<double>> values;  // one per series, kSeries order
  };
  struct Node {
    std::optional<nlohmann::json> status;  // the last answer, if the last poll had one
    std::string statusText;                // the same as the node sent it (valid JSON)
    bool everAnswered = false;
    std::deque<Point> series;
    double lastT = -1;
    double lastBytes = -1;
    std::map<std::string, std::uint64_t> lastCutoffs;
  };
  struct Edge {
    std::size_t from;  // the sender
    std::size_t to;    // the receiver, whose neighbour counters say
    std::deque<std::pair<double, std::pair<std::uint64_t, std::uint64_t>>>
        window;  // t, (on time, late)
  };
  std::string stateOf(std::size_t i) const;
  std::optional<double> inTimeShare(const Edge& edge) const;

  topology::Topology graph_;
  double keepS_;
  int refreshMs_;
  Layout layout_;
  std::vector<Node> nodes_;
  std::vector<Edge> edges_;
  std::map<std::string, std::size_t, std::less<>> indexOf_;  // node id -> index
  std::vector<bool> suspect_;                                // per node, as of the last poll
  double now_ = 0;
  mutable std::optional<std::pair<double, std::string>> page_;  // since, text: this poll's last
};

}  // namespace consensusd::cli
