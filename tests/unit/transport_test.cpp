// The daemon's transport on its own: two nodes over ipc:// sockets in a
// temporary folder, and raw ZeroMQ peers for what an honest node never sends.

#include "transport.hpp"

#include <doctest/doctest.h>

#include <chrono>
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

  daemon::TransportOptions options(std::size_t node) const {
    daemon::TransportOptions o;
    o.bind = topology.node(node).endpoint;
    o.expect = {topology.hash(), kDimension, wire::Dtype::Float32};
    o.peerTimeout = std::chrono::seconds(5);
    o.staleness = 2;
    return o;
  }
};

// Polls every transport until `node` has a message (or a reject) to hand
// out, serving the others' queues meanwhile; fails after five seconds.
std::variant<Inbound, Rejected> next(std::vector<Transport*> transports, Transport& node) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    if (auto got = node.receive()) return std::move(*got);
    for (Transport* t : transports) {
      std::vector<zmq::pollitem_t> items;
      t->append(items);
      zmq::poll(items, 20ms);
      t->serve(items);
    }
  }
  FAIL("no message within 5 s");
  return Rejected{};
}

std::shared_ptr<const std::vector<float>> values(float fill) {
  return std::make_shared<const std::vector<float>>(kDimension, fill);
}

void publish(Transport& t, std::int64_t round, float fill) {
  auto payload = values(fill);
  const std::span bytes = std::as_bytes(std::span(*payload));
  t.publish(round, std::move(payload), bytes, consensus::Time{});
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
  REQUIRE(message.bytes().size() == kDimension * sizeof(float));
  CHECK(reinterpret_cast<const float*>(message.bytes().data())[3] == 0.25f);

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
  // HELLO never queues: with no room it is simply not sent.
  a.sendControl(wire::Kind::Hello, 0, 0, std::nullopt, consensus::Time{});
  CHECK(a.counters().sendEvents().at("dropped") == 70 - 64);
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
  b.sendControl(wire::Kind::Hello, 0, 0, std::nullopt, consensus::Time{});
  auto hello = next({&a, &b}, a);
  REQUIRE(std::holds_alternative<Inbound>(hello));
  CHECK(std::get<Inbound>(hello).header.kind == wire::Kind::Hello);
  a.settle(std::get<Inbound>(hello), consensus::Receipt::Stored, consensus::Time{});
  auto again = next({&a, &b}, b);
  REQUIRE(std::holds_alternative<Inbound>(again));
  CHECK(std::get<Inbound>(again).header.round == 5);
}
