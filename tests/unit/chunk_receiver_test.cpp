// One in-neighbour's estimates in chunks, without sockets: assembled in
// order, handed out in place, what is refused and when READY is offered.

#include "network/chunk_receiver.hpp"

#include <doctest/doctest.h>

#include <vector>

using consensusd::consensus::Time;
using consensusd::daemon::ChunkReceiver;
namespace wire = consensusd::wire;
using namespace std::chrono_literals;

namespace {

// Estimates of 4 float32 values (16 bytes), sent as chunks of 8.
const wire::Expectation kExpect{1, 4, wire::Dtype::Float32};

wire::Header chunk(std::int64_t round, std::uint64_t offset) {
  wire::Header h;
  h.round = round;
  h.dimension = 4;
  h.offset = offset;
  h.payloadBytes = 8;
  return h;
}

std::vector<std::byte> bytes(unsigned char value) {
  return std::vector<std::byte>(8, std::byte{value});
}

}  // namespace

TEST_CASE("chunk receiver: two chunks in order make the estimate, handed out in its buffer") {
  ChunkReceiver in(3, 16, true);
  const auto first = bytes(1);
  const auto second = bytes(2);
  auto out = in.take(chunk(5, 0), first, kExpect, Time{});
  CHECK_FALSE(out.refused);
  CHECK(out.owner == nullptr);  // a part: nothing to mix yet
  out = in.take(chunk(5, 8), second, kExpect, Time{} + 3ms);
  REQUIRE_FALSE(out.refused);
  REQUIRE(out.owner != nullptr);
  CHECK(out.header.round == 5);
  CHECK(out.header.payloadBytes == 16);
  REQUIRE(out.bytes.size() == 16);
  CHECK(out.bytes[0] == std::byte{1});
  CHECK(out.bytes[15] == std::byte{2});
  CHECK(in.delivered() == 5);
  CHECK(in.flow().bytes == 16);
  CHECK(in.flow().transfer == 3ms);
}

TEST_CASE("chunk receiver: a gap, a new round cutting one off, a chunk before READY") {
  ChunkReceiver in(0, 16, true);
  const auto data = bytes(7);
  // A middle chunk with nothing begun.
  auto out = in.take(chunk(1, 8), data, kExpect, Time{});
  REQUIRE(out.refused);
  CHECK((out.refused->reason == wire::Reject::ChunkOrder));
  // Round 2 begun, round 3 begins: 2 is cut off.
  CHECK_FALSE(in.take(chunk(2, 0), data, kExpect, Time{}).refused);
  out = in.take(chunk(3, 0), data, kExpect, Time{});
  REQUIRE(out.cutOff);
  CHECK((out.cutOff->reason == wire::Reject::Truncated));
  CHECK_FALSE(out.refused);
  // Round 3 finished, and its buffer still held by the mailbox: round 4 overruns it.
  out = in.take(chunk(3, 8), data, kExpect, Time{});
  REQUIRE(out.owner != nullptr);
  const std::shared_ptr<const void> mailbox = out.owner;
  out = in.take(chunk(4, 0), data, kExpect, Time{});
  REQUIRE(out.refused);
  CHECK((out.refused->reason == wire::Reject::Overrun));
  out = in.take(chunk(4, 8), data, kExpect, Time{});  // the rest of it: dropped too
  REQUIRE(out.refused);
  CHECK((out.refused->reason == wire::Reject::Overrun));
}

TEST_CASE(
    "chunk receiver: READY once the buffer is free and the neighbour spoke, again on a new "
    "connection") {
  ChunkReceiver in(0, 16, true);
  std::mt19937_64 grants(1);
  CHECK_FALSE(in.offer(true, grants, Time{}));  // not heard: no connection to answer on
  CHECK_FALSE(in.heardOn("n0/a", true));
  const auto grant = in.offer(true, grants, Time{});
  REQUIRE(grant);
  CHECK(in.grant() == *grant);
  CHECK_FALSE(in.offer(true, grants, Time{}));  // one out already
  const auto data = bytes(1);
  in.take(chunk(1, 0), data, kExpect, Time{});  // uses it
  CHECK(in.grant() == 0);
  CHECK_FALSE(in.offer(true, grants, Time{}));  // an estimate under way
  // The neighbour reconnects mid-estimate: what it was sending is cut off.
  const auto cut = in.heardOn("n0/b", true);
  REQUIRE(cut);
  CHECK((cut->reason == wire::Reject::Truncated));
  CHECK(in.routingId() == "n0/b");
  CHECK(in.offer(true, grants, Time{}));
  // Whole estimates in one message: no READY at all.
  ChunkReceiver whole(1, 16, false);
  whole.heardOn("n1/a", false);
  CHECK_FALSE(whole.offer(false, grants, Time{}));
}

TEST_CASE("chunk receiver: the sender saying it sends no more drops the half received") {
  ChunkReceiver in(0, 16, true);
  CHECK_FALSE(in.endOfSending("bye"));
  const auto data = bytes(1);
  in.take(chunk(9, 0), data, kExpect, Time{});
  const auto cut = in.endOfSending("bye");
  REQUIRE(cut);
  CHECK(cut->detail == "round 9: bye");
  auto out = in.take(chunk(9, 8), data, kExpect, Time{});
  REQUIRE(out.refused);
  CHECK((out.refused->reason == wire::Reject::ChunkOrder));
}
