// The daemon's pieces without sockets: wire codec, checkpoints, status requests.

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <span>

#include "consensusd/daemon/checkpoint.hpp"
#include "consensusd/daemon/status_server.hpp"
#include "consensusd/daemon/wire.hpp"
#include "process.hpp"

using namespace consensusd;
using consensusd::testing::TempDir;

namespace {

struct Packet {
  wire::Header header;
  std::vector<float> values;
};

Packet estimate(std::size_t dimension) {
  Packet packet;
  packet.values.assign(dimension, 0.5f);
  packet.header.kind = wire::Kind::Estimate;
  packet.header.sender = 3;
  packet.header.round = 42;
  packet.header.dimension = dimension;
  packet.header.topologyHash = 0xabcdef;
  packet.header.payloadBytes = dimension * 4;
  packet.header.checksum = wire::checksum(packet.values.data(), dimension * 4);
  return packet;
}

// "accepted" or the reject reason's name (doctest prints strings).
std::string verdict(std::span<const std::byte> header, std::span<const std::byte> payload,
                    const wire::Expectation& expect) {
  const auto decoded = wire::decodeHeader(header);
  if (const auto* why = std::get_if<wire::Reject>(&decoded)) return wire::toString(*why);
  const auto why = wire::validate(std::get<wire::Header>(decoded), payload, expect);
  return why ? wire::toString(*why) : "accepted";
}

std::string check(const Packet& packet, const wire::Expectation& expect) {
  const auto bytes = wire::encode(packet.header);
  return verdict(
      bytes,
      std::span(reinterpret_cast<const std::byte*>(packet.values.data()), packet.values.size() * 4),
      expect);
}

}  // namespace

TEST_CASE("wire: a header survives encode and decode") {
  const Packet packet = estimate(10);
  const auto decoded = wire::decodeHeader(wire::encode(packet.header));
  REQUIRE(std::holds_alternative<wire::Header>(decoded));
  const wire::Header& h = std::get<wire::Header>(decoded);
  CHECK(h.kind == wire::Kind::Estimate);
  CHECK(h.sender == 3);
  CHECK(h.round == 42);
  CHECK(h.dimension == 10);
  CHECK(h.topologyHash == 0xabcdef);
  CHECK(h.checksum == packet.header.checksum);
  CHECK(check(packet, {0xabcdef, 10, wire::Dtype::Float32}) == "accepted");
}

TEST_CASE("wire: every malformed message has its reason") {
  const wire::Expectation expect{0xabcdef, 10, wire::Dtype::Float32};
  auto bytes = wire::encode(estimate(10).header);
  CHECK(verdict(std::span(bytes).first(63), {}, expect) == "header_size");
  bytes[0] = std::byte{0};
  CHECK(verdict(bytes, {}, expect) == "magic");
  bytes = wire::encode(estimate(10).header);
  bytes[4] = std::byte{9};
  CHECK(verdict(bytes, {}, expect) == "version");
  bytes = wire::encode(estimate(10).header);
  bytes[6] = std::byte{7};
  CHECK(verdict(bytes, {}, expect) == "kind");

  Packet packet = estimate(10);
  packet.header.topologyHash = 1;
  CHECK(check(packet, expect) == "topology");
  CHECK(check(estimate(12), expect) == "dimension");
  packet = estimate(10);
  packet.header.dtype = wire::Dtype::Float64;
  CHECK(check(packet, expect) == "dtype");
  packet = estimate(10);
  packet.values.pop_back();
  CHECK(check(packet, expect) == "length");
  packet = estimate(10);
  packet.values[3] = 0.25f;  // checksum no longer matches
  CHECK(check(packet, expect) == "checksum");
  packet = estimate(10);
  packet.values[7] = std::numeric_limits<float>::quiet_NaN();
  packet.header.checksum = wire::checksum(packet.values.data(), 40);
  CHECK(check(packet, expect) == "non_finite");
  packet.values[7] = std::numeric_limits<float>::infinity();
  packet.header.checksum = wire::checksum(packet.values.data(), 40);
  CHECK(check(packet, expect) == "non_finite");
}

TEST_CASE("non-finite values are caught wherever they sit, float64 and misaligned too") {
  // 37 doubles: the SIMD body, the scalar tail, and a payload starting at an odd address.
  const std::size_t dimension = 37;
  const wire::Expectation expect{0xabcdef, dimension, wire::Dtype::Float64};
  std::vector<std::byte> storage(dimension * 8 + 1);
  for (const std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
    for (const std::size_t at : {std::size_t{0}, std::size_t{17}, dimension - 1}) {
      for (const double bad : {std::numeric_limits<double>::quiet_NaN(),
                               -std::numeric_limits<double>::infinity(), 0.0}) {
        CAPTURE(offset);
        CAPTURE(at);
        CAPTURE(bad);
        std::vector<double> values(dimension, -1.5e300);  // large but finite
        values[at] = bad;
        const std::span payload(storage.data() + offset, dimension * 8);
        std::memcpy(payload.data(), values.data(), payload.size());
        wire::Header header;
        header.kind = wire::Kind::Estimate;
        header.dtype = wire::Dtype::Float64;
        header.dimension = dimension;
        header.topologyHash = 0xabcdef;
        header.payloadBytes = payload.size();
        header.checksum = wire::checksum(payload.data(), payload.size());
        CHECK(verdict(wire::encode(header), payload, expect) ==
              (bad == 0.0 ? "accepted" : "non_finite"));
      }
    }
  }
}

TEST_CASE("float32 Inf and NaN are caught in every part of the checksum's pass, on every path") {
  // 4,099 floats: SSE4.2's three interleaved streams over 16,392 bytes,
  // whole words after them, and a last lone float; folding's 128-byte blocks
  // over 16,384 bytes and a 12-byte tail. 4,103 floats add one 16-byte block
  // after the 128-byte ones. Payloads at even and odd addresses.
  for (const wire::CrcPath path : wire::crcPaths()) {
    wire::useCrcPath(path);
    for (const std::size_t dimension : {std::size_t{4099}, std::size_t{4103}}) {
      const wire::Expectation expect{0xabcdef, dimension, wire::Dtype::Float32};
      std::vector<std::byte> storage(dimension * 4 + 1);
      for (const std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
        for (const std::size_t at :
             {std::size_t{0}, std::size_t{1}, std::size_t{31}, std::size_t{1366}, std::size_t{1367},
              std::size_t{2733}, std::size_t{4097}, dimension - 1}) {
          for (const float bad :
               {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity(),
                std::numeric_limits<float>::max(), -0.0f}) {
            CAPTURE(static_cast<int>(path));
            CAPTURE(dimension);
            CAPTURE(offset);
            CAPTURE(at);
            CAPTURE(bad);
            std::vector<float> values(dimension, 3.0e38f);  // large but finite
            values[at] = bad;
            const std::span payload(storage.data() + offset, dimension * 4);
            std::memcpy(payload.data(), values.data(), payload.size());
            wire::Header header;
            header.kind = wire::Kind::Estimate;
            header.dimension = dimension;
            header.topologyHash = 0xabcdef;
            header.payloadBytes = payload.size();
            header.checksum = wire::checksum(payload.data(), payload.size());
            const bool finite = std::isfinite(bad);
            CHECK(verdict(wire::encode(header), payload, expect) ==
                  (finite ? "accepted" : "non_finite"));
            CHECK(wire::exponentsAllClear(payload, false) == finite);  // the portable pass agrees
            header.checksum ^= 1;  // a bad checksum is that, whatever the values
            CHECK(verdict(wire::encode(header), payload, expect) == "checksum");
          }
        }
      }
    }
  }
  wire::useCrcPath(wire::crcPaths().back());
}

TEST_CASE("checksum is CRC-32C, the same on every path this CPU has") {
  // Sizes around each path's thresholds (folding from 256 bytes in blocks
  // of 128 then 16; three SSE4.2 streams from 12,288), at odd addresses too.
  std::vector<unsigned char> bytes(100004);
  for (std::size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = static_cast<unsigned char>((i * 2654435761u) >> 13);
  const std::string check = "123456789";
  for (const wire::CrcPath path : wire::crcPaths()) {
    CAPTURE(static_cast<int>(path));
    wire::useCrcPath(path);
    CHECK(wire::checksum(check.data(), check.size()) == 0xE3069283u);  // the standard check value
    for (const std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
      for (const std::size_t size :
           {std::size_t{0}, std::size_t{1}, std::size_t{8}, std::size_t{255}, std::size_t{256},
            std::size_t{257}, std::size_t{271}, std::size_t{272}, std::size_t{383},
            std::size_t{384}, std::size_t{1003}, std::size_t{12287}, std::size_t{12288},
            std::size_t{12289}, std::size_t{12311}, std::size_t{65536}, std::size_t{99999},
            bytes.size() - 1}) {
        CAPTURE(offset);
        CAPTURE(size);
        CHECK(wire::checksum(bytes.data() + offset, size) ==
              ~wire::crc32cPortable(~0u, bytes.data() + offset, size));
      }
    }
  }
  wire::useCrcPath(wire::crcPaths().back());
}

TEST_CASE("checkpoints: newest valid wins, torn or corrupt ones are reported and skipped") {
  const TempDir dir;
  daemon::CheckpointStore store(dir.path() + "/ckpt", 2);
  daemon::Checkpoint checkpoint;
  checkpoint.topologyHash = 7;
  checkpoint.nodeId = "n1";
  checkpoint.dimension = 4;
  const auto paramsOf = [](float value) {
    std::vector<std::byte> bytes(16);
    for (std::size_t i = 0; i < 4; ++i) std::memcpy(bytes.data() + 4 * i, &value, 4);
    return bytes;
  };
  for (const std::int64_t round : {100, 200, 300}) {
    checkpoint.round = round;
    checkpoint.params = paramsOf(static_cast<float>(round));
    store.save(checkpoint);
  }
  // Two generations kept.
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& entry :
       std::filesystem::directory_iterator(dir.path() + "/ckpt"))
    ++files;
  CHECK(files == 2);
  auto loaded = store.loadNewest(checkpoint);
  REQUIRE(loaded.checkpoint);
  CHECK(loaded.checkpoint->round == 300);
  CHECK(loaded.checkpoint->params == paramsOf(300.0f));
  CHECK(loaded.rejected.empty());

  // A bit flip in the newest: the older one is used, the newest reported.
  const std::string newest = loaded.path;
  {
    std::fstream file(newest, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(50);
    file.put('\x55');
  }
  loaded = store.loadNewest(checkpoint);
  REQUIRE(loaded.checkpoint);
  CHECK(loaded.checkpoint->round == 200);
  REQUIRE(loaded.rejected.size() == 1);
  CHECK(loaded.rejected[0].path == newest);
  CHECK(loaded.rejected[0].why == "checksum mismatch (torn or corrupt)");

  // Truncated: reported by size.
  std::filesystem::resize_file(newest, 50);
  loaded = store.loadNewest(checkpoint);
  CHECK(loaded.checkpoint->round == 200);
  CHECK(loaded.rejected[0].why == "size 50, expected 64");
  std::filesystem::resize_file(newest, 30);
  loaded = store.loadNewest(checkpoint);
  CHECK(loaded.rejected[0].why == "truncated: size 30");

  // Another model: nothing valid, a fresh start.
  daemon::Checkpoint other = checkpoint;
  other.dimension = 5;
  loaded = store.loadNewest(other);
  CHECK_FALSE(loaded.checkpoint);
  CHECK(loaded.rejected.size() == 2);

  // Set aside, the corrupt file is kept but no longer a generation: the next
  // save keeps the two newest valid ones.
  loaded = store.loadNewest(checkpoint);
  daemon::CheckpointStore::setAside(loaded.rejected);
  CHECK(std::filesystem::exists(newest + ".rejected"));
  // A temp file left by a crash in another save goes with the next commit.
  const std::string stale = dir.path() + "/ckpt/.round-000000000260.ckpt.tmp";
  std::ofstream(stale) << "half a checkpoint";
  checkpoint.round = 250;
  checkpoint.params = paramsOf(250.0f);
  store.save(checkpoint);
  CHECK_FALSE(std::filesystem::exists(stale));
  loaded = store.loadNewest(checkpoint);
  CHECK(loaded.checkpoint->round == 250);
  CHECK(loaded.rejected.empty());
  CHECK(std::filesystem::exists(dir.path() + "/ckpt/round-000000000200.ckpt"));
}

TEST_CASE("checkpoints keep the momentum velocity next to the parameters") {
  const TempDir dir;
  daemon::CheckpointStore store(dir.path(), 2);
  daemon::Checkpoint checkpoint;
  checkpoint.round = 42;
  checkpoint.dimension = 2;
  checkpoint.dtype = wire::Dtype::Float64;
  const auto bytesOf = [](double a, double b) {
    std::vector<std::byte> bytes(16);
    std::memcpy(bytes.data(), &a, 8);
    std::memcpy(bytes.data() + 8, &b, 8);
    return bytes;
  };
  checkpoint.params = bytesOf(1.5, -2.0);
  checkpoint.velocity = bytesOf(0.25, 0.125);
  store.save(checkpoint);
  const auto loaded = store.loadNewest(checkpoint);
  REQUIRE(loaded.checkpoint);
  CHECK(loaded.checkpoint->params == bytesOf(1.5, -2.0));
  CHECK(loaded.checkpoint->velocity == bytesOf(0.25, 0.125));

  checkpoint.velocity.resize(8);  // a velocity must match the parameters
  CHECK_THROWS_AS(store.save(checkpoint), std::invalid_argument);
}

TEST_CASE("the checkpoint format is stable: save writes the fuzz seeds byte for byte") {
  const std::string seeds = CONSENSUSD_SOURCE_DIR "/tests/fuzz/corpus/checkpoint/";
  const auto bytesOf = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    const std::vector<char> raw((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
    const auto bytes = std::as_bytes(std::span(raw));
    return std::vector<std::byte>(bytes.begin(), bytes.end());
  };
  const auto floats = [](std::vector<float> values) {
    const auto bytes = std::as_bytes(std::span(values));
    return std::vector<std::byte>(bytes.begin(), bytes.end());
  };
  daemon::Checkpoint checkpoint;
  checkpoint.topologyHash = 0x0123456789abcdef;
  checkpoint.nodeId = "n2";
  checkpoint.node = 2;
  checkpoint.dimension = 6;
  checkpoint.params = floats({0.5f, -1.25f, 3.0f, 0.0f, 1e-3f, -7.5f});
  const TempDir dir;
  daemon::CheckpointStore store(dir.path(), 10);
  const auto same = [&](std::int64_t round, const std::string& seed) {
    checkpoint.round = round;
    CHECK_MESSAGE(bytesOf(store.save(checkpoint)) == bytesOf(seeds + seed), seed);
    const auto parsed = daemon::parseCheckpoint(bytesOf(seeds + seed), checkpoint);
    REQUIRE(std::holds_alternative<daemon::Checkpoint>(parsed));
    CHECK(std::get<daemon::Checkpoint>(parsed).params == checkpoint.params);
    CHECK(std::get<daemon::Checkpoint>(parsed).velocity == checkpoint.velocity);
  };
  same(120, "params");
  checkpoint.velocity = floats({0.01f, 0.02f, -0.03f, 0.0f, 0.0f, 0.5f});
  same(4000, "params-velocity");

  // The node is named by id: the same file resumes in another graph, at
  // another index; never as another node.
  daemon::Checkpoint elsewhere = checkpoint;
  elsewhere.topologyHash = 0x42;
  elsewhere.node = 7;
  const auto moved = daemon::parseCheckpoint(bytesOf(seeds + "params"), elsewhere);
  REQUIRE(std::holds_alternative<daemon::Checkpoint>(moved));
  CHECK(std::get<daemon::Checkpoint>(moved).topologyHash == 0x0123456789abcdef);  // as written
  elsewhere.nodeId = "n3";
  CHECK(std::get<std::string>(daemon::parseCheckpoint(bytesOf(seeds + "params"), elsewhere)) ==
        "written for another node, dtype or model");

  // Files that named the node by index (before ids) load in their own graph only.
  const auto byIndex =
      daemon::parseCheckpoint(bytesOf(seeds + "by-index-params-velocity"), checkpoint);
  REQUIRE(std::holds_alternative<daemon::Checkpoint>(byIndex));
  CHECK(std::get<daemon::Checkpoint>(byIndex).round == 4000);
  CHECK(std::get<daemon::Checkpoint>(byIndex).velocity == checkpoint.velocity);
  elsewhere.nodeId = "n2";
  CHECK(std::get<std::string>(
            daemon::parseCheckpoint(bytesOf(seeds + "by-index-params"), elsewhere)) ==
        "written for another topology, node, dtype or model");

  // The first format (vector count 0, parameters only) still loads.
  checkpoint.velocity.clear();
  const auto first = daemon::parseCheckpoint(bytesOf(seeds + "first-format"), checkpoint);
  REQUIRE(std::holds_alternative<daemon::Checkpoint>(first));
  CHECK(std::get<daemon::Checkpoint>(first).round == 7);
  CHECK(std::get<daemon::Checkpoint>(first).params == checkpoint.params);
  CHECK(std::get<std::string>(daemon::parseCheckpoint(bytesOf(seeds + "float64"), checkpoint)) ==
        "written for another topology, node, dtype or model");
}

TEST_CASE("status requests: reads answer at once, mutations need trust, junk gets an error") {
  daemon::StatusSnapshot snapshot;
  snapshot.node = "n4";
  snapshot.round = 17;
  snapshot.configYaml = "node:\n  id: n4\n";
  daemon::Command command;
  const auto answer = [&](const std::string& line, bool trusted = true) {
    return daemon::answerRequest(line, &snapshot, trusted, command);
  };
  CHECK((*answer(R"({"cmd":"status"})"))["round"] == 17);
  CHECK((*answer(R"({"cmd":"config"})"))["config"].get<std::string>() == "node:\n  id: n4\n");
  CHECK((*answer(R"({"cmd":"neighbors"})"))["neighbors"].empty());
  CHECK((*answer("{oops")).dump() == R"({"error":"malformed JSON","ok":false})");
  CHECK((*answer(R"([1,2])"))["ok"] == false);
  const std::string denied = (*answer(R"({"cmd":"stop"})", false))["error"].get<std::string>();
  CHECK(denied == "permission denied: 'stop' only from the daemon's own user");
  CHECK_FALSE(answer(R"({"cmd":"set-policy","policy":"all"})").has_value());
  CHECK(command.name == "set-policy");
  CHECK(command.args["policy"].get<std::string>() == "all");
  CHECK(daemon::answerRequest(R"({"cmd":"status"})", nullptr, true, command)->dump() ==
        R"({"error":"starting up","ok":false})");
}

TEST_CASE("status requests: a poller gets only the fields it names, or an error") {
  daemon::StatusSnapshot snapshot;
  snapshot.node = "n4";
  snapshot.round = 17;
  daemon::NeighborStatus n1;
  n1.id = "n1";
  n1.onTime = 5;
  n1.late = 2;
  snapshot.neighbors = {n1};
  daemon::Command command;
  const auto answer = [&](const std::string& line) {
    return *daemon::answerRequest(line, &snapshot, false, command);
  };
  CHECK(answer(R"({"cmd":"status","fields":["round","no_such_field","neighbors.id",)"
               R"("neighbors.on_time","neighbors.no_such_field"]})")
            .dump() == R"({"neighbors":[{"id":"n1","on_time":5}],"ok":true,"round":17})");
  CHECK(answer(R"({"cmd":"status","fields":["node","neighbors","neighbors.id"]})")["neighbors"][0]
                                                                                  ["late"] == 2);
  CHECK(answer(R"({"cmd":"status","fields":["round","round","neighbors.id","neighbors.id"]})")
            .dump() == R"({"neighbors":[{"id":"n1"}],"ok":true,"round":17})");
  CHECK(answer(R"({"cmd":"status","fields":[]})").dump() == R"({"ok":true})");
  const std::string refused = R"({"error":"fields: expected an array of at most 128 field names",)"
                              R"("ok":false})";
  CHECK(answer(R"({"cmd":"status","fields":"round"})").dump() == refused);
  CHECK(answer(R"({"cmd":"status","fields":["round",7]})").dump() == refused);
  CHECK(answer(R"({"cmd":"status","fields":[")" + std::string(65, 'x') + R"("]})").dump() ==
        refused);
  std::string many = R"({"cmd":"status","fields":["round")";
  for (int i = 0; i < 128; ++i) many += R"(,"round")";
  CHECK(answer(many + "]}").dump() == refused);
}

TEST_CASE("status fields: naming every field gives the whole status, the trainer only if named") {
  daemon::StatusSnapshot snapshot;
  snapshot.node = "n2";
  snapshot.neighbors.resize(2);
  snapshot.neighbors[1].id = "n3";
  snapshot.trainer = daemon::TrainerStatus{};
  snapshot.trainer->updates = 9;
  const nlohmann::json whole = daemon::toJson(snapshot);
  REQUIRE(whole.contains("trainer"));
  nlohmann::json names = nlohmann::json::array();
  for (const auto& [key, value] : whole.items()) names.push_back(key);
  const auto every = daemon::StatusFields::parse(names);
  REQUIRE(every.has_value());
  CHECK(daemon::toJson(snapshot, &*every) == whole);

  nlohmann::json neighborNames = nlohmann::json::array();
  for (const auto& [key, value] : whole["neighbors"][0].items())
    neighborNames.push_back("neighbors." + key);
  const auto perNeighbor = daemon::StatusFields::parse(neighborNames);
  REQUIRE(perNeighbor.has_value());
  CHECK(daemon::toJson(snapshot, &*perNeighbor) ==
        nlohmann::json{{"neighbors", whole["neighbors"]}});
}

TEST_CASE("liveness: a snapshot older than the stall limit means the engine loop hangs") {
  daemon::StatusBoard board;
  const auto t0 = daemon::StatusBoard::Clock::time_point{} + std::chrono::hours(1);
  CHECK_FALSE(board.live(t0));  // starting: nothing published yet
  board.publish(std::make_shared<daemon::StatusSnapshot>(), t0);
  CHECK(board.live(t0));
  CHECK(board.live(t0 + daemon::StatusBoard::kStallLimit));
  CHECK_FALSE(board.live(t0 + daemon::StatusBoard::kStallLimit + std::chrono::milliseconds(1)));
  board.publish(std::make_shared<daemon::StatusSnapshot>(), t0 + std::chrono::minutes(5));
  CHECK(board.live(t0 + std::chrono::minutes(5) + std::chrono::seconds(1)));
}

TEST_CASE("metrics: a node with a trainer reports it, in text promtool accepts") {
  daemon::StatusSnapshot status;
  status.node = "n0";
  daemon::TrainerStatus trainer;
  trainer.attached = true;
  trainer.updates = 12;
  trainer.rejectedUpdates = 1;
  trainer.meanUpdateMs = 2.0;
  trainer.p95UpdateMs = 5.0;
  status.trainer = trainer;
  const std::string text = daemon::prometheusText(status);
  CHECK(text.find("consensusd_trainer_attached{node=\"n0\"} 1") != std::string::npos);
  CHECK(text.find("consensusd_trainer_rejected_updates_total{node=\"n0\"} 1") != std::string::npos);
  CHECK(text.find("consensusd_trainer_update_p95_seconds{node=\"n0\"} 0.005") != std::string::npos);
  const auto promtool =
      consensusd::testing::runProcess({"/usr/bin/promtool", "check", "metrics"}, text);
  INFO(promtool.out << promtool.err);
  CHECK(promtool.exitCode == 0);
  CHECK(daemon::toJson(status)["trainer"]["updates"] == 12);
  status.trainer.reset();  // a node with a built-in model: no trainer lines
  CHECK(daemon::prometheusText(status).find("trainer") == std::string::npos);
}
