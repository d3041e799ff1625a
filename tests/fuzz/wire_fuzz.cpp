// Fuzz target: the wire decoder and validator on arbitrary bytes (the first
// 64 are the header frame, the rest the payload). Nothing may crash. A header
// that decodes is validated twice: as sent, and with its length, dimension
// and checksum made to fit the payload, so that the non-finite scan (which
// sits behind the CRC) sees arbitrary payloads too.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "consensusd/daemon/wire.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace consensusd;
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  const std::size_t headerBytes = std::min(size, wire::kHeaderSize);
  const std::span<const std::byte> payload{bytes + headerBytes, size - headerBytes};
  const auto decoded = wire::decodeHeader({bytes, headerBytes});
  const auto* header = std::get_if<wire::Header>(&decoded);
  if (header == nullptr) return 0;
  const wire::Expectation expect{header->topologyHash, header->dimension, header->dtype};
  [[maybe_unused]] const auto asSent = wire::validate(*header, payload, expect);

  wire::Header fitted = *header;
  fitted.kind = wire::Kind::Estimate;
  fitted.round = std::max<std::int64_t>(fitted.round, 0);
  fitted.payloadBytes = payload.size() - payload.size() % wire::bytesPer(fitted.dtype);
  fitted.dimension = fitted.payloadBytes / wire::bytesPer(fitted.dtype);
  const auto values = payload.first(fitted.payloadBytes);
  fitted.checksum = wire::checksum(values.data(), values.size());
  const auto why = wire::validate(
      fitted, values, wire::Expectation{fitted.topologyHash, fitted.dimension, fitted.dtype});
  // Only the scan can refuse it now.
  if (why && *why != wire::Reject::NonFinite) std::abort();
  return 0;
}
