// The node's checkpoint writer on its own: resume, save, saves that fail,
// and a save that stalls while its caller goes on.

#include "durability/checkpoint_writer.hpp"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
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
  c.nodeId = "n2";
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

// The eventfd a save rings when it ends.
struct Doorbell {
  int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  ~Doorbell() { ::close(fd); }
  bool rung(int timeoutMs) const {
    pollfd item{fd, POLLIN, 0};
    return ::poll(&item, 1, timeoutMs) == 1;
  }
};

// A save run to its end, as the engine thread does it.
std::optional<std::string> save(CheckpointWriter& writer, std::int64_t round,
                                const std::vector<std::byte>& params,
                                const std::vector<std::byte>& velocity) {
  REQUIRE_FALSE(writer.busy());
  writer.start({round, 0x1234, nullptr, params, velocity});
  writer.wait();
  const auto outcome = writer.takeOutcome();
  REQUIRE(outcome.has_value());
  CHECK(outcome->round == round);
  CHECK_FALSE(writer.busy());
  return outcome->path;
}

}  // namespace

TEST_CASE("checkpoint writer: a fresh folder resumes nothing, a save resumes") {
  TempDir dir;
  Doorbell done;
  {
    CheckpointWriter writer(dir.path() + "/ckpt", 2, identity(), done.fd);
    CHECK_FALSE(writer.resume().has_value());
    CHECK(writer.lastRound() == -1);
    CHECK_FALSE(writer.takeOutcome().has_value());
    const auto params = bytes(1, 2, 3);
    const auto velocity = bytes(4, 5, 6);
    const auto path = save(writer, 40, params, velocity);
    REQUIRE(path.has_value());
    CHECK(std::filesystem::exists(*path));
    CHECK(writer.lastRound() == 40);
    CHECK(done.rung(0));
    CHECK(save(writer, 41, params, {}).has_value());
  }
  CheckpointWriter again(dir.path() + "/ckpt", 2, identity(), done.fd);
  const auto resumed = again.resume();
  REQUIRE(resumed.has_value());
  CHECK(resumed->round == 41);
  CHECK(resumed->params == bytes(1, 2, 3));
  CHECK(resumed->velocity.empty());
  CHECK(again.lastRound() == 41);

  // Another node's identity finds nothing of its own there.
  Checkpoint other = identity();
  other.nodeId = "n3";
  CHECK_FALSE(CheckpointWriter(dir.path() + "/ckpt", 2, other, done.fd).resume().has_value());
}

TEST_CASE("checkpoint writer: a save that cannot be written is counted, not thrown") {
  TempDir dir;
  const std::string blocked = dir.write("file", "not a folder") + "/ckpt";  // ENOTDIR
  Doorbell done;
  CheckpointWriter writer(blocked, 2, identity(), done.fd);
  const auto params = bytes(1, 2, 3);
  CHECK_FALSE(save(writer, 5, params, {}).has_value());
  CHECK_FALSE(save(writer, 6, params, {}).has_value());
  CHECK(writer.failures() == 2);
  CHECK(writer.lastRound() == -1);
  CHECK_FALSE(writer.lastError().empty());
  daemon::StatusSnapshot status;
  writer.fill(status);
  CHECK(status.checkpointFailures == 2);
  CHECK(status.lastCheckpointError == writer.lastError());
}

TEST_CASE("checkpoint writer: a save that stalls leaves its caller free and its state as it was") {
  // A FIFO where the temporary file goes: the write blocks until somebody
  // reads, as on a disk or network filesystem that hangs.
  TempDir dir;
  const std::string folder = dir.path() + "/ckpt";
  std::filesystem::create_directories(folder);
  const std::string temp = folder + "/.round-000000000007.ckpt.tmp";
  REQUIRE(::mkfifo(temp.c_str(), 0600) == 0);
  Doorbell done;
  CheckpointWriter writer(folder, 2, identity(), done.fd);

  auto params = std::make_shared<std::vector<std::byte>>(bytes(1, 2, 3));
  auto velocity = bytes(4, 5, 6);
  writer.start({7, 0x1234, params, *params, velocity});
  // The caller goes on: it changes its velocity, and the save is still under way.
  velocity = bytes(-1, -1, -1);
  CHECK(writer.busy());
  CHECK_FALSE(done.rung(50));
  CHECK_FALSE(writer.takeOutcome().has_value());
  CHECK(params.use_count() == 2);  // held by the save, unchanged

  // Read what the save wrote: the parameters and the velocity of when it started.
  const int fd = ::open(temp.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  std::vector<std::byte> written;
  std::byte buffer[256];
  for (ssize_t n = 0; (n = ::read(fd, buffer, sizeof buffer)) > 0;)
    written.insert(written.end(), buffer, buffer + n);
  ::close(fd);
  const auto holds = [&](const std::vector<std::byte>& part) {
    return std::search(written.begin(), written.end(), part.begin(), part.end()) != written.end();
  };
  CHECK(holds(bytes(1, 2, 3)));
  CHECK(holds(bytes(4, 5, 6)));

  // A FIFO cannot be fsynced: this save fails, is counted, and lets go of x.
  writer.wait();
  CHECK(done.rung(0));
  const auto outcome = writer.takeOutcome();
  REQUIRE(outcome.has_value());
  CHECK(outcome->round == 7);
  CHECK_FALSE(outcome->path.has_value());
  CHECK(writer.failures() == 1);
  CHECK(writer.lastError().find("fsync") != std::string::npos);
  CHECK(params.use_count() == 1);
  CHECK_FALSE(writer.busy());
  CHECK(save(writer, 8, *params, velocity).has_value());
  CHECK(writer.lastRound() == 8);
}
