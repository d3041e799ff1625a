// The payload checksum (CRC-32C, wire::checksum) against reading and writing
// the same bytes with memcpy, in the same run: "checksum at memory speed" is
// checksum / memcpy bytes per second near 1.
//
//   build/release/tests/wire_bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "consensusd/daemon/wire.hpp"

namespace {

void sizes(benchmark::internal::Benchmark* b) {
  for (const std::int64_t bytes : {64 << 10, 1 << 20, 16 << 20}) b->Arg(bytes);
}

void checksum(benchmark::State& state) {
  std::vector<unsigned char> payload(static_cast<std::size_t>(state.range(0)), 0x5a);
  for (auto _ : state)
    benchmark::DoNotOptimize(consensusd::wire::checksum(payload.data(), payload.size()));
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

void memoryCopy(benchmark::State& state) {
  std::vector<unsigned char> from(static_cast<std::size_t>(state.range(0)), 0x5a);
  std::vector<unsigned char> to(from.size());
  for (auto _ : state) {
    std::memcpy(to.data(), from.data(), from.size());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

}  // namespace

BENCHMARK(checksum)->Apply(sizes);
BENCHMARK(memoryCopy)->Apply(sizes);
BENCHMARK_MAIN();
