// Fuzz target: the checkpoint file parser, matched against the two shapes the
// seed corpus holds (6 float32 or 3 float64 values of node 2). Nothing may
// crash; a file that parses has exactly the expected sizes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "consensusd/daemon/checkpoint.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace consensusd;
  for (const auto& [dtype, dimension] : {std::pair{wire::Dtype::Float32, std::uint64_t{6}},
                                         std::pair{wire::Dtype::Float64, std::uint64_t{3}}}) {
    daemon::Checkpoint expect;
    expect.topologyHash = 0x0123456789abcdef;
    expect.nodeId = "n2";
    expect.node = 2;
    expect.dtype = dtype;
    expect.dimension = dimension;
    const auto parsed =
        daemon::parseCheckpoint({reinterpret_cast<const std::byte*>(data), size}, expect);
    if (const auto* checkpoint = std::get_if<daemon::Checkpoint>(&parsed)) {
      if (checkpoint->params.size() != 24 ||
          (!checkpoint->velocity.empty() && checkpoint->velocity.size() != 24))
        std::abort();
    }
  }
  return 0;
}
