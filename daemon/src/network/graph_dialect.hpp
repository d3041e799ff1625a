#pragma once
// Speaking two graphs while a change rolls out (docs/protocol.md, "Changing
// the graph"): the two sides of an edge switch at different rounds, so a
// neighbour in both graphs is spoken to in the one we left (our index and
// that graph's hash) until it speaks ours, and its messages in the old one
// are read with its index there. A neighbour the change removed that still
// sends is told so, in the graph it runs, at most once per interval.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "consensusd/consensus/round_engine.hpp"
#include "consensusd/daemon/wire.hpp"
#include "consensusd/topology/topology.hpp"

namespace consensusd::daemon {

class GraphDialect {
 public:
  // The graph changes from `last` (we were `lastSelf` there) to `next`
  // (we are `self`): every neighbour in both speaks `last` until it says
  // otherwise (a new one knows only `next`).
  void change(const topology::Topology& last, std::size_t lastSelf, const topology::Topology& next,
              std::size_t self);

  // Whether neighbour `node` (its index in the graph in force) still speaks the graph we left.
  bool onPrevious(std::size_t node) const { return onPrevious_.count(node) != 0; }
  // `h` (in the graph in force) as `peer` understands it: our sender index
  // and graph hash in the graph we left while it speaks that one.
  void speak(wire::Header& h, std::size_t peer) const;

  // The sender index `peer` uses in the graph `hash` names, and the
  // expectation to check its message with (`expect`: the graph in force's,
  // `current`); none for a graph we do not know.
  struct Spoken {
    std::uint32_t sender;
    wire::Expectation expect;
  };
  std::optional<Spoken> spokenBy(std::size_t peer, std::uint64_t hash,
                                 const topology::Topology& current,
                                 const wire::Expectation& expect) const;
  // A valid message from `peer` came in `h`'s graph (`currentHash`: the
  // graph in force): what we speak to it follows.
  void heard(std::size_t peer, const wire::Header& h, std::uint64_t currentHash);

  // Node `id`, a neighbour in the graph we left and not in ours, still
  // sends: true (and `bye` made to speak the graph it runs, flagged
  // removed) unless it was told within `every`.
  bool tellRemoved(const std::string& id, wire::Header& bye, consensus::Time now,
                   consensus::Duration every);

 private:
  std::optional<topology::Topology> previous_;  // the graph we left: a copy
  std::size_t previousSelf_ = 0;
  std::set<std::size_t> onPrevious_;  // neighbours (index in force) still speaking it
  std::set<std::size_t> saidNewer_;   // their HELLO said they run a newer one, while speaking it
  std::set<std::string> previousNeighbors_;             // ids: the graph we left's neighbours
  std::map<std::string, consensus::Time> toldRemoved_;  // id -> when it may be told again
};

}  // namespace consensusd::daemon
