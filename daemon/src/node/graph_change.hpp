#pragma once
// A running node's changes of graph (docs/protocol.md, "Changing the graph"):
// a new graph from `consensusctl apply`, SIGHUP or the watched topology file
// is checked at once (an error is answered and nothing changes) and held
// until the engine is between rounds, when the node switches to it; no
// round starts while one is held. Keeps the graph in force (and this node's
// index in it) for the engine loop and the status. Engine thread only.

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "consensusd/config/load.hpp"
#include "os/file_watch.hpp"

namespace consensusd::daemon {

class GraphChange {
 public:
  using Reply = std::function<void(nlohmann::json)>;

  // `loaded`: the graph the node started with, node `self` in it, read from
  // cfg.topology.file; the caller keeps it alive. With cfg.topology.watch the
  // file's folder is watched (a warning, and SIGHUP only, if it cannot be).
  GraphChange(const config::NodeConfig& cfg, const topology::Topology& loaded, std::size_t self);

  // The graph in force, this node's index in it, the file it came from.
  const topology::Topology& graph() const { return *graph_; }
  std::size_t self() const { return self_; }
  const std::string& file() const { return file_; }
  std::uint64_t changes() const { return changes_; }  // switched to since the start
  bool held() const { return held_.has_value(); }
  static std::string hashText(const topology::Topology& graph);

  // A new graph, the text of `file`, checked against the `running` config:
  // answered through `reply` at once when it is bad, is the graph in force,
  // or another change is held; else held (answered once switched to).
  void want(const config::NodeConfig& running, const std::string& text, const std::string& file,
            Reply reply);
  // SIGHUP (`onSignal`), or the watched file changed: the file read again and
  // wanted (a watch's news that leaves the text as it was changes nothing).
  void reload(const config::NodeConfig& running, bool onSignal);
  // topology.watch: the descriptor to poll (-1 without a watch); when it is
  // readable, noteWatch(); reloadWatched() reads a noted change once nothing is held.
  int watchFd() const { return watch_ ? watch_->fd() : -1; }
  void noteWatch();
  void reloadWatched(const config::NodeConfig& running);

  // The held graph and this node's index in it (none held: nullopt). The
  // caller moves the engine and the transport to it, then calls switched().
  struct Next {
    const topology::Topology* graph;
    std::size_t self;
  };
  std::optional<Next> next() const;
  // The held graph is in force now: logged with the neighbours it added and
  // removed (`round` and `degree`: the engine's, on the new graph). The
  // caller answers whoever asked once its status shows the new graph.
  struct Switched {
    std::unique_ptr<const topology::Topology> left;  // dropped once nothing refers to it
    Reply reply;                                     // none for SIGHUP and the watch
    nlohmann::json answer;
  };
  Switched switched(std::int64_t round, std::size_t degree);

 private:
  struct Held {
    std::unique_ptr<const topology::Topology> graph;
    std::size_t self;
    std::string file;
    Reply reply;  // none for SIGHUP and the watch
  };
  const topology::Topology* graph_;
  std::unique_ptr<const topology::Topology> owned_;  // graph_ once a change was switched to
  std::size_t self_;
  std::string file_;
  std::string readFile_;  // cfg.topology.file: what reload() reads
  std::optional<Held> held_;
  std::optional<FileWatch> watch_;
  bool watchNoted_ = false;  // seen by the watch, not read yet
  std::string lastRead_;     // the text the last reload read
  std::uint64_t changes_ = 0;
};

}  // namespace consensusd::daemon
