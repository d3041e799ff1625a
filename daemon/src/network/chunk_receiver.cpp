#include "network/chunk_receiver.hpp"

#include <algorithm>
#include <cstring>

#include "os/resident.hpp"

namespace consensusd::daemon {

ChunkReceiver::ChunkReceiver(std::size_t peer, std::size_t estimateBytes, bool preallocate)
    : peer_(peer), estimateBytes_(estimateBytes) {
  if (preallocate) {  // the neighbour's buffer, resident now rather than in the first round
    buffer_ = std::shared_ptr<std::byte[]>(new std::byte[estimateBytes_]);
    makeResident({buffer_.get(), estimateBytes_});
  }
}

ChunkReceiver::Outcome ChunkReceiver::take(const wire::Header& h,
                                           std::span<const std::byte> payload,
                                           const wire::Expectation& expect, consensus::Time now) {
  Outcome out;
  const auto round = [](std::int64_t r) { return "round " + std::to_string(r); };
  if (h.offset == 0) {
    if (round_) out.cutOff = abandon(round(*round_) + " gave way to " + round(h.round));
    grant_ = 0;  // used (or ignored): a new one once the buffer is free again
    if (buffer_ && buffer_.use_count() > 1) {
      dropping_ = h.round;
      out.refused = Refusal{wire::Reject::Overrun, round(h.round) + " before our READY"};
      return out;
    }
    dropping_.reset();
    if (!buffer_)  // a sender that splits a small estimate
      buffer_ = std::shared_ptr<std::byte[]>(new std::byte[estimateBytes_]);
    round_ = h.round;
    received_ = 0;
    header_ = h;
    firstAt_ = now;
  } else if (!round_ || *round_ != h.round || h.offset != received_ || h.dtype != header_.dtype) {
    if (dropping_ == h.round) {
      out.refused = Refusal{wire::Reject::Overrun, ""};
      return out;
    }
    // A gap in the estimate being received: it can never be whole.
    if (round_ && *round_ == h.round) abandon("");
    out.refused =
        Refusal{wire::Reject::ChunkOrder, round(h.round) + " at byte " + std::to_string(h.offset)};
    return out;
  }
  std::memcpy(buffer_.get() + h.offset, payload.data(), payload.size());
  received_ += payload.size();
  flow_.bytes += payload.size();
  const std::uint64_t total = expect.totalBytes(header_.dtype);
  out.header = h;
  if (received_ < total) return out;
  // Whole: the mailbox keeps it in the buffer, which stays ours to fill
  // again once every holder has let go.
  out.header = header_;
  out.header.payloadBytes = total;
  round_.reset();
  delivered_ = std::max(delivered_, out.header.round);
  flow_.transfer = now - firstAt_;
  out.owner = std::shared_ptr<const void>(buffer_, buffer_.get());
  out.bytes = {buffer_.get(), total};
  return out;
}

std::optional<ChunkReceiver::Refusal> ChunkReceiver::abandon(const std::string& why) {
  if (!round_) return std::nullopt;
  round_.reset();
  received_ = 0;
  grant_ = 0;
  return Refusal{wire::Reject::Truncated, why};
}

std::optional<ChunkReceiver::Refusal> ChunkReceiver::endOfSending(const std::string& why) {
  return round_ ? abandon("round " + std::to_string(*round_) + ": " + why) : std::nullopt;
}

std::optional<ChunkReceiver::Refusal> ChunkReceiver::heardOn(const std::string& routingId,
                                                             bool chunked) {
  if (routingId_ == routingId) return std::nullopt;
  const bool changed = !routingId_.empty();
  routingId_ = routingId;
  if (!chunked || !changed) return std::nullopt;
  std::optional<Refusal> cut = endOfSending("the sender reconnected");
  grant_ = 0;  // offered again, on the new connection
  return cut;
}

std::optional<std::uint64_t> ChunkReceiver::offer(bool chunked, std::mt19937_64& grants,
                                                  consensus::Time now) {
  if (now - windowStart_ >= std::chrono::seconds(1)) {  // the rate, over a second or more
    flow_.bytesPerSecond = static_cast<double>(flow_.bytes - windowBytes_) /
                           std::chrono::duration<double>(now - windowStart_).count();
    windowBytes_ = flow_.bytes;
    windowStart_ = now;
  }
  if (!chunked) return std::nullopt;
  // READY goes back on the connection the neighbour speaks on: none until it spoke.
  const bool free = !round_ && (!buffer_ || buffer_.use_count() == 1);
  if (!free || grant_ != 0 || routingId_.empty()) return std::nullopt;
  grant_ = std::uniform_int_distribution<std::uint64_t>(1)(grants);
  return grant_;
}

}  // namespace consensusd::daemon
