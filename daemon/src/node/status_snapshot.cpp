#include "node/status_snapshot.hpp"

namespace consensusd::daemon {
namespace {

double milliseconds(consensus::Duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

}  // namespace

template <class Scalar>
std::uint64_t bytesReceived(const consensus::RoundEngine<Scalar>& engine,
                            const Transport& transport) {
  std::uint64_t total = 0;
  for (std::size_t s = 0; s < engine.degree(); ++s)
    total += transport.inflow(engine.nodeOfSlot(s)).bytes;
  return total;
}

template <class Scalar>
void fillNeighborsAndTraffic(StatusSnapshot& status, const consensus::RoundEngine<Scalar>& engine,
                             const Transport& transport, const topology::Topology& graph,
                             consensus::Time now) {
  const TrafficCounters& traffic = transport.counters();
  for (std::size_t s = 0; s < engine.degree(); ++s) {
    NeighborStatus n;
    const std::size_t node = engine.nodeOfSlot(s);
    n.id = graph.node(node).id;
    n.previousGraph = transport.onPreviousGraph(node);
    const bool suspect = engine.suspect(s, now);
    const consensus::Presence presence = engine.presence(s);
    // Idle (alive, no trainer) and left (said goodbye) are not silent.
    status.suspects += suspect && presence == consensus::Presence::Working ? 1u : 0u;
    n.lastRound = engine.newestRound(s);
    n.state = presence == consensus::Presence::Idle   ? "idle"
              : presence == consensus::Presence::Left ? "left"
              : suspect                               ? "suspect"
              : n.lastRound >= engine.round() - 1     ? "fresh"
                                                      : "late";
    n.medianArrivalMs = milliseconds(engine.arrivals().offsetQuantile(s, 0.5));
    n.p90ArrivalMs = milliseconds(engine.arrivals().offsetQuantile(s, 0.9));
    const auto& c = engine.counters(s);
    n.onTime = c.onTime;
    n.late = c.late;
    n.stale = c.stale;
    n.duplicate = c.duplicate;
    n.mixed = c.mixed;
    n.frameGaps = c.gap;
    n.frameCorrupt = c.corrupt;
    n.rejected = traffic.rejectedFrom.at(node);
    const Inflow inflow = transport.inflow(node);
    n.receivedBytes = inflow.bytes;
    const auto sent = traffic.sentTo.find(node);
    n.sentBytes = sent != traffic.sentTo.end() ? sent->second : 0;
    n.bytesPerSecond = inflow.bytesPerSecond;
    n.transferMs = milliseconds(inflow.transfer);
    status.neighbors.push_back(n);
  }
  status.accepted = traffic.accepted;
  status.rejects = traffic.rejects();
  status.discarded = traffic.discards();
  status.sends = traffic.sendEvents();
  status.connectionsClosed = traffic.connectionsClosed;
  status.removedBy = traffic.removedBy;
  status.bytesSent = traffic.bytesSent;
  status.bytesReceived = bytesReceived(engine, transport);
}

template std::uint64_t bytesReceived(const consensus::RoundEngine<float>&, const Transport&);
template std::uint64_t bytesReceived(const consensus::RoundEngine<double>&, const Transport&);
template void fillNeighborsAndTraffic(StatusSnapshot&, const consensus::RoundEngine<float>&,
                                      const Transport&, const topology::Topology&, consensus::Time);
template void fillNeighborsAndTraffic(StatusSnapshot&, const consensus::RoundEngine<double>&,
                                      const Transport&, const topology::Topology&, consensus::Time);

}  // namespace consensusd::daemon
