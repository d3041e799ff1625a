#include "wire.hpp"

#include <zlib.h>

#include <cmath>
#include <cstring>

namespace consensusd::wire {
namespace {

template <class T>
void put(std::array<std::byte, kHeaderSize>& out, std::size_t at, T value) {
  using U = std::make_unsigned_t<T>;
  auto bits = static_cast<U>(value);
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    out[at + i] = static_cast<std::byte>(bits & 0xffu);
    bits = static_cast<U>(bits >> 8);
  }
}

template <class T>
T get(std::span<const std::byte> in, std::size_t at) {
  using U = std::make_unsigned_t<T>;
  U bits = 0;
  for (std::size_t i = sizeof(T); i-- > 0;)
    bits = static_cast<U>((bits << 8) | std::to_integer<U>(in[at + i]));
  return static_cast<T>(bits);
}

template <class Scalar>
bool allFinite(std::span<const std::byte> payload) {
  // memcpy: a frame's bytes need not be aligned for Scalar (compiles to plain loads).
  for (std::size_t at = 0; at + sizeof(Scalar) <= payload.size(); at += sizeof(Scalar)) {
    Scalar value;
    std::memcpy(&value, payload.data() + at, sizeof(Scalar));
    if (!std::isfinite(value)) return false;
  }
  return true;
}

}  // namespace

std::size_t bytesPer(Dtype dtype) {
  return dtype == Dtype::Float64 ? 8 : 4;
}

std::uint32_t checksum(const void* data, std::size_t bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* at = static_cast<const Bytef*>(data);
  while (bytes > 0) {
    const auto chunk = static_cast<uInt>(std::min<std::size_t>(bytes, 1u << 30));
    crc = crc32(crc, at, chunk);
    at += chunk;
    bytes -= chunk;
  }
  return static_cast<std::uint32_t>(crc);
}

std::array<std::byte, kHeaderSize> encode(const Header& header) {
  std::array<std::byte, kHeaderSize> out{};
  put(out, 0, kMagic);
  put(out, 4, kVersion);
  put(out, 6, static_cast<std::uint8_t>(header.kind));
  put(out, 7, static_cast<std::uint8_t>(header.dtype));
  put(out, 8, header.sender);
  put(out, 12, header.checksum);
  put(out, 16, header.round);
  put(out, 24, header.dimension);
  put(out, 32, header.topologyHash);
  put(out, 40, header.sentNs);
  put(out, 48, header.payloadBytes);
  put(out, 56, header.flags);
  return out;
}

std::variant<Header, Reject> decodeHeader(std::span<const std::byte> frame) {
  if (frame.size() != kHeaderSize) return Reject::Size;
  if (get<std::uint32_t>(frame, 0) != kMagic) return Reject::Magic;
  if (get<std::uint16_t>(frame, 4) != kVersion) return Reject::Version;
  const auto kind = get<std::uint8_t>(frame, 6);
  if (kind < 1 || kind > 4) return Reject::Kind;
  const auto dtype = get<std::uint8_t>(frame, 7);
  if (dtype != 1 && dtype != 2) return Reject::Dtype;
  Header header;
  header.kind = static_cast<Kind>(kind);
  header.dtype = static_cast<Dtype>(dtype);
  header.sender = get<std::uint32_t>(frame, 8);
  header.checksum = get<std::uint32_t>(frame, 12);
  header.round = get<std::int64_t>(frame, 16);
  header.dimension = get<std::uint64_t>(frame, 24);
  header.topologyHash = get<std::uint64_t>(frame, 32);
  header.sentNs = get<std::int64_t>(frame, 40);
  header.payloadBytes = get<std::uint64_t>(frame, 48);
  header.flags = get<std::uint64_t>(frame, 56);
  return header;
}

std::optional<Reject> validate(const Header& header, std::span<const std::byte> payload,
                               const Expectation& expect) {
  if (header.topologyHash != expect.topologyHash) return Reject::Topology;
  if (header.dtype != expect.dtype) return Reject::Dtype;
  if (header.dimension != expect.dimension) return Reject::Dimension;
  if (header.kind != Kind::Estimate)
    return payload.empty() ? std::nullopt : std::optional(Reject::Length);
  if (header.round < 0) return Reject::Stale;
  if (payload.size() != header.payloadBytes ||
      payload.size() != expect.dimension * bytesPer(expect.dtype)) {
    return Reject::Length;
  }
  if (checksum(payload.data(), payload.size()) != header.checksum) return Reject::Checksum;
  const bool finite =
      expect.dtype == Dtype::Float64 ? allFinite<double>(payload) : allFinite<float>(payload);
  if (!finite) return Reject::NonFinite;
  return std::nullopt;
}

const char* toString(Reject reason) {
  switch (reason) {
    case Reject::Frames:
      return "frames";
    case Reject::Size:
      return "header_size";
    case Reject::Magic:
      return "magic";
    case Reject::Version:
      return "version";
    case Reject::Kind:
      return "kind";
    case Reject::Sender:
      return "sender";
    case Reject::NotNeighbor:
      return "not_neighbor";
    case Reject::Topology:
      return "topology";
    case Reject::Dtype:
      return "dtype";
    case Reject::Dimension:
      return "dimension";
    case Reject::Length:
      return "length";
    case Reject::Checksum:
      return "checksum";
    case Reject::NonFinite:
      return "non_finite";
    case Reject::Stale:
      return "stale";
    case Reject::Duplicate:
      return "duplicate";
    case Reject::Handshake:
      return "handshake";
  }
  return "?";
}

}  // namespace consensusd::wire
