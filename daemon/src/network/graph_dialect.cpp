#include "network/graph_dialect.hpp"

namespace consensusd::daemon {

void GraphDialect::change(const topology::Topology& last, std::size_t lastSelf,
                          const topology::Topology& next, std::size_t self) {
  std::set<std::size_t> wasNeighbor;
  previousNeighbors_.clear();
  toldRemoved_.clear();
  for (const auto* list : {&last.inNeighbors(lastSelf), &last.outNeighbors(lastSelf)}) {
    for (const topology::Neighbor& n : *list) {
      wasNeighbor.insert(n.index);
      previousNeighbors_.insert(last.node(n.index).id);
    }
  }
  onPrevious_.clear();
  for (const auto* list : {&next.inNeighbors(self), &next.outNeighbors(self)}) {
    for (const topology::Neighbor& n : *list) {
      const auto before = last.indexOf(next.node(n.index).id);
      if (before && wasNeighbor.count(*before) != 0) onPrevious_.insert(n.index);
    }
  }
  previous_ = last;  // a copy: the caller replaces its own
  previousSelf_ = lastSelf;
  saidNewer_.clear();
}

void GraphDialect::speak(wire::Header& h, std::size_t peer) const {
  if (!previous_ || onPrevious_.count(peer) == 0) return;
  h.sender = static_cast<std::uint32_t>(previousSelf_);
  h.topologyHash = previous_->hash();
}

std::optional<GraphDialect::Spoken> GraphDialect::spokenBy(std::size_t peer, std::uint64_t hash,
                                                           const topology::Topology& current,
                                                           const wire::Expectation& expect) const {
  if (hash == expect.topologyHash || !previous_ || hash != previous_->hash())
    return Spoken{static_cast<std::uint32_t>(peer), expect};  // validate() judges the hash
  const auto there = previous_->indexOf(current.node(peer).id);
  if (!there) return std::nullopt;
  Spoken spoken{static_cast<std::uint32_t>(*there), expect};
  spoken.expect.topologyHash = hash;
  return spoken;
}

void GraphDialect::heard(std::size_t peer, const wire::Header& h, std::uint64_t currentHash) {
  if (!previous_) return;
  if (h.topologyHash == currentHash) {
    onPrevious_.erase(peer);
    saidNewer_.erase(peer);
  } else if (h.kind == wire::Kind::Hello && (h.flags & wire::kHelloNewer) != 0) {
    saidNewer_.insert(peer);  // it runs ours too, and waits for us to say so
    onPrevious_.erase(peer);
  } else if (saidNewer_.count(peer) == 0) {
    onPrevious_.insert(peer);
  }
}

bool GraphDialect::tellRemoved(const std::string& id, wire::Header& bye, consensus::Time now,
                               consensus::Duration every) {
  if (!previous_ || previousNeighbors_.count(id) == 0) return false;
  const auto [due, fresh] = toldRemoved_.try_emplace(id, now);
  if (!fresh && now < due->second) return false;
  due->second = now + every;
  bye.sender = static_cast<std::uint32_t>(previousSelf_);
  bye.topologyHash = previous_->hash();
  bye.flags = wire::kByeRemoved;
  return true;
}

}  // namespace consensusd::daemon
