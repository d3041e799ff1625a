#pragma once
// The node's sockets (DESIGN.md §6, docs/protocol.md): one ROUTER that the
// in-neighbours send to, one DEALER per out-neighbour with its send queue,
// and the rules for sending again. Every message in is either an Inbound
// (validated: identity, header, payload) or a counted, logged reject; the
// engine's verdict on an Inbound comes back through settle(). Payloads are
// bytes: nothing here depends on the parameter type. Owned by the engine
// thread.

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <variant>
#include <vector>
#include <zmq.hpp>

#include "consensusd/config/load.hpp"
#include "consensusd/consensus/round_engine.hpp"
#include "consensusd/daemon/curve.hpp"
#include "consensusd/daemon/wire.hpp"
#include "owner_thread.hpp"

namespace consensusd::daemon {

struct TransportOptions {
  std::string bind;  // the ROUTER's endpoint
  wire::Expectation expect;
  std::optional<config::CurveKeyPair> curve;
  // A neighbour silent this long is welcomed back with our newest estimate.
  consensus::Duration peerTimeout{};
  // A stuck neighbour gets our estimate again if it can still use it.
  std::int64_t staleness = 0;
  // Emulated slow links (straggler.link_delay_ms): the delay of round R's estimate.
  std::function<consensus::Duration(std::int64_t round)> linkDelay;
};

enum class SendEvent : std::uint8_t {
  Superseded,  // a newer estimate replaced one still waiting for room
  Deferred,    // no room in the queue yet: sent later
  Dropped,     // a control message the queue bound let go
};
enum class Discard : std::uint8_t { Stale, Duplicate };

// What the transport counted, indexed by enum; names as in status and metrics.
struct TrafficCounters {
  std::uint64_t accepted = 0;  // messages that passed validation and the round check
  std::array<std::uint64_t, wire::kRejectReasons> rejected{};
  std::array<std::uint64_t, 2> discarded{};
  std::array<std::uint64_t, 3> sends{};
  std::uint64_t connectionsClosed = 0;                // by peers or by ZeroMQ (oversized frames)
  std::map<std::size_t, std::uint64_t> rejectedFrom;  // per in-neighbour (topology index)

  // Only the counts above zero, by name ("checksum", "stale", "deferred"...).
  std::map<std::string, std::uint64_t> rejects() const;
  std::map<std::string, std::uint64_t> discards() const;
  std::map<std::string, std::uint64_t> sendEvents() const;
};

const char* toString(SendEvent event);
const char* toString(Discard discard);

struct Inbound {
  std::size_t from = 0;  // topology index of the in-neighbour
  wire::Header header;
  // Checked against the header (length, checksum, finite); shared, so the
  // engine's mailbox can keep the estimate where ZeroMQ received it.
  std::shared_ptr<const zmq::message_t> payload;
  std::span<const std::byte> bytes() const {
    return {static_cast<const std::byte*>(payload->data()), payload->size()};
  }
};

struct Rejected {
  std::optional<std::size_t> from;  // none: the sender is nobody we know
  wire::Reject reason;
};

class Transport {
 public:
  // Binds and connects; throws Unavailable if the endpoint cannot be bound.
  Transport(const topology::Topology& topology, std::size_t self, TransportOptions options);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // Sends `payload` (kept alive by `owner` until every send completes) to
  // every out-neighbour as round `round`'s estimate; after link_delay if set.
  void publish(std::int64_t round, std::shared_ptr<const void> owner,
               std::span<const std::byte> payload, consensus::Time now);
  // HELLO goes out only where there is room (another follows soon);
  // DECISION and BYE wait in the link's bounded queue.
  void sendControl(wire::Kind kind, std::int64_t round, std::uint64_t flags,
                   std::optional<std::size_t> only, consensus::Time now);
  // Sends the estimates whose link delay has passed; when the next one is due.
  void sendDue(consensus::Time now);
  std::optional<consensus::Time> nextDue() const;

  // The next message waiting on the ROUTER, or nothing if none waits.
  std::optional<std::variant<Inbound, Rejected>> receive();
  // The engine's receipt for an Inbound: implausible rounds are rejects,
  // stale and duplicate estimates discards; anything else is a sign of
  // life (a returning neighbour gets our estimate again).
  void settle(const Inbound& message, consensus::Receipt receipt, consensus::Time now);

  // Polling: append() adds what the transport waits on (the ROUTER first);
  // serve() takes those items back after zmq::poll, handles connection
  // events, ZAP requests and queues that found room, and says whether
  // messages wait on the ROUTER.
  void append(std::vector<zmq::pollitem_t>& items);
  bool serve(std::span<const zmq::pollitem_t> items);

  const TrafficCounters& counters() const { return counters_; }

 private:
  struct Outgoing {
    std::int64_t round = 0;
    consensus::Time due{};
    std::array<std::byte, wire::kHeaderSize> header{};
    std::shared_ptr<const void> owner;
    std::span<const std::byte> payload;
  };
  // One per out-neighbour: its DEALER and what did not fit in its queue yet.
  // Nothing is lost to a momentarily full queue, and memory stays bounded:
  // one estimate (the newest) and at most kMaxPendingControls controls.
  struct Link {
    zmq::socket_t dealer;
    std::optional<Outgoing> estimate;
    std::deque<std::array<std::byte, wire::kHeaderSize>> controls;
  };
  static constexpr std::size_t kMaxPendingControls = 64;
  struct Identity {
    std::string name;  // for the log
    std::optional<std::size_t> peer;
    bool foreignId = false;  // CURVE: the routing id names another node than the key
  };

  void openRouter();
  void connectDealers();
  wire::Header header(wire::Kind kind, std::int64_t round, consensus::Time now) const;
  void sendToAll(Outgoing out);
  void queueEstimate(Link& link, const Outgoing& out);
  void flush(Link& link);
  Identity identify(const std::vector<zmq::message_t>& frames) const;
  Rejected reject(std::optional<std::size_t> peer, wire::Reject reason,
                  const std::string& detail = {});
  void welcome(std::size_t peer, consensus::Time now);
  void resendTo(std::size_t peer);
  void onKeepAliveRound(std::size_t peer, std::int64_t round);
  void receiveEvents();

  OwnerThread owner_;
  const topology::Topology& topology_;
  std::size_t self_;
  TransportOptions options_;

  zmq::context_t context_{1};
  zmq::socket_t router_;
  zmq::socket_t monitor_;                   // the router's connection events
  std::unique_ptr<curve::ZapHandler> zap_;  // with security.curve
  std::map<std::size_t, Link> links_;
  std::vector<Link*> waiting_;                         // links polled for room, in append()'s order
  std::map<std::string, std::size_t> peerIndex_;       // node id -> in-neighbour
  std::map<std::uint32_t, std::size_t> peerBySender_;  // header sender -> in-neighbour
  std::map<std::size_t, consensus::Time> lastHeard_;
  std::map<std::size_t, std::int64_t> helloRounds_;  // last keep-alive round per neighbour
  std::deque<Outgoing> delayed_;                     // held back by link_delay, oldest first
  std::optional<Outgoing> lastSent_;                 // sent again to a neighbour that comes back
  std::set<std::string> loggedRejects_;
  TrafficCounters counters_;
};

}  // namespace consensusd::daemon
