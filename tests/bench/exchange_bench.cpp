// The two rates the round-efficiency reference is built from (docs/design.md §12),
// measured on this machine in the same run as the daemons (scripts/bench-rounds):
//   B_x: raw ZeroMQ TCP loopback throughput, DEALER -> ROUTER as in the daemon,
//        zero-copy sends of one message size;
//   B_m: the fused weighted average of k vectors on both cores at once.
#include <benchmark/benchmark.h>

#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "consensusd/consensus/mixing.hpp"

namespace {

using consensusd::consensus::fusedMix;
using consensusd::consensus::MixInput;

constexpr std::int64_t kBatchBytes = 256 << 20;  // per timed iteration

void zmqLoopback(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const int batch = static_cast<int>(std::max<std::int64_t>(4, kBatchBytes / state.range(0)));
  zmq::context_t context(1);
  zmq::socket_t router(context, zmq::socket_type::router);
  router.set(zmq::sockopt::rcvhwm, 64);
  router.bind("tcp://127.0.0.1:*");
  const std::string endpoint = router.get(zmq::sockopt::last_endpoint);
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::routing_id, "sender");
  dealer.set(zmq::sockopt::sndhwm, 8);
  dealer.connect(endpoint);
  zmq::socket_t ack(context, zmq::socket_type::pair);
  ack.bind("inproc://ack");

  // The receiver answers once per batch; one message of the sender first connects them.
  std::thread receiver([&context, &router, batch] {
    zmq::socket_t done(context, zmq::socket_type::pair);
    done.connect("inproc://ack");
    std::vector<zmq::message_t> frames;
    for (;;) {
      for (int i = 0; i < batch; ++i) {
        frames.clear();
        if (!zmq::recv_multipart(router, std::back_inserter(frames))) return;
        if (frames.size() == 2 && frames[1].size() == 0) return;  // the stop message
      }
      done.send(zmq::str_buffer("batch"));
    }
  });

  std::vector<float> payload(bytes / sizeof(float), 1.0f);
  const auto send = [&](std::size_t size) {
    zmq::message_t message(payload.data(), size, nullptr, nullptr);  // zero-copy, no free
    dealer.send(message, zmq::send_flags::none);
  };
  zmq::message_t reply;
  for (auto _ : state) {
    for (int i = 0; i < batch; ++i) send(bytes);
    [[maybe_unused]] const auto got = ack.recv(reply);
  }
  send(0);
  receiver.join();
  state.SetBytesProcessed(state.iterations() * batch * static_cast<std::int64_t>(bytes));
}

void fusedAverage(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0)) / sizeof(float);
  const auto k = static_cast<std::size_t>(state.range(1));
  std::vector<std::vector<float>> neighbours(k, std::vector<float>(n, 0.5f));
  std::vector<float> self(n, 1.0f), out(n);
  std::vector<MixInput> inputs;
  for (const auto& v : neighbours) inputs.push_back({v.data(), 1.0 / static_cast<double>(k + 1)});
  for (auto _ : state) {
    fusedMix(self.data(), 1.0 / static_cast<double>(k + 1), inputs, out.data(), n);
    benchmark::DoNotOptimize(out.data());
  }
  // Traffic: every input and self read once, the output written once.
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>((k + 2) * n * 4));
}

void sizes(benchmark::internal::Benchmark* b, bool withDegree) {
  for (const std::int64_t size : {64LL << 10, 1LL << 20, 16LL << 20, 64LL << 20}) {
    if (!withDegree) {
      b->Arg(size);
      continue;
    }
    for (const std::int64_t k : {2, 4}) b->Args({size, k});
  }
}

}  // namespace

BENCHMARK(zmqLoopback)->Apply([](auto* b) { sizes(b, false); }) -> UseRealTime();
BENCHMARK(fusedAverage)->Apply([](auto* b) { sizes(b, true); }) -> Threads(2) -> UseRealTime();
BENCHMARK_MAIN();
