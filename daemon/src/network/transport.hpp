#pragma once
// The node's sockets (docs/design.md §6, docs/protocol.md): one ROUTER that the
// in-neighbours send to, one DEALER per out-neighbour with its send queue,
// and the rules for sending again. An estimate larger than one chunk goes
// out in chunks, between which control messages pass, and only when the
// neighbour has said its buffer for us is free (READY): each in-neighbour
// gets one receive buffer, so memory is one model per in-neighbour whatever
// it sends. Every message in is either an Inbound (validated: identity,
// header, payload) or a counted, logged reject; the engine's verdict on an
// Inbound comes back through settle(). Payloads are bytes: nothing here
// depends on the parameter type. Owned by the engine thread. Defined in
// transport.cpp (sockets, receiving) and sending.cpp; its parts are the
// ChunkReceiver (one per in-neighbour) and the GraphDialect.

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
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
#include "network/chunk_receiver.hpp"
#include "network/graph_dialect.hpp"
#include "os/owner_thread.hpp"

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
  // The most payload bytes one message carries (tests make it small).
  std::size_t chunkBytes = wire::kChunkBytes;
};

enum class SendEvent : std::uint8_t {
  Superseded,  // a newer estimate replaced one still waiting for room
  Deferred,    // no room in the queue yet: sent later
  Dropped,     // a control message the queue bound let go
};
enum class Discard : std::uint8_t { Stale, Duplicate };
// Their names in status and metrics, in the enums' order (counters are indexed by them).
inline constexpr data::NameTable<SendEvent, 3> kSendEvents{{{SendEvent::Superseded, "superseded"},
                                                            {SendEvent::Deferred, "deferred"},
                                                            {SendEvent::Dropped, "dropped"}}};
inline constexpr data::NameTable<Discard, 2> kDiscards{
    {{Discard::Stale, "stale"}, {Discard::Duplicate, "duplicate"}}};
static_assert(static_cast<std::size_t>(SendEvent::Dropped) + 1 == kSendEvents.size());
static_assert(static_cast<std::size_t>(Discard::Duplicate) + 1 == kDiscards.size());

// What the transport counted, indexed by enum; names as in status and metrics.
struct TrafficCounters {
  std::uint64_t accepted = 0;  // messages that passed validation and the round check
  std::array<std::uint64_t, wire::kRejectReasons> rejected{};
  std::array<std::uint64_t, kDiscards.size()> discarded{};
  std::array<std::uint64_t, kSendEvents.size()> sends{};
  std::uint64_t connectionsClosed = 0;  // by peers or by ZeroMQ (oversized frames)
  std::uint64_t removedBy = 0;          // neighbours' BYEs saying they removed us from their graph
  std::map<std::size_t, std::uint64_t> rejectedFrom;  // per in-neighbour (topology index)
  std::uint64_t bytesSent = 0;                        // estimate payload handed to ZeroMQ
  std::map<std::size_t, std::uint64_t> sentTo;        // the same per out-neighbour

  // Only the counts above zero, by name ("checksum", "stale", "deferred"...).
  std::map<std::string, std::uint64_t> rejects() const;
  std::map<std::string, std::uint64_t> discards() const;
  std::map<std::string, std::uint64_t> sendEvents() const;
};

const char* toString(SendEvent event);
const char* toString(Discard discard);

struct Inbound {
  std::size_t from = 0;  // topology index of the in-neighbour
  // Of a whole estimate: offset 0 and payloadBytes the estimate's size.
  wire::Header header;
  // A chunk of an estimate still arriving (its bytes are kept by the
  // transport): a sign of life and of the round it is from, nothing to mix.
  bool partial = false;
  // Checked against the header (length, checksum, finite). The owner is
  // shared, so the engine's mailbox can keep the estimate where it was
  // received (the ZeroMQ message, or the neighbour's receive buffer, which
  // is written again only once every holder let go).
  std::shared_ptr<const void> owner;
  std::span<const std::byte> payload;
};

// A compressed frame (consensus/codec.hpp) of a round, building on the
// sender's public copy of round `base`.
struct CompressedFrame {
  std::int64_t base = -1;
  std::shared_ptr<const void> owner;
  std::span<const std::byte> bytes;
};

struct Rejected {
  std::optional<std::size_t> from;  // none: the sender is nobody we know
  wire::Reject reason;
};

class Transport {
 public:
  // Binds and connects; throws Unavailable if the endpoint cannot be bound.
  // `topology` must outlive the transport, or the next setTopology.
  Transport(const topology::Topology& topology, std::size_t self, TransportOptions options);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // A new graph, between rounds: links and receive buffers of neighbours in
  // both stay under their new index (one whose endpoint or key changed is
  // connected anew), new ones are made, gone ones closed; with CURVE the new
  // in-neighbours' keys are admitted. A neighbour in both is spoken to in
  // the graph we left (its hash, our index there) until it speaks the new
  // one, and its messages in the old one are accepted: the two sides of an
  // edge keep exchanging while a change rolls out (docs/protocol.md,
  // "Changing the graph"). `next` must outlive the transport, or the next call.
  void setTopology(const topology::Topology& next, std::size_t self);
  // Whether neighbour `node` still speaks the graph the last setTopology left.
  bool onPreviousGraph(std::size_t node) const { return dialect_.onPrevious(node); }

  // Sends `payload` (kept alive by `owner` until every send completes) to
  // every out-neighbour as round `round`'s estimate; after link_delay if set.
  void publish(std::int64_t round, std::shared_ptr<const void> owner,
               std::span<const std::byte> payload, consensus::Time now);
  // With compression: `frame` to each neighbour whose copy of ours is at
  // its base (the last estimate we began to it), the public copy `copy`
  // whole to any other (first contact, a lost or superseded send, RESYNC).
  void publishCompressed(std::int64_t round, std::shared_ptr<const void> copyOwner,
                         std::span<const std::byte> copy, std::optional<CompressedFrame> frame,
                         consensus::Time now);
  // DECISION and BYE wait in the link's bounded queue, and go out before
  // the next chunk of an estimate.
  void sendControl(wire::Kind kind, std::int64_t round, std::uint64_t flags,
                   std::optional<std::size_t> only, consensus::Time now);
  // Every peer_timeout / 3: a HELLO with our round to each out-neighbour
  // (at most one waits per link), and READY again to every in-neighbour
  // whose buffer is free (one may have been lost with a connection).
  // `idle`: no trainer, nothing computed (kHelloIdle).
  void keepAlive(std::int64_t round, consensus::Time now, bool idle = false);
  // Tells in-neighbours whose receive buffer came free (the engine let go
  // of their last estimate) that the next may come, and updates the
  // per-neighbour rates. Call once a loop.
  void offerBuffers(consensus::Time now);
  // Sends the estimates whose link delay has passed; when the next one is due.
  void sendDue(consensus::Time now);
  std::optional<consensus::Time> nextDue() const;

  // The next message waiting on the ROUTER, or nothing if none waits.
  std::optional<std::variant<Inbound, Rejected>> receive(consensus::Time now);
  // The engine's receipt for an Inbound: implausible rounds are rejects,
  // stale and duplicate estimates discards; anything else is a sign of
  // life (a returning neighbour gets our estimate again). A compressed
  // frame that did not fit (gap, corrupt) is a reject, and the sender is
  // asked for its copy whole (RESYNC).
  void settle(const Inbound& message, consensus::Receipt receipt, consensus::Time now);

  // Polling: append() adds what the transport waits on (the ROUTER first);
  // serve() takes those items back after zmq::poll, handles connection
  // events, ZAP requests, READYs and queues that found room, and says
  // whether messages wait on the ROUTER.
  void append(std::vector<zmq::pollitem_t>& items);
  bool serve(std::span<const zmq::pollitem_t> items, consensus::Time now);

  const TrafficCounters& counters() const { return counters_; }
  // Per in-neighbour (topology index); zeros before anything arrived.
  Inflow inflow(std::size_t peer) const;
  // An estimate (or a control) is still going out, or may now: a payload
  // ZeroMQ has not yet written to its socket, one in chunks begun, or one
  // waiting that the neighbour granted.
  bool sending() const;
  // Payloads ZeroMQ still holds (not yet written to a socket).
  std::uint64_t unsent() const {
    return static_cast<std::uint64_t>(std::max<std::int64_t>(unsent_->load(), 0));
  }
  // Whether estimates go in several chunks (and so wait for READY).
  bool chunked() const { return chunked_; }

 private:
  struct Outgoing {
    std::int64_t round = 0;
    consensus::Time due{};
    wire::Header header;  // each chunk's offset, size and checksum filled in
    std::shared_ptr<const void> owner;
    std::span<const std::byte> payload;
    std::shared_ptr<const std::vector<std::uint32_t>> checksums;  // one per chunk
    // With compression, the whole estimate is the public copy and this its
    // alternative for a neighbour in step (header.base: what it builds on).
    std::shared_ptr<const Outgoing> frame;
  };
  // One per out-neighbour: its DEALER and what did not fit in its queue yet.
  // Nothing is lost to a momentarily full queue, and memory stays bounded:
  // one estimate waiting (the newest), one being sent (in chunks; both
  // reference the round's buffer, no copy) and at most kMaxPendingControls
  // controls.
  struct Link {
    zmq::socket_t dealer;
    std::size_t peer = 0;
    std::optional<Outgoing> estimate;  // the newest, not begun
    std::optional<Outgoing> sending;   // in chunks: begun, `sentBytes` out so far
    std::size_t sentBytes = 0;
    struct Control {
      std::array<std::byte, wire::kHeaderSize> bytes;
      bool hello;
    };
    std::deque<Control> controls;
    bool helloWaiting = false;  // one HELLO at most waits
    // In chunks, an estimate begins only on the neighbour's READY: `grant`
    // is one not used yet; `usedGrant` the one our last estimate began on.
    // A READY that repeats it before `usedUntil` crossed that estimate on
    // the way (the neighbour restates READY until a first chunk arrives).
    std::optional<std::uint64_t> grant;
    std::uint64_t usedGrant = 0;
    consensus::Time usedUntil{};
    // With compression: the round of the last estimate begun to it (frame
    // or whole), where its copy of ours will be; -1: unknown, send it whole.
    std::int64_t copyRound = -1;
  };
  static constexpr std::size_t kMaxPendingControls = 64;
  struct Identity {
    std::string name;  // for the log
    std::optional<std::size_t> peer;
    bool foreignId = false;  // CURVE: the routing id names another node than the key
  };

  void openRouter();
  void connectDealers();
  Link makeLink(std::size_t peer);
  ChunkReceiver makeReceiver(std::size_t peer) const;
  std::map<std::string, std::string> admittedKeys() const;  // CURVE: in-neighbours' keys -> ids
  wire::Header header(wire::Kind kind, std::int64_t round) const;
  Outgoing outgoing(const wire::Header& h, std::shared_ptr<const void> owner,
                    std::span<const std::byte> payload, consensus::Time now) const;
  // After link_delay if set, else now.
  void dispatch(Outgoing out, consensus::Time now);
  void sendToAll(Outgoing out, consensus::Time now);
  void queueEstimate(Link& link, const Outgoing& out, consensus::Time now);
  void flush(Link& link, consensus::Time now);
  bool sendChunk(Link& link, const Outgoing& out, std::size_t at, consensus::Time now);
  void queueControl(Link& link, const std::array<std::byte, wire::kHeaderSize>& bytes, bool hello);
  void receiveReplies(Link& link, consensus::Time now);
  std::optional<std::variant<Inbound, Rejected>> receiveChunk(std::size_t from,
                                                              const wire::Header& h,
                                                              zmq::message_t& payload,
                                                              consensus::Time now);
  // Counts what a chunk refused; the Inbound it makes, if any.
  std::optional<std::variant<Inbound, Rejected>> counted(std::size_t from,
                                                         ChunkReceiver::Outcome outcome);
  void sendReady(ChunkReceiver& in);
  // A control on the connection `in` speaks on (READY, RESYNC); dropped if it is gone.
  void reply(ChunkReceiver& in, const wire::Header& h);
  // A neighbour the last change removed, still sending on `routingId`: told
  // so (BYE flagged removed, in the graph it runs), at most once per peer timeout.
  void tellRemoved(const std::string& id, const std::string& routingId, consensus::Time now);
  void noteRoutingId(std::size_t peer, const std::string& routingId);
  Identity identify(const std::vector<zmq::message_t>& frames) const;
  Rejected reject(std::optional<std::size_t> peer, wire::Reject reason,
                  const std::string& detail = {});
  void welcome(std::size_t peer, consensus::Time now);
  void resendTo(std::size_t peer, consensus::Time now);
  void onKeepAliveRound(std::size_t peer, std::int64_t round, std::int64_t held,
                        consensus::Time now);
  void receiveEvents();

  OwnerThread owner_;
  const topology::Topology* topology_;
  std::size_t self_;
  std::string routingId_;
  GraphDialect dialect_;  // which graph each neighbour speaks while a change rolls out
  TransportOptions options_;
  std::size_t estimateBytes_;
  bool chunked_;  // estimates of more than one chunk
  // DEALERs read replies when polled: READY (in chunks), RESYNC (compressed);
  // else at each keep-alive (a BYE flagged removed is all that comes).
  bool listens_;

  zmq::context_t context_{1};
  zmq::socket_t router_;
  zmq::socket_t monitor_;                   // the router's connection events
  std::unique_ptr<curve::ZapHandler> zap_;  // with security.curve
  std::map<std::size_t, Link> links_;
  std::map<std::size_t, ChunkReceiver> receivers_;     // per in-neighbour
  std::vector<Link*> waiting_;                         // links polled for room, in append()'s order
  std::map<std::string, std::size_t> peerIndex_;       // node id -> in-neighbour
  std::map<std::uint32_t, std::size_t> peerBySender_;  // header sender -> in-neighbour
  std::map<std::size_t, consensus::Time> lastHeard_;
  std::map<std::size_t, std::int64_t> helloRounds_;  // last keep-alive round per neighbour
  // The newest estimate stored of each in-neighbour, told back to it in our
  // HELLOs (field `base`) so it resends only what we lack.
  std::map<std::size_t, std::int64_t> heldFrom_;
  std::deque<Outgoing> delayed_;      // held back by link_delay, oldest first
  std::optional<Outgoing> lastSent_;  // sent again to a neighbour that comes back
  std::set<std::string> loggedRejects_;
  std::deque<Inbound> replies_;  // handed out by receive() before the ROUTER's messages
  TrafficCounters counters_;
  std::mt19937_64 grants_;  // READY ids
  // Payloads (whole estimates or chunks) ZeroMQ holds: its I/O thread
  // counts them down once written to the socket.
  std::shared_ptr<std::atomic<std::int64_t>> unsent_ =
      std::make_shared<std::atomic<std::int64_t>>(0);
};

}  // namespace consensusd::daemon
