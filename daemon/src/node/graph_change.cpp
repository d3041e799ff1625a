#include "node/graph_change.hpp"

#include <spdlog/spdlog.h>

#include <set>
#include <system_error>

#include "consensusd/schema/yaml_tree.hpp"

namespace consensusd::daemon {
namespace {

std::set<std::string> neighborIds(const topology::Topology& graph, std::size_t node) {
  std::set<std::string> ids;
  for (const topology::Neighbor& n : graph.inNeighbors(node)) ids.insert(graph.node(n.index).id);
  for (const topology::Neighbor& n : graph.outNeighbors(node)) ids.insert(graph.node(n.index).id);
  return ids;
}

// The ids in `a` and not in `b`, as a JSON array.
nlohmann::json missingFrom(const std::set<std::string>& a, const std::set<std::string>& b) {
  nlohmann::json ids = nlohmann::json::array();
  for (const std::string& id : a)
    if (b.count(id) == 0) ids.push_back(id);
  return ids;
}

}  // namespace

GraphChange::GraphChange(const config::NodeConfig& cfg, const topology::Topology& loaded,
                         std::size_t self)
    : graph_(&loaded), self_(self), file_(cfg.topology.file), readFile_(cfg.topology.file) {
  if (!cfg.topology.watch) return;
  try {
    watch_.emplace(readFile_);
    spdlog::info("topology.watch: a change of {} is applied as on SIGHUP", readFile_);
  } catch (const std::system_error& e) {
    spdlog::warn("topology.watch: {} ({}); the topology is read again on SIGHUP only", e.what(),
                 readFile_);
  }
}

std::string GraphChange::hashText(const topology::Topology& graph) {
  return fmt::format("{:016x}", graph.hash());
}

void GraphChange::want(const config::NodeConfig& running, const std::string& text,
                       const std::string& file, Reply reply) {
  const auto answer = [&](const nlohmann::json& a) {
    if (reply) reply(a);
  };
  if (held_) {
    answer({{"ok", false}, {"error", "a topology change is under way: apply again after it"}});
    return;
  }
  try {
    config::AppliedTopology applied =
        config::checkTopology(running, graph_->node(self_), text, file);
    if (applied.graph.hash() == graph_->hash()) {
      spdlog::info("topology {}: the graph this node runs, nothing to change", file);
      answer({{"ok", true}, {"changed", false}, {"topology_hash", hashText(*graph_)}});
      return;
    }
    held_.emplace(Held{std::make_unique<const topology::Topology>(std::move(applied.graph)),
                       applied.nodeIndex, file, std::move(reply)});
  } catch (const schema::InputError& e) {
    spdlog::error("topology not applied (nothing changed): {}", e.what());
    answer({{"ok", false}, {"error", e.what()}, {"exit", schema::kExitConfig}});
  }
}

void GraphChange::reload(const config::NodeConfig& running, bool onSignal) {
  const char* why = onSignal ? "SIGHUP" : "topology file changed";
  std::string text;
  try {
    text = schema::readYamlText(readFile_);
  } catch (const schema::InputError& e) {
    spdlog::error("{}: topology not applied (nothing changed): {}", why, e.what());
    return;
  }
  // A watched folder also sees its other files change: same text, no news.
  if (text == lastRead_ && !onSignal) return;
  lastRead_ = text;
  spdlog::info("{}: reading topology {}", why, readFile_);
  want(running, text, readFile_, {});
}

void GraphChange::noteWatch() {
  if (watch_ && watch_->changed()) watchNoted_ = true;
}

void GraphChange::reloadWatched(const config::NodeConfig& running) {
  if (!watchNoted_ || held_) return;  // after a change under way, if one was
  watchNoted_ = false;
  reload(running, false);
}

std::optional<GraphChange::Next> GraphChange::next() const {
  if (!held_) return std::nullopt;
  return Next{held_->graph.get(), held_->self};
}

GraphChange::Switched GraphChange::switched(std::int64_t round, std::size_t degree) {
  Held held = std::move(*held_);
  held_.reset();
  const std::set<std::string> before = neighborIds(*graph_, self_);
  const std::set<std::string> after = neighborIds(*held.graph, held.self);
  const nlohmann::json added = missingFrom(after, before);
  const nlohmann::json removed = missingFrom(before, after);
  Switched out{std::move(owned_), std::move(held.reply), nlohmann::json::object()};
  owned_ = std::move(held.graph);
  graph_ = owned_.get();
  self_ = held.self;
  file_ = held.file;
  ++changes_;
  spdlog::info(
      "topology {} applied at round {}: {} nodes, degree {}, hash {}; neighbours added {}, "
      "removed {}",
      file_, round, graph_->size(), degree, hashText(*graph_), added.dump(), removed.dump());
  out.answer = {{"ok", true},
                {"changed", true},
                {"round", round},
                {"topology_hash", hashText(*graph_)},
                {"nodes", graph_->size()},
                {"degree", degree},
                {"added", added},
                {"removed", removed}};
  return out;
}

}  // namespace consensusd::daemon
