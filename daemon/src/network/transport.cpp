#include "network/transport.hpp"

#include <spdlog/spdlog.h>

#include <atomic>
#include <cstring>
#include <random>
#include <zmq_addon.hpp>

#include "consensusd/daemon/status_server.hpp"
#include "os/resident.hpp"

namespace consensusd::daemon {
namespace {

using consensus::Time;

// 64 random bits: a routing id nobody can claim before us (a restart, or a
// reconnect after an outage, never meets a stale connection's id).
std::string randomHex() {
  std::random_device device;
  const std::uint64_t bits = (std::uint64_t{device()} << 32) | device();
  return fmt::format("{:016x}", bits);
}

bool trySend(zmq::socket_t& dealer, const std::array<std::byte, wire::kHeaderSize>& header,
             zmq::message_t payload) {
  // The high-water mark is checked on the first frame only: the second cannot fail on it.
  if (!dealer.send(zmq::buffer(header), zmq::send_flags::sndmore | zmq::send_flags::dontwait))
    return false;
  return dealer.send(payload, zmq::send_flags::dontwait).has_value();
}

// A sent payload's share of its buffer, released by ZeroMQ's I/O thread.
// libzmq hands the message over through pipes ThreadSanitizer cannot see
// (Debian's build is not instrumented); the flag's release/acquire pair
// makes the hand-over visible to it, for one uncontended atomic per send.
struct PayloadReference {
  std::shared_ptr<const void> owner;
  std::atomic<bool> handedOver{false};
  std::shared_ptr<std::atomic<std::int64_t>> unsent;  // the transport's count of these
};

template <std::size_t N, class Enum>
std::map<std::string, std::uint64_t> named(const std::array<std::uint64_t, N>& counts,
                                           const char* (*name)(Enum)) {
  std::map<std::string, std::uint64_t> out;
  for (std::size_t i = 0; i < N; ++i)
    if (counts[i] > 0) out[name(static_cast<Enum>(i))] = counts[i];
  return out;
}

}  // namespace

const char* toString(SendEvent event) {
  return data::nameOf(kSendEvents, event).data();
}

const char* toString(Discard discard) {
  return data::nameOf(kDiscards, discard).data();
}

std::map<std::string, std::uint64_t> TrafficCounters::rejects() const {
  return named<wire::kRejectReasons, wire::Reject>(rejected, &wire::toString);
}
std::map<std::string, std::uint64_t> TrafficCounters::discards() const {
  return named<kDiscards.size(), Discard>(discarded, &daemon::toString);
}
std::map<std::string, std::uint64_t> TrafficCounters::sendEvents() const {
  return named<kSendEvents.size(), SendEvent>(sends, &daemon::toString);
}

Transport::Transport(const topology::Topology& topology, std::size_t self, TransportOptions options)
    : topology_(&topology),
      self_(self),
      routingId_(topology.node(self).id + "/" + randomHex()),
      options_(std::move(options)),
      estimateBytes_(options_.expect.dimension * wire::bytesPer(options_.expect.dtype)),
      chunked_(estimateBytes_ > options_.chunkBytes),
      listens_(chunked_ || options_.expect.compression != consensus::Compression::None),
      grants_(std::random_device{}()) {
  for (const topology::Neighbor& in : topology_->inNeighbors(self_)) {
    peerIndex_[topology_->node(in.index).id] = in.index;
    peerBySender_[static_cast<std::uint32_t>(in.index)] = in.index;
    counters_.rejectedFrom[in.index] = 0;
    receivers_.emplace(in.index, makeReceiver(in.index));
  }
  openRouter();
  connectDealers();
}

Transport::Receiver Transport::makeReceiver(std::size_t peer) const {
  Receiver receiver;
  receiver.peer = peer;
  if (chunked_) {  // the neighbour's buffer, resident now rather than in the first round
    receiver.buffer = std::shared_ptr<std::byte[]>(new std::byte[estimateBytes_]);
    makeResident({receiver.buffer.get(), estimateBytes_});
  }
  return receiver;
}

std::map<std::string, std::string> Transport::admittedKeys() const {
  std::map<std::string, std::string> admitted;
  for (const topology::Neighbor& in : topology_->inNeighbors(self_))
    admitted.emplace(topology_->node(in.index).publicKey, topology_->node(in.index).id);
  return admitted;
}

void Transport::setTopology(const topology::Topology& next, std::size_t self) {
  owner_.check();
  const topology::Topology& last = *topology_;
  // Keyed by index: moved to the same node's index in `next`; gone ones dropped.
  const auto moved = [&](std::size_t index) { return next.indexOf(last.node(index).id); };
  const auto remap = [&](auto& byIndex) {
    std::remove_reference_t<decltype(byIndex)> out;
    for (auto& [index, value] : byIndex)
      if (const auto at = moved(index)) out.emplace(*at, std::move(value));
    byIndex = std::move(out);
  };
  remap(lastHeard_);
  remap(helloRounds_);
  remap(heldFrom_);
  remap(counters_.rejectedFrom);
  remap(counters_.sentTo);
  remap(receivers_);
  remap(links_);
  waiting_.clear();  // pointers into links_: append() makes them again

  // A neighbour kept at the same address keeps its link; the rest are new.
  const auto sameAddress = [&](std::size_t index) {
    const auto before = last.indexOf(next.node(index).id);
    return before && last.node(*before).endpoint == next.node(index).endpoint &&
           last.node(*before).publicKey == next.node(index).publicKey;
  };
  std::map<std::size_t, Link> links;
  for (const topology::Neighbor& out : next.outNeighbors(self)) {
    const auto kept = links_.find(out.index);
    if (kept != links_.end() && sameAddress(out.index)) {
      links.emplace(out.index, std::move(kept->second));
      links.at(out.index).peer = out.index;
    }
  }
  std::map<std::size_t, Receiver> receivers;
  peerIndex_.clear();
  peerBySender_.clear();
  for (const topology::Neighbor& in : next.inNeighbors(self)) {
    peerIndex_[next.node(in.index).id] = in.index;
    peerBySender_[static_cast<std::uint32_t>(in.index)] = in.index;
    counters_.rejectedFrom.try_emplace(in.index, 0);
    const auto kept = receivers_.find(in.index);
    receivers.emplace(in.index,
                      kept != receivers_.end() ? std::move(kept->second) : makeReceiver(in.index));
    receivers.at(in.index).peer = in.index;
  }
  dialect_.change(last, self_, next, self);
  topology_ = &next;
  self_ = self;
  options_.expect.topologyHash = next.hash();
  links_ = std::move(links);  // the rest close (linger: what is queued still goes out)
  for (const topology::Neighbor& out : next.outNeighbors(self))
    if (links_.count(out.index) == 0) links_.emplace(out.index, makeLink(out.index));
  receivers_ = std::move(receivers);
  if (zap_) zap_->admit(admittedKeys());
}

Transport::~Transport() {
  links_.clear();  // DEALERs linger briefly: a BYE still gets out
  zmq_socket_monitor(router_.handle(), nullptr, 0);
  monitor_.close();
  router_.close();
  zap_.reset();
}

void Transport::openRouter() {
  // A peer can make us allocate one chunk per message, and no more than
  // kReceiveQueue of them wait per connection (a few MiB).
  const std::size_t maxMessage = std::min(estimateBytes_, options_.chunkBytes) + 4096;
  router_ = zmq::socket_t(context_, zmq::socket_type::router);
  router_.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(maxMessage));
  router_.set(zmq::sockopt::rcvhwm, chunked_ ? 8 : 64);
  // A second connection with a live connection's routing id is refused
  // (handover would drop the live one, and libzmq 4.3.4 can assert under
  // repeated handovers); our DEALERs' ids carry a random part, so only a
  // copy of a live id clashes. docs/protocol.md, "Identities".
  router_.set(zmq::sockopt::router_handover, 0);
  router_.set(zmq::sockopt::linger, 0);
  router_.set(zmq::sockopt::heartbeat_ivl, 1000);
  router_.set(zmq::sockopt::heartbeat_timeout, 5000);
  if (options_.curve) {
    // Admitted: the in-neighbours' keys; the handler answers before the first connection.
    zap_ = std::make_unique<curve::ZapHandler>(context_, admittedKeys());
    curve::makeServer(router_, *options_.curve);
  }
  // What never reaches recv: junk that fails the ZMTP handshake, and
  // connections ZeroMQ closes (a frame over MAXMSGSIZE ends here).
  const std::string monitorEndpoint = "inproc://router-monitor";
  if (zmq_socket_monitor(router_.handle(), monitorEndpoint.c_str(),
                         ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                             ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                             ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_DISCONNECTED) != 0)
    throw zmq::error_t();
  monitor_ = zmq::socket_t(context_, zmq::socket_type::pair);
  monitor_.connect(monitorEndpoint);
  try {
    router_.bind(options_.bind);
  } catch (const zmq::error_t& e) {
    throw Unavailable("cannot bind " + options_.bind + ": " + e.what());
  }
}

void Transport::connectDealers() {
  spdlog::info("sending as routing id {}", routingId_);
  for (const topology::Neighbor& out : topology_->outNeighbors(self_))
    links_.emplace(out.index, makeLink(out.index));
}

Transport::Link Transport::makeLink(std::size_t peer) {
  zmq::socket_t dealer(context_, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::routing_id, routingId_);
  // In chunks, little waits in ZeroMQ's queue: a control message goes
  // out after at most these chunks (and what the kernel buffers).
  dealer.set(zmq::sockopt::sndhwm, chunked_ ? 4 : 8);
  dealer.set(zmq::sockopt::immediate, 1);
  dealer.set(zmq::sockopt::linger, 200);
  dealer.set(zmq::sockopt::heartbeat_ivl, 1000);
  dealer.set(zmq::sockopt::heartbeat_timeout, 5000);
  dealer.set(zmq::sockopt::reconnect_ivl, 100);
  dealer.set(zmq::sockopt::reconnect_ivl_max, 2000);
  if (options_.curve) curve::makeClient(dealer, *options_.curve, topology_->node(peer).publicKey);
  dealer.connect(topology_->node(peer).endpoint);
  Link link;
  link.dealer = std::move(dealer);
  link.peer = peer;
  return link;
}

wire::Header Transport::header(wire::Kind kind, std::int64_t round) const {
  wire::Header h;
  h.kind = kind;
  h.dtype = kind == wire::Kind::Estimate ? options_.expect.dtype : options_.expect.linkDtype();
  h.sender = static_cast<std::uint32_t>(self_);
  h.round = round;
  h.dimension = options_.expect.dimension;
  h.topologyHash = options_.expect.topologyHash;
  return h;
}

// One buffer per round, shared by every neighbour's send (zero-copy): each
// message holds a reference, the last send to complete frees it.
void Transport::publish(std::int64_t round, std::shared_ptr<const void> owner,
                        std::span<const std::byte> payload, Time now) {
  owner_.check();
  dispatch(outgoing(header(wire::Kind::Estimate, round), std::move(owner), payload, now), now);
}

void Transport::publishCompressed(std::int64_t round, std::shared_ptr<const void> copyOwner,
                                  std::span<const std::byte> copy,
                                  std::optional<CompressedFrame> frame, Time now) {
  owner_.check();
  Outgoing out = outgoing(header(wire::Kind::Estimate, round), std::move(copyOwner), copy, now);
  if (frame) {
    wire::Header h = header(wire::Kind::Estimate, round);
    h.dtype = options_.expect.linkDtype();
    h.base = frame->base;
    out.frame =
        std::make_shared<const Outgoing>(outgoing(h, std::move(frame->owner), frame->bytes, now));
  }
  dispatch(std::move(out), now);
}

Transport::Outgoing Transport::outgoing(const wire::Header& h, std::shared_ptr<const void> owner,
                                        std::span<const std::byte> payload, Time now) const {
  // One checksum per chunk, computed once for every neighbour.
  auto checksums = std::make_shared<std::vector<std::uint32_t>>();
  for (std::size_t at = 0; at < payload.size(); at += options_.chunkBytes)
    checksums->push_back(
        wire::checksum(payload.data() + at, std::min(options_.chunkBytes, payload.size() - at)));
  return {h.round, now, h, std::move(owner), payload, std::move(checksums), nullptr};
}

void Transport::dispatch(Outgoing out, Time now) {
  if (const consensus::Duration delay =
          options_.linkDelay ? options_.linkDelay(out.round) : consensus::Duration::zero();
      delay > consensus::Duration::zero()) {
    out.due = now + delay;
    delayed_.push_back(std::move(out));
    return;
  }
  sendToAll(std::move(out), now);
}

void Transport::sendToAll(Outgoing out, Time now) {
  lastSent_ = std::move(out);
  for (auto& [node, link] : links_) queueEstimate(link, *lastSent_, now);
}

void Transport::sendDue(Time now) {
  owner_.check();
  while (!delayed_.empty() && delayed_.front().due <= now) {
    sendToAll(std::move(delayed_.front()), now);
    delayed_.pop_front();
  }
}

std::optional<Time> Transport::nextDue() const {
  if (delayed_.empty()) return std::nullopt;
  return delayed_.front().due;
}

// Only the newest estimate matters: it replaces one still waiting for room
// (or, in chunks, for the neighbour's READY). One being sent goes on.
void Transport::queueEstimate(Link& link, const Outgoing& out, Time now) {
  if (link.sending && link.sending->round >= out.round) return;
  if (link.estimate) ++counters_.sends[static_cast<std::size_t>(SendEvent::Superseded)];
  link.estimate = out;
  flush(link, now);
  if (link.estimate) ++counters_.sends[static_cast<std::size_t>(SendEvent::Deferred)];
}

// A sent payload's share of its buffer, released by ZeroMQ's I/O thread.
// libzmq hands the message over through pipes ThreadSanitizer cannot see
// (Debian's build is not instrumented); the flag's release/acquire pair
// makes the hand-over visible to it, for one uncontended atomic per send.
namespace {
zmq::message_t referencing(const std::shared_ptr<const void>& owner,
                           std::span<const std::byte> bytes,
                           const std::shared_ptr<std::atomic<std::int64_t>>& unsent) {
  auto* hint = new PayloadReference{owner, {}, unsent};
  unsent->fetch_add(1, std::memory_order_relaxed);
  hint->handedOver.store(true, std::memory_order_release);
  // ZeroMQ never writes a message it sends: the const_cast only fits its signature.
  return zmq::message_t(
      const_cast<std::byte*>(bytes.data()), bytes.size(),  // NOLINT(*-const-cast)
      [](void* /*data*/, void* h) {
        auto* reference = static_cast<PayloadReference*>(h);
        [[maybe_unused]] const bool seen = reference->handedOver.load(std::memory_order_acquire);
        reference->unsent->fetch_sub(1, std::memory_order_release);
        delete reference;  // on a ZeroMQ I/O thread, once the send is done
      },
      hint);
}
}  // namespace

// Sends what waits on `link` until its queue is full (never blocks):
// controls first, then the estimate, whole or chunk by chunk (a control
// queued meanwhile goes before the next chunk).
void Transport::flush(Link& link, Time now) {
  for (;;) {
    while (!link.controls.empty()) {
      if (!trySend(link.dealer, link.controls.front().bytes, zmq::message_t())) return;
      if (link.controls.front().hello) link.helloWaiting = false;
      link.controls.pop_front();
    }
    if (!link.sending) {
      // In chunks, an estimate begins only on a READY it has not used.
      if (!link.estimate || (chunked_ && !link.grant)) return;
      const Outgoing& frame = link.estimate->frame ? *link.estimate->frame : *link.estimate;
      const bool inStep = link.estimate->frame && frame.header.base == link.copyRound;
      if (!sendChunk(link, inStep ? frame : *link.estimate, 0, now)) return;
      link.copyRound = link.estimate->round;
      if (chunked_) {
        link.usedGrant = *link.grant;
        link.grant.reset();
      }
      link.estimate.reset();
      continue;
    }
    if (!sendChunk(link, *link.sending, link.sentBytes, now)) return;
  }
}

// The chunk of `out` from byte `at` (all of it when it fits one); false
// when the queue is full. The estimate is `link.sending` until its last
// chunk is out.
bool Transport::sendChunk(Link& link, const Outgoing& out, std::size_t at, Time now) {
  const std::size_t bytes = std::min(options_.chunkBytes, out.payload.size() - at);
  wire::Header h = out.header;
  dialect_.speak(h, link.peer);
  h.offset = at;
  h.payloadBytes = bytes;
  h.checksum = (*out.checksums)[at / options_.chunkBytes];
  if (!trySend(link.dealer, wire::encode(h),
               referencing(out.owner, out.payload.subspan(at, bytes), unsent_)))
    return false;
  counters_.bytesSent += bytes;
  counters_.sentTo[link.peer] += bytes;
  if (at + bytes == out.payload.size()) {
    link.sending.reset();
    link.usedUntil = now + options_.peerTimeout;
  } else {
    if (at == 0) link.sending = out;
    link.sentBytes = at + bytes;
  }
  return true;
}

void Transport::queueControl(Link& link, const std::array<std::byte, wire::kHeaderSize>& bytes,
                             bool hello) {
  if (link.controls.size() >= kMaxPendingControls) {
    if (link.controls.front().hello) link.helloWaiting = false;
    link.controls.pop_front();
    ++counters_.sends[static_cast<std::size_t>(SendEvent::Dropped)];
  }
  link.controls.push_back({bytes, hello});
}

void Transport::sendControl(wire::Kind kind, std::int64_t round, std::uint64_t flags,
                            std::optional<std::size_t> only, Time now) {
  owner_.check();
  wire::Header h = header(kind, round);
  h.flags = flags;
  for (auto& [node, link] : links_) {
    if (only && *only != node) continue;
    wire::Header spoken = h;
    dialect_.speak(spoken, node);
    queueControl(link, wire::encode(spoken), false);
    flush(link, now);
  }
}

void Transport::keepAlive(std::int64_t round, Time now, bool idle) {
  owner_.check();
  for (auto& [node, link] : links_) {
    if (!listens_) receiveReplies(link, now);  // a BYE saying it removed us, if any
    if (link.helloWaiting) continue;           // the one waiting says as much
    link.helloWaiting = true;
    // Whether an estimate in chunks to it is under way: a control goes out
    // before the next chunk, so this is still true when the HELLO leaves.
    wire::Header h = header(wire::Kind::Hello, round);
    h.flags = (link.sending ? wire::kHelloSending : 0) | (idle ? wire::kHelloIdle : 0) |
              (dialect_.onPrevious(node) ? wire::kHelloNewer : 0);
    dialect_.speak(h, node);
    const auto held = heldFrom_.find(node);
    h.base = held != heldFrom_.end() ? held->second : -1;
    queueControl(link, wire::encode(h), true);
    flush(link, now);
  }
  for (auto& [peer, in] : receivers_)
    if (in.grant != 0) sendReady(in);  // restated: the same grant
}

// What the neighbour answers on our DEALER. In chunks, READY: its buffer
// for us is free. A READY we already used, restated before our estimate
// reached it, grants nothing; a new one while we send means it dropped what
// it had of ours: start again. With compression, RESYNC: a frame of ours
// did not fit its copy, so the next goes whole (now, if nothing waits).
void Transport::receiveReplies(Link& link, Time now) {
  std::vector<zmq::message_t> frames;
  while (zmq::recv_multipart(link.dealer, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
    const std::optional<std::size_t> peer =
        receivers_.count(link.peer) != 0 ? std::optional(link.peer) : std::nullopt;
    std::optional<wire::Reject> why;
    wire::Header h;
    if (frames.size() != 2) {
      why = wire::Reject::Frames;
    } else {
      const auto decoded =
          wire::decodeHeader({static_cast<const std::byte*>(frames[0].data()), frames[0].size()});
      if (const auto* bad = std::get_if<wire::Reject>(&decoded)) {
        why = *bad;
      } else {
        h = std::get<wire::Header>(decoded);
        const bool removed = h.kind == wire::Kind::Bye && h.flags == wire::kByeRemoved;
        if (h.kind != wire::Kind::Ready && h.kind != wire::Kind::Resync && !removed)
          why = wire::Reject::Kind;
        const auto spoken =
            dialect_.spokenBy(link.peer, h.topologyHash, *topology_, options_.expect);
        if (!why && (!spoken || h.sender != spoken->sender))
          why = wire::Reject::Sender;
        else if (!why)
          why = wire::validate(h, {}, spoken->expect);
        if (!why && frames[1].size() != 0) why = wire::Reject::Length;
      }
    }
    frames.clear();
    if (why) {
      reject(peer, *why, "on the link to " + topology_->node(link.peer).id);
      continue;
    }
    dialect_.heard(link.peer, h, options_.expect.topologyHash);
    if (h.kind == wire::Kind::Bye) {  // it dropped us: counted out like a node that left
      if (loggedRejects_.insert(topology_->node(link.peer).id + "/removed").second)
        spdlog::warn(
            "{} removed this node from its graph: it no longer mixes our estimates "
            "(apply the new topology here, or stop this node)",
            topology_->node(link.peer).id);
      ++counters_.removedBy;
      if (replies_.size() < links_.size())
        replies_.push_back(Inbound{link.peer, h, false, nullptr, {}});
      continue;
    }
    if (h.kind == wire::Kind::Resync) {
      if (options_.expect.compression == consensus::Compression::None) continue;
      link.copyRound = -1;
      if (!link.estimate && !link.sending && lastSent_) link.estimate = lastSent_;
      flush(link, now);
      continue;
    }
    if (!chunked_) continue;
    const std::uint64_t id = h.flags;
    if (id == link.usedGrant && (link.sending || now < link.usedUntil)) continue;
    link.grant = id;
    if (link.sending) {  // it gave up on the estimate we are sending: begin again, whole
      link.sending.reset();
      link.copyRound = -1;
      if (!link.estimate) link.estimate = lastSent_;  // the newest: as new as the one dropped
    }
    // It lacks our newest (lost with a connection, or it started after we sent it).
    if (!link.estimate && lastSent_ && h.round < lastSent_->round) link.estimate = lastSent_;
    flush(link, now);
  }
}

Rejected Transport::reject(std::optional<std::size_t> peer, wire::Reject reason,
                           const std::string& detail) {
  ++counters_.rejected[static_cast<std::size_t>(reason)];
  if (peer) ++counters_.rejectedFrom[*peer];
  const std::string who = peer ? topology_->node(*peer).id : std::string("?");
  if (loggedRejects_.insert(who + "/" + wire::toString(reason)).second) {
    spdlog::warn("dropping messages from {}: {}{}", peer ? who : std::string("an unknown peer"),
                 wire::toString(reason), detail.empty() ? "" : " (" + detail + ")");
  }
  return {peer, reason};
}

// Who sent a message. With CURVE the peer is who its key says (the ZAP
// User-Id), and the routing id must not name anybody else. Without, the
// routing id ("n1/<random>", see connectDealers) names the neighbour. When
// libzmq refuses a connection's duplicate id it later takes the first data
// frame as the id: a routing id of a header's size then names nobody, and
// the header's sender is checked instead (a later reconnect is not lost).
Transport::Identity Transport::identify(const std::vector<zmq::message_t>& frames) const {
  const std::string routingId = frames[0].to_string();
  const std::string named = routingId.substr(0, routingId.rfind('/'));
  Identity who{(zap_ && frames.size() > 1 ? curve::userIdOf(frames[1]) : named).substr(0, 64),
               std::nullopt};
  if (const auto it = peerIndex_.find(who.name); it != peerIndex_.end()) who.peer = it->second;
  who.foreignId = zap_ && named != who.name;
  return who;
}

std::optional<std::variant<Inbound, Rejected>> Transport::receive(Time now) {
  owner_.check();
  if (!replies_.empty()) {
    Inbound reply = std::move(replies_.front());
    replies_.pop_front();
    return reply;
  }
  std::vector<zmq::message_t> frames;
  if (!zmq::recv_multipart(router_, std::back_inserter(frames), zmq::recv_flags::dontwait))
    return std::nullopt;
  const Identity who = identify(frames);
  std::optional<std::size_t> from = who.peer;
  const bool misread = !zap_ && frames[0].size() == wire::kHeaderSize;
  if (!from && (!misread || frames.size() != 3)) {
    tellRemoved(who.name, frames[0].to_string(), now);
    return reject(std::nullopt, wire::Reject::NotNeighbor, "identity '" + who.name + "'");
  }
  if (who.foreignId)  // a key may only use its own node's id
    return reject(from, wire::Reject::Sender, "routing id of another node");
  if (frames.size() != 3) return reject(from, wire::Reject::Frames);
  const std::span header(static_cast<const std::byte*>(frames[1].data()), frames[1].size());
  const std::span payload(static_cast<const std::byte*>(frames[2].data()), frames[2].size());
  const auto decoded = wire::decodeHeader(header);
  if (const auto* why = std::get_if<wire::Reject>(&decoded)) return reject(from, *why);
  const wire::Header& h = std::get<wire::Header>(decoded);
  if (!from) {  // a routing id that names nobody: the header's sender is all there is
    if (const auto it = peerBySender_.find(h.sender); it != peerBySender_.end()) from = it->second;
  }
  if (!from) return reject(std::nullopt, wire::Reject::NotNeighbor, "identity '" + who.name + "'");
  // A neighbour still on the graph we left speaks it (its hash, its index there).
  const auto spoken = dialect_.spokenBy(*from, h.topologyHash, *topology_, options_.expect);
  if (!spoken) return reject(from, wire::Reject::NotNeighbor, "not in the graph it speaks");
  if (h.sender != spoken->sender)
    return reject(from, wire::Reject::Sender, "header claims node " + std::to_string(h.sender));
  if (h.kind == wire::Kind::Ready || h.kind == wire::Kind::Resync)
    return reject(from, wire::Reject::Kind, "a sender's control to a ROUTER");
  if (const auto why = wire::validate(h, payload, spoken->expect))
    return reject(from, *why,
                  *why == wire::Reject::Topology ? "their topology hash differs from ours" : "");
  dialect_.heard(*from, h, options_.expect.topologyHash);
  if (!misread) noteRoutingId(*from, frames[0].to_string());
  if (h.kind == wire::Kind::Estimate &&
      (chunked_ || h.offset != 0 || h.payloadBytes != options_.expect.totalBytes(h.dtype)))
    return receiveChunk(*from, h, frames[2], now);
  Receiver& in = receivers_.at(*from);
  if (h.kind == wire::Kind::Estimate) in.flow.bytes += h.payloadBytes;
  // The sender's chunks and its HELLO or BYE come in order on one
  // connection: one saying no estimate is under way, while we still wait for
  // part of one, means that part was lost (the connection dropped it).
  if (in.round && (h.kind == wire::Kind::Bye ||
                   (h.kind == wire::Kind::Hello && (h.flags & wire::kHelloSending) == 0))) {
    reject(*from, wire::Reject::Truncated,
           "round " + std::to_string(*in.round) + ": the sender sends no more of it");
    abandon(in);
  }
  auto message = std::make_shared<zmq::message_t>(std::move(frames[2]));
  const std::span<const std::byte> bytes(static_cast<const std::byte*>(message->data()),
                                         message->size());
  return Inbound{*from, h, false, std::move(message), bytes};
}

// A chunk of an estimate of several: into the neighbour's buffer, in
// order. The whole estimate comes out once its last chunk is in.
std::optional<std::variant<Inbound, Rejected>> Transport::receiveChunk(std::size_t from,
                                                                       const wire::Header& h,
                                                                       zmq::message_t& payload,
                                                                       Time now) {
  Receiver& in = receivers_.at(from);
  if (h.offset == 0) {
    if (in.round) {
      reject(
          from, wire::Reject::Truncated,
          "round " + std::to_string(*in.round) + " gave way to round " + std::to_string(h.round));
      abandon(in);
    }
    in.grant = 0;  // used (or ignored): a new one once the buffer is free again
    if (in.buffer && in.buffer.use_count() > 1) {
      in.dropping = h.round;
      return reject(from, wire::Reject::Overrun,
                    "round " + std::to_string(h.round) + " before our READY");
    }
    in.dropping.reset();
    if (!in.buffer)
      in.buffer = std::shared_ptr<std::byte[]>(
          new std::byte[estimateBytes_]);  // a sender that splits a small estimate
    in.round = h.round;
    in.received = 0;
    in.header = h;
    in.firstAt = now;
  } else if (!in.round || *in.round != h.round || h.offset != in.received ||
             h.dtype != in.header.dtype) {
    if (in.dropping == h.round) return reject(from, wire::Reject::Overrun);
    // A gap in the estimate being received: it can never be whole.
    if (in.round && *in.round == h.round) abandon(in);
    return reject(from, wire::Reject::ChunkOrder,
                  "round " + std::to_string(h.round) + " at byte " + std::to_string(h.offset));
  }
  std::memcpy(in.buffer.get() + h.offset, payload.data(), payload.size());
  in.received += payload.size();
  in.flow.bytes += payload.size();
  const std::uint64_t total = options_.expect.totalBytes(in.header.dtype);
  if (in.received < total) return Inbound{from, h, true, nullptr, {}};
  // Whole: the mailbox keeps it in the buffer, which stays ours to fill
  // again once every holder has let go.
  wire::Header whole = in.header;
  whole.payloadBytes = total;
  in.round.reset();
  in.delivered = std::max(in.delivered, whole.round);
  in.flow.transfer = now - in.firstAt;
  const std::span<const std::byte> bytes(in.buffer.get(), total);
  return Inbound{from, whole, false, std::shared_ptr<const void>(in.buffer, in.buffer.get()),
                 bytes};
}

// A half-received estimate that can never be finished: dropped, and the
// sender told to send again (a new READY once the buffer is free).
void Transport::abandon(Receiver& in) {
  in.round.reset();
  in.received = 0;
  in.grant = 0;
}

// A neighbour's messages from another connection (it restarted, or
// reconnected): what the old one was sending will not go on, and READY
// must go to the new one.
void Transport::noteRoutingId(std::size_t peer, const std::string& routingId) {
  Receiver& in = receivers_.at(peer);
  if (in.routingId == routingId) return;
  const bool changed = !in.routingId.empty();
  in.routingId = routingId;
  if (!chunked_ || !changed) return;
  if (in.round) {
    reject(peer, wire::Reject::Truncated,
           "round " + std::to_string(*in.round) + ": the sender reconnected");
    abandon(in);
  }
  in.grant = 0;  // offered again, on the new connection
}

void Transport::sendReady(Receiver& in) {
  wire::Header h = header(wire::Kind::Ready, in.delivered);
  h.flags = in.grant;
  reply(in, h);
}

void Transport::reply(Receiver& in, const wire::Header& h) {
  if (in.routingId.empty()) return;  // not heard yet: no connection to answer on
  wire::Header spoken = h;
  dialect_.speak(spoken, in.peer);
  const auto bytes = wire::encode(spoken);
  // Dropped by ZeroMQ if that connection is gone or full; restated later.
  if (!router_.send(zmq::buffer(in.routingId),
                    zmq::send_flags::sndmore | zmq::send_flags::dontwait))
    return;
  if (!router_.send(zmq::buffer(bytes), zmq::send_flags::sndmore | zmq::send_flags::dontwait))
    return;
  router_.send(zmq::message_t(), zmq::send_flags::dontwait);
}

void Transport::tellRemoved(const std::string& id, const std::string& routingId, Time now) {
  wire::Header h = header(wire::Kind::Bye, lastSent_ ? lastSent_->header.round : 0);
  if (!dialect_.tellRemoved(id, h, now, options_.peerTimeout)) return;
  const auto bytes = wire::encode(h);
  if (!router_.send(zmq::buffer(routingId), zmq::send_flags::sndmore | zmq::send_flags::dontwait))
    return;
  if (!router_.send(zmq::buffer(bytes), zmq::send_flags::sndmore | zmq::send_flags::dontwait))
    return;
  router_.send(zmq::message_t(), zmq::send_flags::dontwait);
}

void Transport::offerBuffers(Time now) {
  owner_.check();
  for (auto& [peer, in] : receivers_) {
    // The bytes per second, over a second or more.
    if (now - in.windowStart >= std::chrono::seconds(1)) {
      in.flow.bytesPerSecond = static_cast<double>(in.flow.bytes - in.windowBytes) /
                               std::chrono::duration<double>(now - in.windowStart).count();
      in.windowBytes = in.flow.bytes;
      in.windowStart = now;
    }
    if (!chunked_) continue;
    // READY goes back on the connection the neighbour speaks on: none until it spoke.
    const bool free = !in.round && (!in.buffer || in.buffer.use_count() == 1);
    if (!free || in.grant != 0 || in.routingId.empty()) continue;
    std::uniform_int_distribution<std::uint64_t> any(1);
    in.grant = any(grants_);
    sendReady(in);
  }
}

bool Transport::sending() const {
  if (unsent_->load(std::memory_order_acquire) > 0) return true;  // in ZeroMQ's queues
  for (const auto& [node, link] : links_)
    if (link.sending || !link.controls.empty() || (link.estimate && (!chunked_ || link.grant)))
      return true;
  return false;
}

Inflow Transport::inflow(std::size_t peer) const {
  const auto it = receivers_.find(peer);
  return it != receivers_.end() ? it->second.flow : Inflow{};
}

void Transport::settle(const Inbound& message, consensus::Receipt receipt, Time now) {
  owner_.check();
  if (receipt == consensus::Receipt::Implausible) {
    reject(message.from, wire::Reject::Round, "round " + std::to_string(message.header.round));
    return;
  }
  if (receipt == consensus::Receipt::Gap || receipt == consensus::Receipt::Corrupt) {
    const bool gap = receipt == consensus::Receipt::Gap;
    reject(message.from, gap ? wire::Reject::Gap : wire::Reject::Frame,
           "round " + std::to_string(message.header.round) + " on " +
               std::to_string(message.header.base) + ": asking for a keyframe");
    reply(receivers_.at(message.from), header(wire::Kind::Resync, message.header.round));
    lastHeard_[message.from] = now;  // alive, and not to be welcomed with a resend
    return;
  }
  ++counters_.accepted;
  // Held (stale ones too: a compressed frame went into the copy all the same).
  if (message.header.kind == wire::Kind::Estimate &&
      (receipt == consensus::Receipt::Stored || receipt == consensus::Receipt::Duplicate ||
       receipt == consensus::Receipt::Stale)) {
    std::int64_t& held = heldFrom_.try_emplace(message.from, -1).first->second;
    held = std::max(held, message.header.round);
  }
  if (receipt == consensus::Receipt::Stale)
    ++counters_.discarded[static_cast<std::size_t>(Discard::Stale)];
  if (receipt == consensus::Receipt::Duplicate)
    ++counters_.discarded[static_cast<std::size_t>(Discard::Duplicate)];
  if (message.header.kind == wire::Kind::Bye && message.header.flags == wire::kByeRemoved) return;
  welcome(message.from, now);
  if (message.header.kind == wire::Kind::Hello)
    onKeepAliveRound(message.from, message.header.round, message.header.base, now);
  if (message.header.kind == wire::Kind::Bye)
    spdlog::info("{} said goodbye", topology_->node(message.from).id);
}

// A neighbour heard for the first time, or again after a silence: it may
// have missed our estimate (not yet connected, restarted), so send it again.
void Transport::welcome(std::size_t peer, Time now) {
  const auto heard = lastHeard_.find(peer);
  const bool returning = heard == lastHeard_.end() || now - heard->second > options_.peerTimeout;
  lastHeard_[peer] = now;
  if (!returning) return;
  if (heard != lastHeard_.end()) spdlog::info("{} is back", topology_->node(peer).id);
  if (!chunked_) resendTo(peer, now);  // in chunks, its READY says what it lacks
}

void Transport::resendTo(std::size_t peer, Time now) {
  if (const auto link = links_.find(peer); link != links_.end() && lastSent_) {
    // Compressed: the frame again, on the guess that the one sent was lost
    // (if not, it is a duplicate there; a copy anywhere else answers RESYNC).
    link->second.copyRound = lastSent_->frame ? lastSent_->frame->header.base : -1;
    queueEstimate(link->second, *lastSent_, now);
  }
}

// A neighbour whose keep-alives report the same round twice in a row is
// stuck; if our newest estimate is one it can use and its keep-alive says it
// does not hold it (`held`: the newest of ours it stored), it may have been
// lost with a dropped connection: send it again (at most once per
// keep-alive). A neighbour stuck on something else (its compute, a slow
// trainer) holds it: nothing is resent. In chunks, its READY says what it
// lacks instead (receiveReady).
void Transport::onKeepAliveRound(std::size_t peer, std::int64_t round, std::int64_t held,
                                 Time now) {
  const auto [previous, fresh] = helloRounds_.try_emplace(peer, round);
  if (fresh) return;
  const bool stuck = previous->second == round;
  previous->second = round;
  if (stuck && !chunked_ && lastSent_ && lastSent_->round >= round - options_.staleness &&
      held < lastSent_->round)
    resendTo(peer, now);
}

void Transport::receiveEvents() {
  std::vector<zmq::message_t> frames;
  while (zmq::recv_multipart(monitor_, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
    std::uint16_t event = 0;
    if (!frames.empty() && frames[0].size() >= sizeof event)
      std::memcpy(&event, frames[0].data(), sizeof event);
    if (event == ZMQ_EVENT_DISCONNECTED) {
      ++counters_.connectionsClosed;
    } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
      reject(std::nullopt, wire::Reject::Auth);  // the ZAP handler denied the key
    } else {
      reject(std::nullopt, wire::Reject::Handshake);
    }
    frames.clear();
  }
}

void Transport::append(std::vector<zmq::pollitem_t>& items) {
  owner_.check();
  items.push_back({router_.handle(), 0, ZMQ_POLLIN, 0});
  items.push_back({monitor_.handle(), 0, ZMQ_POLLIN, 0});
  items.push_back(
      {zap_ ? zap_->socket().handle() : nullptr, -1, static_cast<short>(zap_ ? ZMQ_POLLIN : 0), 0});
  // Links with something waiting are polled for room in their queue; in
  // chunks, every link for its neighbour's READYs.
  waiting_.clear();
  for (auto& [node, link] : links_) {
    const bool pending =
        link.sending || (link.estimate && (!chunked_ || link.grant)) || !link.controls.empty();
    if (!pending && !listens_) continue;
    const short events =
        static_cast<short>((pending ? ZMQ_POLLOUT : 0) | (listens_ ? ZMQ_POLLIN : 0));
    items.push_back({link.dealer.handle(), 0, events, 0});
    waiting_.push_back(&link);
  }
}

bool Transport::serve(std::span<const zmq::pollitem_t> items, Time now) {
  owner_.check();
  if (items[1].revents & ZMQ_POLLIN) receiveEvents();
  if (items[2].revents & ZMQ_POLLIN) zap_->answer();
  for (std::size_t w = 0; w < waiting_.size(); ++w) {
    if (items[3 + w].revents & ZMQ_POLLIN) receiveReplies(*waiting_[w], now);
    if (items[3 + w].revents & ZMQ_POLLOUT) flush(*waiting_[w], now);
  }
  return (items[0].revents & ZMQ_POLLIN) != 0 || !replies_.empty();
}

}  // namespace consensusd::daemon
