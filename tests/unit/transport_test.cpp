// The daemon's transport on its own: two nodes over ipc:// sockets in a
// temporary folder, and raw ZeroMQ peers for what an honest node never sends.

#include "network/transport.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "consensusd/topology/yaml_io.hpp"
#include "process.hpp"

using namespace consensusd;
using consensusd::daemon::Inbound;
using consensusd::daemon::Rejected;
using consensusd::daemon::Transport;
using consensusd::testing::TempDir;
using std::chrono_literals::operator""ms;

namespace {

constexpr std::size_t kDimension = 4;
// In chunks: 40 float32 values in chunks of 16 bytes (4 values).
constexpr std::size_t kChunkedDimension = 40;
constexpr std::size_t kChunk = 16;

struct Pair {
  TempDir dir;
  topology::Topology topology = topology::parseTopology(
      "nodes:\n"
      "  - {id: a, endpoint: \"ipc://" +
          dir.path() +
          "/a\"}\n"
          "  - {id: b, endpoint: \"ipc://" +
          dir.path() +
          "/b\"}\n"
          "edges:\n"
          "  - [a, b]\n",
      "pair.yaml");

  daemon::TransportOptions options(std::size_t node, std::size_t dimension = kDimension) const {
    daemon::TransportOptions o;
    o.bind = topology.node(node).endpoint;
    o.expect = {topology.hash(), dimension, wire::Dtype::Float32};
    o.chunkBytes = kChunk;
    o.peerTimeout = std::chrono::seconds(5);
    o.staleness = 2;
    return o;
  }
};

// Polls every transport until `node` has a message (or a reject) to hand
// out, serving the others' queues meanwhile; fails after five seconds.
std::variant<Inbound, Rejected> next(std::vector<Transport*> transports, Transport& node,
                                     consensus::Time now = {}) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    if (auto got = node.receive(now)) return std::move(*got);
    for (Transport* t : transports) {
      t->offerBuffers(now);
      std::vector<zmq::pollitem_t> items;
      t->append(items);
      zmq::poll(items, 20ms);
      t->serve(items, now);
    }
  }
  FAIL("no message within 5 s");
  return Rejected{};
}

std::shared_ptr<const std::vector<float>> values(float fill, std::size_t dimension = kDimension) {
  auto v = std::make_shared<std::vector<float>>(dimension, fill);
  for (std::size_t i = 0; i < dimension; ++i)
    (*v)[i] += static_cast<float>(i);  // each chunk differs
  return v;
}

void publish(Transport& t, std::int64_t round, float fill, std::size_t dimension = kDimension,
             consensus::Time now = {}) {
  auto payload = values(fill, dimension);
  const std::span bytes = std::as_bytes(std::span(*payload));
  t.publish(round, std::move(payload), bytes, now);
}

// A raw DEALER with any routing id: a peer that may lie about anything.
struct RawPeer {
  zmq::context_t context;
  zmq::socket_t dealer{context, zmq::socket_type::dealer};
  RawPeer(const std::string& routingId, const std::string& endpoint) {
    dealer.set(zmq::sockopt::routing_id, routingId);
    dealer.set(zmq::sockopt::linger, 0);
    dealer.connect(endpoint);
  }
  void send(const wire::Header& header, const std::vector<float>& payload) {
    const auto bytes = wire::encode(header);
    dealer.send(zmq::buffer(bytes), zmq::send_flags::sndmore);
    dealer.send(zmq::buffer(payload));
  }
};

wire::Header estimateFrom(const Pair& pair, std::uint32_t sender, const std::vector<float>& v) {
  wire::Header h;
  h.kind = wire::Kind::Estimate;
  h.sender = sender;
  h.round = 1;
  h.dimension = kDimension;
  h.topologyHash = pair.topology.hash();
  h.payloadBytes = v.size() * sizeof(float);
  h.checksum = wire::checksum(v.data(), h.payloadBytes);
  return h;
}

// A reject's reason by name (doctest prints strings, not enums).
std::string reason(const std::variant<Inbound, Rejected>& got) {
  return wire::toString(std::get<Rejected>(got).reason);
}

}  // namespace

TEST_CASE("transport: an estimate arrives whole, and the engine's receipt is counted") {
  Pair pair;
  Transport a(pair.topology, 0, pair.options(0));
  Transport b(pair.topology, 1, pair.options(1));
  publish(a, 7, 0.25f);
  auto got = next({&a, &b}, b);
  REQUIRE(std::holds_alternative<Inbound>(got));
  const Inbound& message = std::get<Inbound>(got);
  CHECK(message.from == 0);
  CHECK(message.header.round == 7);
  CHECK(message.header.kind == wire::Kind::Estimate);
  REQUIRE(message.payload.size() == kDimension * sizeof(float));
  CHECK(reinterpret_cast<const float*>(message.payload.data())[3] == 3.25f);

  CHECK(b.counters().accepted == 0);  // until the engine has seen it
  b.settle(message, consensus::Receipt::Stored, consensus::Time{});
  CHECK(b.counters().accepted == 1);
  b.settle(message, consensus::Receipt::Stale, consensus::Time{});
  b.settle(message, consensus::Receipt::Duplicate, consensus::Time{});
  CHECK(b.counters().discards() ==
        std::map<std::string, std::uint64_t>{{"duplicate", 1}, {"stale", 1}});
  // An implausible round is a reject from that neighbour, not an accepted message.
  b.settle(message, consensus::Receipt::Implausible, consensus::Time{});
  CHECK(b.counters().accepted == 3);
  CHECK(b.counters().rejects() == std::map<std::string, std::uint64_t>{{"implausible_round", 1}});
  CHECK(b.counters().rejectedFrom.at(0) == 1);
}

TEST_CASE("transport: a stranger, a forged sender and a bad checksum are typed rejects") {
  Pair pair;
  Transport b(pair.topology, 1, pair.options(1));
  const std::vector<float> v(kDimension, 1.0f);

  RawPeer stranger("mallory/0", pair.topology.node(1).endpoint);
  stranger.send(estimateFrom(pair, 0, v), v);
  auto got = next({&b}, b);
  REQUIRE(std::holds_alternative<Rejected>(got));
  CHECK_FALSE(std::get<Rejected>(got).from.has_value());
  CHECK(reason(got) == wire::toString(wire::Reject::NotNeighbor));

  RawPeer a("a/1", pair.topology.node(1).endpoint);
  a.send(estimateFrom(pair, 1, v), v);  // says it is b
  got = next({&b}, b);
  REQUIRE(std::holds_alternative<Rejected>(got));
  CHECK(std::get<Rejected>(got).from == std::optional<std::size_t>(0));
  CHECK(reason(got) == wire::toString(wire::Reject::Sender));

  wire::Header corrupt = estimateFrom(pair, 0, v);
  corrupt.checksum ^= 1;
  a.send(corrupt, v);
  got = next({&b}, b);
  REQUIRE(std::holds_alternative<Rejected>(got));
  CHECK(reason(got) == wire::toString(wire::Reject::Checksum));

  a.send(estimateFrom(pair, 0, v), v);  // the same neighbour, honest now
  got = next({&b}, b);
  CHECK(std::holds_alternative<Inbound>(got));
  CHECK(b.counters().rejects() ==
        std::map<std::string, std::uint64_t>{{"checksum", 1}, {"not_neighbor", 1}, {"sender", 1}});
  CHECK(b.counters().rejectedFrom.at(0) == 2);
}

TEST_CASE("transport: with no room, the newest estimate waits and controls stay bounded") {
  Pair pair;
  Transport a(pair.topology, 0, pair.options(0));  // b never binds: no connection, no room
  publish(a, 1, 1.0f);
  publish(a, 2, 2.0f);
  const auto sends = a.counters().sendEvents();
  CHECK(sends.at("deferred") == 2);
  CHECK(sends.at("superseded") == 1);  // round 1 replaced by round 2 before it left
  for (int i = 0; i < 70; ++i)
    a.sendControl(wire::Kind::Decision, i, 1, std::nullopt, consensus::Time{});
  CHECK(a.counters().sendEvents().at("dropped") == 70 - 64);
  // At most one HELLO waits: the next keep-alive does not queue another.
  a.keepAlive(0, consensus::Time{});
  a.keepAlive(1, consensus::Time{});
  CHECK(a.counters().sendEvents().at("dropped") == 70 - 64 + 1);
}

TEST_CASE("transport: the estimate that waited goes out once the neighbour binds") {
  Pair pair;
  Transport a(pair.topology, 0, pair.options(0));
  publish(a, 3, 3.0f);
  Transport b(pair.topology, 1, pair.options(1));
  auto got = next({&a, &b}, b);
  REQUIRE(std::holds_alternative<Inbound>(got));
  CHECK(std::get<Inbound>(got).header.round == 3);
}

TEST_CASE("transport: a neighbour heard for the first time gets our estimate again") {
  Pair pair;
  Transport a(pair.topology, 0, pair.options(0));
  Transport b(pair.topology, 1, pair.options(1));
  publish(a, 5, 5.0f);
  auto first = next({&a, &b}, b);
  REQUIRE(std::holds_alternative<Inbound>(first));

  // b speaks; a hears it for the first time and sends round 5 again: b may
  // have started after it was sent, or restarted since.
  b.keepAlive(0, consensus::Time{});
  auto hello = next({&a, &b}, a);
  REQUIRE(std::holds_alternative<Inbound>(hello));
  CHECK(std::get<Inbound>(hello).header.kind == wire::Kind::Hello);
  a.settle(std::get<Inbound>(hello), consensus::Receipt::Stored, consensus::Time{});
  auto again = next({&a, &b}, b);
  REQUIRE(std::holds_alternative<Inbound>(again));
  CHECK(std::get<Inbound>(again).header.round == 5);
}

namespace {

// The next whole estimate (or reject) at `node`, skipping the chunks of
// one still arriving (`partials` counts those) and keep-alives.
std::variant<Inbound, Rejected> nextWhole(std::vector<Transport*> transports, Transport& node,
                                          int* partials = nullptr, consensus::Time now = {}) {
  for (;;) {
    auto got = next(transports, node, now);
    const auto* inbound = std::get_if<Inbound>(&got);
    if (inbound == nullptr || (!inbound->partial && inbound->header.kind == wire::Kind::Estimate))
      return got;
    if (partials != nullptr && inbound->partial) ++*partials;
  }
}

const float* floats(const Inbound& message) {
  return reinterpret_cast<const float*>(message.payload.data());
}

// One chunk of a chunked estimate, as a raw peer sends it.
wire::Header chunkFrom(const Pair& pair, std::int64_t round, std::size_t offset,
                       const std::vector<float>& chunk) {
  wire::Header h;
  h.kind = wire::Kind::Estimate;
  h.sender = 0;
  h.round = round;
  h.dimension = kChunkedDimension;
  h.topologyHash = pair.topology.hash();
  h.offset = offset;
  h.payloadBytes = chunk.size() * sizeof(float);
  h.checksum = wire::checksum(chunk.data(), h.payloadBytes);
  return h;
}

}  // namespace

TEST_CASE("transport: an estimate of several chunks arrives whole, in the neighbour's buffer") {
  Pair pair;
  Transport a(pair.topology, 0, pair.options(0, kChunkedDimension));
  Transport b(pair.topology, 1, pair.options(1, kChunkedDimension));
  REQUIRE(a.chunked());
  publish(a, 3, 0.5f, kChunkedDimension);
  a.keepAlive(0, {});  // b answers READY on the connection it hears a on
  int partials = 0;
  auto got = nextWhole({&a, &b}, b, &partials);
  REQUIRE(std::holds_alternative<Inbound>(got));
  const Inbound& whole = std::get<Inbound>(got);
  CHECK(partials == 9);  // ten chunks of four values: nine signs of life, then the estimate
  CHECK(whole.header.round == 3);
  CHECK(whole.header.offset == 0);
  REQUIRE(whole.payload.size() == kChunkedDimension * sizeof(float));
  for (std::size_t i = 0; i < kChunkedDimension; ++i)
    CHECK(floats(whole)[i] == 0.5f + static_cast<float>(i));
  CHECK(b.inflow(0).bytes == kChunkedDimension * sizeof(float));
  CHECK(a.counters().bytesSent == kChunkedDimension * sizeof(float));
  CHECK(b.counters().rejects().empty());
}

TEST_CASE("transport: in chunks, the next estimate waits until the last one's buffer is free") {
  Pair pair;
  Transport a(pair.topology, 0, pair.options(0, kChunkedDimension));
  Transport b(pair.topology, 1, pair.options(1, kChunkedDimension));
  publish(a, 1, 1.0f, kChunkedDimension);
  a.keepAlive(0, {});
  auto first = nextWhole({&a, &b}, b);
  REQUIRE(std::holds_alternative<Inbound>(first));
  auto held = std::get<Inbound>(first).owner;  // as the engine's mailbox holds it

  // Round 2 must wait: b's only buffer for a still holds round 1.
  publish(a, 2, 2.0f, kChunkedDimension);
  const auto until = std::chrono::steady_clock::now() + 300ms;
  while (std::chrono::steady_clock::now() < until) {
    for (Transport* t : {&a, &b}) {
      t->offerBuffers({});
      std::vector<zmq::pollitem_t> items;
      t->append(items);
      zmq::poll(items, 10ms);
      t->serve(items, {});
    }
    REQUIRE_FALSE(b.receive({}).has_value());
  }
  CHECK(a.counters().sendEvents().at("deferred") >= 1);
  CHECK(reinterpret_cast<const float*>(std::get<Inbound>(first).payload.data())[0] == 1.0f);

  // Let go of round 1: b offers its buffer (READY), round 2 comes into it.
  held.reset();
  first = Rejected{};
  auto second = nextWhole({&a, &b}, b);
  REQUIRE(std::holds_alternative<Inbound>(second));
  CHECK(std::get<Inbound>(second).header.round == 2);
  CHECK(floats(std::get<Inbound>(second))[0] == 2.0f);
  CHECK(b.counters().rejects().empty());
}

TEST_CASE("transport: in chunks, a neighbour that starts late gets the estimate that waited") {
  Pair pair;
  Transport a(pair.topology, 0, pair.options(0, kChunkedDimension));
  publish(a, 4, 4.0f, kChunkedDimension);
  Transport b(pair.topology, 1, pair.options(1, kChunkedDimension));
  a.keepAlive(0, {});  // b answers READY on the connection it hears a on
  auto got = nextWhole({&a, &b}, b);
  REQUIRE(std::holds_alternative<Inbound>(got));
  CHECK(std::get<Inbound>(got).header.round == 4);
}

TEST_CASE("transport: chunks out of order, cut short or over the flow are dropped and counted") {
  Pair pair;
  Transport b(pair.topology, 1, pair.options(1, kChunkedDimension));
  RawPeer a("a/1", pair.topology.node(1).endpoint);
  const std::vector<float> chunk(4, 1.0f);

  SUBCASE("a gap: the estimate is dropped, never completed with what follows") {
    a.send(chunkFrom(pair, 1, 0, chunk), chunk);
    CHECK(std::get<Inbound>(next({&b}, b)).partial);
    a.send(chunkFrom(pair, 1, 32, chunk), chunk);  // 16 expected
    CHECK(reason(next({&b}, b)) == "chunk_order");
    for (std::size_t at = 16; at < kChunkedDimension * 4; at += 16) {
      a.send(chunkFrom(pair, 1, at, chunk), chunk);
      CHECK(reason(next({&b}, b)) == "chunk_order");
    }
    CHECK(b.counters().rejectedFrom.at(0) == 10);
  }
  SUBCASE("a new estimate before the last was whole: truncated") {
    a.send(chunkFrom(pair, 1, 0, chunk), chunk);
    CHECK(std::get<Inbound>(next({&b}, b)).partial);
    a.send(chunkFrom(pair, 2, 0, chunk), chunk);
    auto got = next({&b}, b);
    CHECK(std::get<Inbound>(got).partial);  // round 2 goes on
    CHECK(std::get<Inbound>(got).header.round == 2);
    CHECK(b.counters().rejects() == std::map<std::string, std::uint64_t>{{"truncated", 1}});
  }
  SUBCASE("a chunk past the estimate's end, a bad checksum, a NaN") {
    a.send(chunkFrom(pair, 1, kChunkedDimension * 4 - 8, chunk), chunk);
    CHECK(reason(next({&b}, b)) == "length");
    wire::Header corrupt = chunkFrom(pair, 1, 0, chunk);
    corrupt.checksum ^= 1;
    a.send(corrupt, chunk);
    CHECK(reason(next({&b}, b)) == "checksum");
    std::vector<float> nan = chunk;
    nan[2] = std::numeric_limits<float>::quiet_NaN();
    a.send(chunkFrom(pair, 1, 0, nan), nan);
    CHECK(reason(next({&b}, b)) == "non_finite");
  }
  SUBCASE("a partial estimate is kept through a silence, dropped when the sender says it is done") {
    a.send(chunkFrom(pair, 1, 0, chunk), chunk);
    CHECK(std::get<Inbound>(next({&b}, b)).partial);
    b.offerBuffers(std::chrono::seconds(60));  // a link stalled for a minute loses nothing
    wire::Header hello = chunkFrom(pair, 1, 0, {});
    hello.kind = wire::Kind::Hello;
    hello.flags = wire::kHelloSending;  // still sending: the partial stays
    a.send(hello, {});
    CHECK(std::get<Inbound>(next({&b}, b)).header.kind == wire::Kind::Hello);
    a.send(chunkFrom(pair, 1, 16, chunk), chunk);
    CHECK(std::get<Inbound>(next({&b}, b)).partial);
    CHECK(b.counters().rejects().empty());
    hello.flags = 0;  // done: the chunks it sent after byte 32 were lost
    a.send(hello, {});
    CHECK(std::get<Inbound>(next({&b}, b)).header.kind == wire::Kind::Hello);
    CHECK(b.counters().rejects() == std::map<std::string, std::uint64_t>{{"truncated", 1}});
    a.send(chunkFrom(pair, 1, 32, chunk), chunk);  // its rest comes too late
    CHECK(reason(next({&b}, b)) == "chunk_order");
  }
  SUBCASE("a new estimate while the last one is held: overrun, all its chunks") {
    for (std::size_t at = 0; at < kChunkedDimension * 4; at += 16)
      a.send(chunkFrom(pair, 1, at, chunk), chunk);
    auto whole = nextWhole({&b}, b);
    REQUIRE(std::holds_alternative<Inbound>(whole));
    CHECK(std::get<Inbound>(whole).header.round == 1);
    a.send(chunkFrom(pair, 2, 0, chunk), chunk);
    CHECK(reason(next({&b}, b)) == "overrun");
    a.send(chunkFrom(pair, 2, 16, chunk), chunk);
    CHECK(reason(next({&b}, b)) == "overrun");
    CHECK(floats(std::get<Inbound>(whole))[0] == 1.0f);  // the held estimate is untouched
  }
}

namespace {

// With compression: a node's public copy (whole) and its frame for a round.
struct CompressedRound {
  std::shared_ptr<const std::vector<float>> copy;
  std::shared_ptr<const std::vector<std::byte>> frame;
};

CompressedRound compressedRound(float fill, std::size_t dimension) {
  return {values(fill, dimension),
          std::make_shared<const std::vector<std::byte>>(
              consensus::frameBytes(consensus::Compression::Int8, dimension), std::byte{7})};
}

void publishCompressed(Transport& t, std::int64_t round, const CompressedRound& r,
                       std::optional<std::int64_t> base) {
  std::optional<daemon::CompressedFrame> frame;
  if (base) frame = daemon::CompressedFrame{*base, r.frame, *r.frame};
  t.publishCompressed(round, r.copy, std::as_bytes(std::span(*r.copy)), std::move(frame), {});
}

}  // namespace

TEST_CASE("transport: compressed, the copy goes whole first, then frames; RESYNC sends it whole") {
  constexpr std::size_t kValues = 300;  // frames of 2 x 4 + 300 bytes, copies of 1,200
  const std::size_t frameBytes = consensus::frameBytes(consensus::Compression::Int8, kValues);
  for (const std::size_t chunk : {std::size_t{1} << 20, std::size_t{256}}) {
    CAPTURE(chunk);
    Pair pair;
    auto options = [&](std::size_t node) {
      auto o = pair.options(node, kValues);
      o.expect.compression = consensus::Compression::Int8;
      o.chunkBytes = chunk;
      return o;
    };
    Transport a(pair.topology, 0, options(0));
    Transport b(pair.topology, 1, options(1));
    a.keepAlive(0, {});  // in chunks, b answers READY on the connection it hears a on
    // What arrived, copied: b's receive buffer is free for the next one
    // (the engine copies a keyframe into its copy and applies a frame).
    struct Got {
      wire::Header header;
      std::vector<std::byte> bytes;
      float first() const {
        float value;
        std::memcpy(&value, bytes.data(), sizeof value);
        return value;
      }
    };
    const auto received = [&](consensus::Receipt receipt = consensus::Receipt::Stored) {
      auto got = nextWhole({&a, &b}, b);
      REQUIRE(std::holds_alternative<Inbound>(got));
      const Inbound& message = std::get<Inbound>(got);
      b.settle(message, receipt, {});
      return Got{message.header, {message.payload.begin(), message.payload.end()}};
    };
    const CompressedRound r0 = compressedRound(1.0f, kValues);
    publishCompressed(a, 0, r0, std::nullopt);  // the first round has no frame
    Got m = received();
    CHECK(m.header.dtype == wire::Dtype::Float32);
    CHECK(m.bytes.size() == kValues * 4);

    const CompressedRound r1 = compressedRound(2.0f, kValues);
    publishCompressed(a, 1, r1, 0);  // b's copy of a is at round 0: the frame
    // The frame does not fit b's copy: a reject, and a's copy comes whole
    // (round 1 again, since nothing newer waits).
    m = received(consensus::Receipt::Gap);
    CHECK(m.header.dtype == wire::Dtype::Int8);
    CHECK(m.header.base == 0);
    REQUIRE(m.bytes.size() == frameBytes);
    CHECK(m.bytes[10] == std::byte{7});
    CHECK(b.counters().rejects() == std::map<std::string, std::uint64_t>{{"gap", 1}});
    m = received();
    CHECK(m.header.round == 1);
    CHECK(m.header.dtype == wire::Dtype::Float32);
    CHECK(m.first() == 2.0f);

    const CompressedRound r2 = compressedRound(3.0f, kValues);
    publishCompressed(a, 2, r2, 1);  // in step again
    m = received();
    CHECK(m.header.dtype == wire::Dtype::Int8);
    CHECK(m.header.base == 1);
    CHECK(a.counters().bytesSent == 2 * kValues * 4 + 2 * frameBytes);
    if (chunk < kValues * 4) continue;  // in chunks, READY says what b lacks
    // b is heard for the first time and then seems stuck (its HELLOs repeat
    // round 2): a sends its newest again, as the frame (a duplicate at b if
    // nothing was lost), not its copy whole.
    for (int k = 0; k < 2; ++k) {
      b.keepAlive(2, {});
      auto hello = next({&a, &b}, a);
      REQUIRE(std::holds_alternative<Inbound>(hello));
      a.settle(std::get<Inbound>(hello), consensus::Receipt::Stored, {});
    }
    m = received(consensus::Receipt::Duplicate);
    CHECK(m.header.round == 2);
    CHECK(m.header.dtype == wire::Dtype::Int8);
    CHECK(m.header.base == 1);
    // b stays stuck on round 2 (its trainer is slow, say), but its HELLOs
    // say it holds a's round 2: nothing goes again.
    const auto helloAtA = [&] {
      b.keepAlive(2, {});
      auto hello = next({&a, &b}, a);
      REQUIRE(std::holds_alternative<Inbound>(hello));
      CHECK(std::get<Inbound>(hello).header.kind == wire::Kind::Hello);
      a.settle(std::get<Inbound>(hello), consensus::Receipt::Stored, {});
    };
    const std::uint64_t sent = a.counters().bytesSent;
    for (int k = 0; k < 3; ++k) helloAtA();
    CHECK(a.counters().bytesSent == sent);
    // a's round 3 left, but b has not stored it (lost, as far as a knows):
    // b's next HELLO says it holds round 2, and a sends round 3 again.
    const CompressedRound r3 = compressedRound(4.0f, kValues);
    publishCompressed(a, 3, r3, 2);
    helloAtA();
    CHECK(a.counters().bytesSent == sent + 2 * frameBytes);
  }
}

TEST_CASE("transport: compressed, a frame with a bad checksum or length, or a link that differs") {
  constexpr std::size_t kValues = 300;
  Pair pair;
  auto options = pair.options(1, kValues);
  options.expect.compression = consensus::Compression::Int8;
  options.chunkBytes = std::size_t{1} << 20;
  Transport b(pair.topology, 1, options);
  RawPeer peer("a/0", pair.topology.node(1).endpoint);
  const auto send = [&](wire::Header h, std::size_t bytes, bool goodChecksum) {
    std::vector<std::byte> payload(bytes, std::byte{1});
    h.topologyHash = pair.topology.hash();
    h.dimension = kValues;
    h.payloadBytes = bytes;
    h.checksum = wire::checksum(payload.data(), bytes) + (goodChecksum ? 0 : 1);
    const auto header = wire::encode(h);
    peer.dealer.send(zmq::buffer(header), zmq::send_flags::sndmore);
    peer.dealer.send(zmq::buffer(payload));
    return reason(next({&b}, b));
  };
  wire::Header frame;
  frame.kind = wire::Kind::Estimate;
  frame.dtype = wire::Dtype::Int8;
  frame.round = 3;
  frame.base = 2;
  const std::size_t frameBytes = consensus::frameBytes(consensus::Compression::Int8, kValues);
  CHECK(send(frame, frameBytes, false) == "checksum");
  CHECK(send(frame, frameBytes + 1, true) == "length");
  frame.dtype = wire::Dtype::Bf16;  // another codec's frame
  CHECK(send(frame, 2 * kValues, true) == "dtype");
  wire::Header hello;
  hello.kind = wire::Kind::Hello;
  hello.dtype = wire::Dtype::Float32;  // a node without compression
  CHECK(send(hello, 0, true) == "dtype");
}

namespace {

// The next estimate `node` hands out, skipping keep-alives (settled as the
// node would); fails after five seconds.
Inbound nextEstimate(std::vector<Transport*> transports, Transport& node) {
  for (int i = 0; i < 100; ++i) {
    auto got = next(transports, node);
    REQUIRE(std::holds_alternative<Inbound>(got));
    Inbound message = std::get<Inbound>(got);
    node.settle(message, consensus::Receipt::Stored, consensus::Time{});
    if (message.header.kind == wire::Kind::Estimate) return message;
  }
  FAIL("no estimate among 100 messages");
  return {};
}

}  // namespace

TEST_CASE("transport: a new graph rolls out while both sides of an edge keep exchanging") {
  TempDir dir;
  const auto node = [&](const std::string& id) {
    return "  - {id: " + id + ", endpoint: \"ipc://" + dir.path() + "/" + id + "\"}\n";
  };
  // b and c; then a joins beside b (indices move: b 0 -> 1, c 1 -> 2).
  const topology::Topology old = topology::parseTopology(
      "nodes:\n" + node("b") + node("c") + "edges:\n  - [b, c]\n", "old.yaml");
  const topology::Topology grown = topology::parseTopology(
      "nodes:\n" + node("a") + node("b") + node("c") + "edges:\n  - [a, b]\n  - [b, c]\n",
      "grown.yaml");
  const auto options = [](const topology::Topology& t, std::size_t index) {
    daemon::TransportOptions o;
    o.bind = t.node(index).endpoint;
    o.expect = {t.hash(), kDimension, wire::Dtype::Float32};
    o.peerTimeout = std::chrono::seconds(5);
    o.staleness = 2;
    return o;
  };
  Transport b(old, 0, options(old, 0));
  Transport c(old, 1, options(old, 1));
  publish(b, 1, 1.0f);
  CHECK(nextEstimate({&b, &c}, c).header.round == 1);

  // b applies the new graph first: it speaks the old one to c, and hears c in it.
  b.setTopology(grown, 1);
  publish(b, 2, 2.0f);
  const Inbound toC = nextEstimate({&b, &c}, c);
  CHECK(toC.from == 0);
  CHECK(toC.header.round == 2);
  CHECK(toC.header.topologyHash == old.hash());
  publish(c, 2, 3.0f);
  const Inbound toB = nextEstimate({&b, &c}, b);
  CHECK(toB.from == 2);  // c, in the new graph
  CHECK(toB.header.round == 2);

  // a, new, speaks only the new graph to b.
  Transport a(grown, 0, options(grown, 0));
  publish(a, 3, 4.0f);
  const Inbound fromA = nextEstimate({&a, &b, &c}, b);
  CHECK(fromA.from == 0);
  CHECK(fromA.header.topologyHash == grown.hash());

  // c applies it too: after a HELLO each way both speak the new graph.
  c.setTopology(grown, 2);
  for (int i = 0; i < 3; ++i) {
    b.keepAlive(3, consensus::Time{});
    c.keepAlive(3, consensus::Time{});
    next({&a, &b, &c}, b);
    next({&a, &b, &c}, c);
  }
  publish(b, 4, 5.0f);
  const Inbound settled = nextEstimate({&a, &b, &c}, c);
  CHECK(settled.from == 1);
  CHECK(settled.header.round == 4);
  CHECK(settled.header.topologyHash == grown.hash());
  CHECK(b.counters().rejects().empty());
  CHECK(c.counters().rejects().empty());
}
