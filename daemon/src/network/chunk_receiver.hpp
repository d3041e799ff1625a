#pragma once
// One in-neighbour's side of the estimates it sends us (docs/protocol.md,
// "Estimates in chunks"): an estimate of several chunks is assembled in one
// buffer, in order, and handed out in place (the engine's mailbox keeps it;
// the buffer is ours to fill again once every holder let go); READY offers
// that buffer, on the connection the neighbour speaks on; the bytes and the
// rate that came. No sockets: the transport sends what this decides.

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>

#include "consensusd/consensus/round_engine.hpp"
#include "consensusd/daemon/wire.hpp"

namespace consensusd::daemon {

// What arrives from one in-neighbour, for status and metrics.
struct Inflow {
  std::uint64_t bytes = 0;         // estimate payload received (every valid chunk)
  double bytesPerSecond = 0;       // over the last second or more
  consensus::Duration transfer{};  // its last estimate of several chunks: first chunk to last
};

class ChunkReceiver {
 public:
  // `estimateBytes`: the largest whole estimate; `preallocate`: the buffer
  // made (and resident) now rather than at the first chunk.
  ChunkReceiver(std::size_t peer, std::size_t estimateBytes, bool preallocate);

  // Why a chunk or the estimate it belonged to was refused (a reject to count).
  struct Refusal {
    wire::Reject reason;
    std::string detail;
  };
  // What one chunk did. `cutOff`: a half-received estimate it ended. Then
  // `refused`, or the estimate whole (`owner` and `bytes` set, `header`
  // the estimate's), or a part of it (nothing to mix).
  struct Outcome {
    std::optional<Refusal> cutOff;
    std::optional<Refusal> refused;
    wire::Header header;
    std::shared_ptr<const void> owner;
    std::span<const std::byte> bytes;
  };
  // A chunk `h` of an estimate (checked against `expect` already).
  Outcome take(const wire::Header& h, std::span<const std::byte> payload,
               const wire::Expectation& expect, consensus::Time now);
  // A whole estimate of `bytes` that came in one message.
  void countWhole(std::uint64_t bytes) { flow_.bytes += bytes; }
  // The sender says it sends no more of the estimate under way (`why`):
  // the half received, if any, is dropped.
  std::optional<Refusal> endOfSending(const std::string& why);
  // Its messages come from connection `routingId`: on a new one (it
  // restarted or reconnected) what the old one was sending will not go on,
  // and READY goes to the new one.
  std::optional<Refusal> heardOn(const std::string& routingId, bool chunked);

  // A new READY grant once the buffer is free and the neighbour has spoken
  // (none if one is out); the rate over the last second or more, updated.
  std::optional<std::uint64_t> offer(bool chunked, std::mt19937_64& grants, consensus::Time now);

  std::size_t peer() const { return peer_; }
  void setPeer(std::size_t peer) { peer_ = peer; }
  const std::string& routingId() const { return routingId_; }
  std::uint64_t grant() const { return grant_; }         // the READY out; 0: none
  std::int64_t delivered() const { return delivered_; }  // newest round received whole
  const Inflow& flow() const { return flow_; }

 private:
  // A half-received estimate that can never be finished: dropped, and the
  // sender told to send again (a new READY once the buffer is free).
  std::optional<Refusal> abandon(const std::string& why);

  std::size_t peer_;  // topology index
  std::size_t estimateBytes_;
  std::string routingId_;  // the connection a READY goes back on
  std::shared_ptr<std::byte[]> buffer_;
  std::optional<std::int64_t> round_;  // the estimate being received
  std::uint64_t received_ = 0;         // its bytes so far
  wire::Header header_{};              // its first chunk's
  consensus::Time firstAt_{};
  std::optional<std::int64_t> dropping_;  // chunks of this round are overrun: dropped
  std::uint64_t grant_ = 0;               // the READY offered; 0: none since the last estimate
  std::int64_t delivered_ = -1;
  Inflow flow_;
  std::uint64_t windowBytes_ = 0;  // flow_.bytes at windowStart_
  consensus::Time windowStart_{};
};

}  // namespace consensusd::daemon
