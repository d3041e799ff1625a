#include "dashboard_view.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>

namespace consensusd::cli {
namespace {

// The series the page plots, in the order Point::values holds them.
constexpr std::array<const char*, 7> kSeries{
    "accuracy", "loss", "rounds_per_s", "m", "consensus_distance", "bytes_per_s", "timeout_share"};

// The edge windows reach back this far (seconds).
constexpr double kEdgeWindowS = 60;

std::optional<double> number(const nlohmann::json& status, const char* key) {
  const auto it = status.find(key);
  if (it == status.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

// A status is what a socket answered: a field of another type counts as absent.
std::string text(const nlohmann::json& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}
std::uint64_t count(const nlohmann::json& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_number_unsigned() ? it->get<std::uint64_t>() : 0;
}
std::int64_t roundOf(const nlohmann::json& status) {
  const auto it = status.find("round");
  return it != status.end() && it->is_number_integer() ? it->get<std::int64_t>() : -1;
}
// The status's neighbour entries that are objects.
std::vector<const nlohmann::json*> neighborsOf(const nlohmann::json& status) {
  std::vector<const nlohmann::json*> entries;
  const auto it = status.find("neighbors");
  if (it == status.end() || !it->is_array()) return entries;
  for (const auto& n : *it)
    if (n.is_object()) entries.push_back(&n);
  return entries;
}

std::string quoted(const std::string& text) {
  return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// A number as JSON writes it (the shortest text that reads back the
// same), null for none and for what JSON cannot say (inf, NaN).
void appendNumber(std::string& out, const std::optional<double>& value) {
  if (!value || !std::isfinite(*value)) {
    out += "null";
    return;
  }
  char buffer[32];
  const auto end = std::to_chars(buffer, buffer + sizeof buffer, *value).ptr;
  out.append(buffer, end);
}

}  // namespace

ClusterView::ClusterView(const topology::Topology& graph, double keepS, int refreshMs)
    : graph_(graph),
      keepS_(keepS),
      refreshMs_(refreshMs),
      layout_(layoutGraph(graph)),
      nodes_(graph.size()),
      suspect_(graph.size(), false) {
  for (std::size_t i = 0; i < graph.size(); ++i) {
    indexOf_.emplace(graph.node(i).id, i);
    for (const topology::Neighbor& n : graph.inNeighbors(i)) edges_.push_back({n.index, i, {}});
  }
}

void ClusterView::update(std::vector<std::optional<std::string>> answers, double t) {
  now_ = t;
  page_.reset();
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    Node& node = nodes_[i];
    node.status.reset();
    node.statusText.clear();
    if (i < answers.size() && answers[i]) {
      nlohmann::json parsed = nlohmann::json::parse(*answers[i], nullptr, false);
      const auto ok = parsed.is_object() ? parsed.find("ok") : parsed.end();
      // An error answer, or not a status, counts as none.
      if (parsed.is_object() && (ok == parsed.end() || *ok == true)) {
        node.status = std::move(parsed);
        node.statusText = std::move(*answers[i]);
        node.statusText.erase(node.statusText.find_last_not_of(" \t\r\n") + 1);
      }
    }
    Point point{t, std::vector<std::optional<double>>(kSeries.size())};
    if (node.status) {
      const nlohmann::json& s = *node.status;
      node.everAnswered = true;
      const std::optional<double> accuracy = number(s, "accuracy");
      if (accuracy && *accuracy >= 0) point.values[0] = accuracy;
      point.values[1] = number(s, "loss");
      point.values[2] = number(s, "rounds_per_s");
      point.values[3] = number(s, "target");
      point.values[4] = number(s, "consensus_distance");
      const double bytes =
          number(s, "bytes_sent").value_or(0) + number(s, "bytes_received").value_or(0);
      if (node.lastBytes >= 0 && t > node.lastT && bytes >= node.lastBytes)
        point.values[5] = (bytes - node.lastBytes) / (t - node.lastT);
      // The rounds cut off by time (timeout, deadline) among those since the last poll.
      std::map<std::string, std::uint64_t> cutoffs;
      if (s.contains("cutoffs") && s["cutoffs"].is_object())
        for (const auto& [reason, count] : s["cutoffs"].items())
          if (count.is_number_unsigned()) cutoffs[reason] = count.get<std::uint64_t>();
      std::uint64_t rounds = 0;
      std::uint64_t byTime = 0;
      for (const auto& [reason, count] : cutoffs) {
        const auto was = node.lastCutoffs.find(reason);
        const std::uint64_t before = was == node.lastCutoffs.end() ? 0 : was->second;
        const std::uint64_t delta = count >= before ? count - before : 0;
        rounds += delta;
        if (reason != "count") byTime += delta;
      }
      if (rounds > 0 && !node.lastCutoffs.empty())
        point.values[6] = static_cast<double>(byTime) / static_cast<double>(rounds);
      node.lastCutoffs = std::move(cutoffs);
      node.lastBytes = bytes;
      node.lastT = t;
    }
    node.series.push_back(std::move(point));
    while (!node.series.empty() && node.series.front().t < t - keepS_) node.series.pop_front();
  }
  // Suspect: a neighbour that answers has not heard from it for a peer timeout.
  std::fill(suspect_.begin(), suspect_.end(), false);
  for (const Node& node : nodes_) {
    if (!node.status) continue;
    for (const nlohmann::json* n : neighborsOf(*node.status)) {
      if (text(*n, "state") != "suspect") continue;
      const auto it = indexOf_.find(text(*n, "id"));
      if (it != indexOf_.end()) suspect_[it->second] = true;
    }
  }
  // What each receiver says of each sender: estimates on time and late.
  for (Edge& edge : edges_) {
    const auto& receiver = nodes_[edge.to].status;
    if (receiver) {
      for (const nlohmann::json* n : neighborsOf(*receiver)) {
        if (text(*n, "id") != graph_.node(edge.from).id) continue;
        edge.window.push_back({t, {count(*n, "on_time"), count(*n, "late")}});
      }
    }
    while (!edge.window.empty() && edge.window.front().first < t - kEdgeWindowS)
      edge.window.pop_front();
  }
}

std::optional<double> ClusterView::inTimeShare(const Edge& edge) const {
  if (edge.window.size() < 2) return std::nullopt;
  const auto& [first, last] = std::pair{edge.window.front().second, edge.window.back().second};
  if (last.first < first.first || last.second < first.second) return std::nullopt;  // a restart
  const std::uint64_t onTime = last.first - first.first;
  const std::uint64_t total = onTime + (last.second - first.second);
  if (total == 0) return std::nullopt;
  return static_cast<double>(onTime) / static_cast<double>(total);
}

std::string ClusterView::stateOf(std::size_t i) const {
  const Node& node = nodes_[i];
  if (!node.status) return node.everAnswered ? "stopped" : "not started";
  if (suspect_[i]) return "suspect";
  const std::string phase = text(*node.status, "phase");
  return phase == "idle" ? "training" : phase;
}

std::string ClusterView::toJson(double since) const {
  if (page_ && page_->first == since) return page_->second;
  std::int64_t newest = -1;
  for (const Node& node : nodes_)
    if (node.status) newest = std::max(newest, roundOf(*node.status));
  std::string out = "{\"name\":" + quoted(graph_.name()) + ",\"layout\":" + quoted(layout_.kind) +
                    ",\"directed\":" + (graph_.directed() ? "true" : "false") + ",\"t\":";
  appendNumber(out, now_);
  out += ",\"newest_round\":" + std::to_string(newest) +
         ",\"refresh_ms\":" + std::to_string(refreshMs_) + ",\"keep_s\":";
  appendNumber(out, keepS_);
  out += ",\"nodes\":[";
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const Node& node = nodes_[i];
    if (i > 0) out += ',';
    out += "{\"id\":" + quoted(graph_.node(i).id) + ",\"x\":";
    appendNumber(out, layout_.x[i]);
    out += ",\"y\":";
    appendNumber(out, layout_.y[i]);
    out += ",\"state\":" + quoted(stateOf(i));
    out += ",\"status\":";
    out += node.status ? node.statusText : "null";
    if (node.status && roundOf(*node.status) >= 0)
      out += ",\"lag\":" + std::to_string(newest - roundOf(*node.status));
    // The points after `since`: their times, then each series.
    const auto after = std::find_if(node.series.begin(), node.series.end(),
                                    [since](const Point& point) { return point.t > since; });
    const auto appendSeries = [&](const char* name, auto valueOf) {
      out += '"';
      out += name;
      out += "\":[";
      for (auto it = after; it != node.series.end(); ++it) {
        if (it != after) out += ',';
        appendNumber(out, valueOf(*it));
      }
      out += ']';
    };
    out += ",\"series\":{";
    appendSeries("t", [](const Point& point) { return std::optional<double>(point.t); });
    for (std::size_t k = 0; k < kSeries.size(); ++k) {
      out += ',';
      appendSeries(kSeries[k], [k](const Point& point) { return point.values[k]; });
    }
    out += "}}";
  }
  out += "],\"edges\":[";
  for (std::size_t e = 0; e < edges_.size(); ++e) {
    const Edge& edge = edges_[e];
    if (e > 0) out += ',';
    out += "{\"from\":" + quoted(graph_.node(edge.from).id) +
           ",\"to\":" + quoted(graph_.node(edge.to).id) + ",\"in_time\":";
    // A sender that does not answer sends nothing now: no share to show.
    appendNumber(out, nodes_[edge.from].status ? inTimeShare(edge) : std::optional<double>());
    out += '}';
  }
  out += "]}";
  page_.emplace(since, out);
  return out;
}

}  // namespace consensusd::cli
