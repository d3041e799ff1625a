// The node's checkpoint writer on its own: resume, save, and saves that fail.

#include "checkpoint_writer.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <vector>

#include "process.hpp"

using namespace consensusd;
using consensusd::daemon::Checkpoint;
using consensusd::daemon::CheckpointWriter;
using consensusd::testing::TempDir;

namespace {

Checkpoint identity() {
  Checkpoint c;
  c.topologyHash = 0x1234;
  c.node = 2;
  c.dtype = wire::Dtype::Float32;
  c.dimension = 3;
  return c;
}

std::vector<std::byte> bytes(float a, float b, float c) {
  const float v[] = {a, b, c};
  const auto* p = reinterpret_cast<const std::byte*>(v);
  return {p, p + sizeof v};
}

}  // namespace

TEST_CASE("checkpoint writer: a fresh folder resumes nothing, a save resumes") {
  TempDir dir;
  {
    CheckpointWriter writer(dir.path() + "/ckpt", 2, identity());
    CHECK_FALSE(writer.resume().has_value());
    CHECK(writer.lastRound() == -1);
    const auto params = bytes(1, 2, 3);
    const auto velocity = bytes(4, 5, 6);
    const auto path = writer.trySave(40, params, velocity);
    REQUIRE(path.has_value());
    CHECK(std::filesystem::exists(*path));
    CHECK(writer.lastRound() == 40);
    CHECK(writer.trySave(41, params, {}).has_value());
  }
  CheckpointWriter again(dir.path() + "/ckpt", 2, identity());
  const auto resumed = again.resume();
  REQUIRE(resumed.has_value());
  CHECK(resumed->round == 41);
  CHECK(resumed->params == bytes(1, 2, 3));
  CHECK(resumed->velocity.empty());
  CHECK(again.lastRound() == 41);

  // Another node's identity finds nothing of its own there.
  Checkpoint other = identity();
  other.node = 3;
  CHECK_FALSE(CheckpointWriter(dir.path() + "/ckpt", 2, other).resume().has_value());
}

TEST_CASE("checkpoint writer: a save that cannot be written is counted, not thrown") {
  TempDir dir;
  const std::string blocked = dir.write("file", "not a folder") + "/ckpt";  // ENOTDIR
  CheckpointWriter writer(blocked, 2, identity());
  const auto params = bytes(1, 2, 3);
  CHECK_FALSE(writer.trySave(5, params, {}).has_value());
  CHECK_FALSE(writer.trySave(6, params, {}).has_value());
  CHECK(writer.failures() == 2);
  CHECK(writer.lastRound() == -1);
  CHECK_FALSE(writer.lastError().empty());
  daemon::StatusSnapshot status;
  writer.fill(status);
  CHECK(status.checkpointFailures == 2);
  CHECK(status.lastCheckpointError == writer.lastError());
}
