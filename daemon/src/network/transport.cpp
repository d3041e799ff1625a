#include "network/transport.hpp"

#include <spdlog/spdlog.h>

#include <atomic>
#include <cstring>
#include <random>
#include <zmq_addon.hpp>

#include "consensusd/daemon/status_server.hpp"

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

ChunkReceiver Transport::makeReceiver(std::size_t peer) const {
  return ChunkReceiver(peer, estimateBytes_, chunked_);
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
  std::map<std::size_t, ChunkReceiver> receivers;
  peerIndex_.clear();
  peerBySender_.clear();
  for (const topology::Neighbor& in : next.inNeighbors(self)) {
    peerIndex_[next.node(in.index).id] = in.index;
    peerBySender_[static_cast<std::uint32_t>(in.index)] = in.index;
    counters_.rejectedFrom.try_emplace(in.index, 0);
    const auto kept = receivers_.find(in.index);
    receivers.emplace(in.index,
                      kept != receivers_.end() ? std::move(kept->second) : makeReceiver(in.index));
    receivers.at(in.index).setPeer(in.index);
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
  ChunkReceiver& in = receivers_.at(*from);
  if (h.kind == wire::Kind::Estimate) in.countWhole(h.payloadBytes);
  // The sender's chunks and its HELLO or BYE come in order on one
  // connection: one saying no estimate is under way, while we still wait for
  // part of one, means that part was lost (the connection dropped it).
  if (h.kind == wire::Kind::Bye ||
      (h.kind == wire::Kind::Hello && (h.flags & wire::kHelloSending) == 0)) {
    if (const auto cut = in.endOfSending("the sender sends no more of it"))
      reject(*from, cut->reason, cut->detail);
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
  const std::span bytes(static_cast<const std::byte*>(payload.data()), payload.size());
  return counted(from, receivers_.at(from).take(h, bytes, options_.expect, now));
}

std::optional<std::variant<Inbound, Rejected>> Transport::counted(std::size_t from,
                                                                  ChunkReceiver::Outcome outcome) {
  if (outcome.cutOff) reject(from, outcome.cutOff->reason, outcome.cutOff->detail);
  if (outcome.refused) return reject(from, outcome.refused->reason, outcome.refused->detail);
  const bool partial = outcome.owner == nullptr;
  return Inbound{from, outcome.header, partial, std::move(outcome.owner), outcome.bytes};
}

// A neighbour's messages from another connection (it restarted, or
// reconnected): what the old one was sending will not go on, and READY
// must go to the new one.
void Transport::noteRoutingId(std::size_t peer, const std::string& routingId) {
  if (const auto cut = receivers_.at(peer).heardOn(routingId, chunked_))
    reject(peer, cut->reason, cut->detail);
}

void Transport::sendReady(ChunkReceiver& in) {
  wire::Header h = header(wire::Kind::Ready, in.delivered());
  h.flags = in.grant();
  reply(in, h);
}

void Transport::reply(ChunkReceiver& in, const wire::Header& h) {
  if (in.routingId().empty()) return;  // not heard yet: no connection to answer on
  wire::Header spoken = h;
  dialect_.speak(spoken, in.peer());
  const auto bytes = wire::encode(spoken);
  // Dropped by ZeroMQ if that connection is gone or full; restated later.
  if (!router_.send(zmq::buffer(in.routingId()),
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
  for (auto& [peer, in] : receivers_)
    if (in.offer(chunked_, grants_, now)) sendReady(in);
}

Inflow Transport::inflow(std::size_t peer) const {
  const auto it = receivers_.find(peer);
  return it != receivers_.end() ? it->second.flow() : Inflow{};
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
