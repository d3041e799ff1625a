// The transport's sending side (transport.hpp): estimates to every
// out-neighbour through its queue, whole or in chunks on its READY,
// controls and keep-alives, what neighbours answer on our DEALERs, and
// sending again to one that comes back. Sockets, receiving and polling are
// transport.cpp.

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <zmq_addon.hpp>

#include "network/transport.hpp"

namespace consensusd::daemon {
namespace {

using consensus::Time;

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

}  // namespace

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
    if (in.grant() != 0) sendReady(in);  // restated: the same grant
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

bool Transport::sending() const {
  if (unsent_->load(std::memory_order_acquire) > 0) return true;  // in ZeroMQ's queues
  for (const auto& [node, link] : links_)
    if (link.sending || !link.controls.empty() || (link.estimate && (!chunked_ || link.grant)))
      return true;
  return false;
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

}  // namespace consensusd::daemon
