// The payload checksum (CRC-32C, wire::checksum) and a received estimate's
// whole check (wire::validate: checksum and finiteness in one pass) on every
// path this CPU has (portable table, three SSE4.2 crc32 streams, VPCLMULQDQ
// folding), against reading and writing the same bytes with memcpy, in the
// same run: "checksum at memory speed" is checksum / memcpy bytes per second
// near 1, and validate / checksum near 1 says finiteness costs no second pass.
//
//   build/release/tests/wire_bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "consensusd/daemon/wire.hpp"

namespace {

void sizes(benchmark::internal::Benchmark* b) {
  for (const std::int64_t bytes : {64 << 10, 1 << 20, 16 << 20}) b->Arg(bytes);
}

void checksum(benchmark::State& state, consensusd::wire::CrcPath path) {
  consensusd::wire::useCrcPath(path);
  std::vector<unsigned char> payload(static_cast<std::size_t>(state.range(0)), 0x5a);
  for (auto _ : state)
    benchmark::DoNotOptimize(consensusd::wire::checksum(payload.data(), payload.size()));
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

void validate(benchmark::State& state, consensusd::wire::CrcPath path) {
  namespace wire = consensusd::wire;
  wire::useCrcPath(path);
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<float> values(bytes / 4, 0.5f);
  const std::span payload(reinterpret_cast<const std::byte*>(values.data()), bytes);
  wire::Header header;
  header.kind = wire::Kind::Estimate;
  header.dimension = values.size();
  header.payloadBytes = bytes;
  header.checksum = wire::checksum(payload.data(), bytes);
  const wire::Expectation expect{0, values.size(), wire::Dtype::Float32};
  for (auto _ : state) benchmark::DoNotOptimize(wire::validate(header, payload, expect));
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

int main(int argc, char** argv) {
  namespace wire = consensusd::wire;
  const char* const names[] = {"portable", "sse42", "folding"};
  for (const wire::CrcPath path : wire::crcPaths()) {
    const std::string name = names[static_cast<int>(path)];
    benchmark::RegisterBenchmark(("checksum/" + name).c_str(), checksum, path)->Apply(sizes);
    benchmark::RegisterBenchmark(("validate/" + name).c_str(), validate, path)->Apply(sizes);
  }
  benchmark::RegisterBenchmark("memoryCopy", memoryCopy)->Apply(sizes);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
