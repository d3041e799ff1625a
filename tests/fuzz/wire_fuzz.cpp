// Fuzz target: the wire decoder and validator on arbitrary bytes (the first
// 64 are the header frame, the rest the payload). Nothing may crash, and a
// header that decodes is validated against itself so the payload checks run.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "wire.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace consensusd;
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  const std::size_t headerBytes = std::min(size, wire::kHeaderSize);
  const auto decoded = wire::decodeHeader({bytes, headerBytes});
  if (const auto* header = std::get_if<wire::Header>(&decoded)) {
    const wire::Expectation expect{header->topologyHash, header->dimension, header->dtype};
    [[maybe_unused]] const auto why =
        wire::validate(*header, {bytes + headerBytes, size - headerBytes}, expect);
  }
  return 0;
}
