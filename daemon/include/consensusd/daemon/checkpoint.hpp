#pragma once
// Durable checkpoints (docs/design.md §11): one file per saved round,
// `round-<R>.ckpt`, written atomically (temp file, fsync, rename, fsync the
// folder) with a CRC over header, parameters and (with momentum) the
// velocity; the newest `keep` files are kept. Loading takes the newest file
// that verifies and reports the others.
//
// Crash testing: CONSENSUSD_FAILPOINT=checkpoint-before-fsync@N (or
// -before-rename, -before-dir-fsync) SIGKILLs the process at that point of
// its Nth save (tests/integration/durability_test.cpp).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "consensusd/daemon/wire.hpp"

namespace consensusd::daemon {

struct Checkpoint {
  std::int64_t round = 0;  // the next round to run
  // The graph it was written in: a node that runs another one since (a
  // change applied, a new file at restart) still resumes from it.
  std::uint64_t topologyHash = 0;
  std::string nodeId;      // files hold a 32-bit tag of it
  std::uint32_t node = 0;  // the node's index: files of the first format are matched by it
  wire::Dtype dtype = wire::Dtype::Float32;
  std::uint64_t dimension = 0;
  std::vector<std::byte> params;    // dimension x bytesPer(dtype)
  std::vector<std::byte> velocity;  // momentum velocity, same size; empty without momentum
};

// One checkpoint file's bytes, checked (magic, size, CRC) and matched
// against `expect` (dimension, dtype, node id; a file of the first format,
// which named the node by index, its index and topology hash); or why not.
std::variant<Checkpoint, std::string> parseCheckpoint(std::span<const std::byte> bytes,
                                                      const Checkpoint& expect);

class CheckpointStore {
 public:
  CheckpointStore(std::string folder, std::size_t keep);

  // Writes and commits; returns the path. Throws std::runtime_error on I/O errors.
  std::string save(const Checkpoint& checkpoint);
  // The same with the vectors where they are (`identity`'s are ignored):
  // written from there, never copied (a model of any size adds no memory).
  std::string save(const Checkpoint& identity, std::span<const std::byte> params,
                   std::span<const std::byte> velocity);

  struct Rejected {
    std::string path;
    std::string why;
  };
  struct Loaded {
    std::optional<Checkpoint> checkpoint;  // none: nothing valid (fresh start)
    std::string path;
    std::vector<Rejected> rejected;    // newer files that failed
    std::vector<std::string> skipped;  // named like checkpoints but not regular files
  };
  // The newest checkpoint that verifies and matches `expect` (parseCheckpoint);
  // rejected files are listed, never deleted.
  Loaded loadNewest(const Checkpoint& expect) const;

  // Renames rejected files to `<name>.rejected`: kept for inspection, no
  // longer counted as a generation (else a corrupt newest file would push a
  // good one out), and not read again.
  static void setAside(const std::vector<Rejected>& rejected);

  const std::string& folder() const { return folder_; }

 private:
  void failpoint(const char* name) const;

  std::string folder_;
  std::size_t keep_;
  std::string failpoint_;        // from CONSENSUSD_FAILPOINT: the point's name ...
  std::int64_t failAtSave_ = 0;  // ... and the save (1-based) it fires in
  std::int64_t saves_ = 0;
};

}  // namespace consensusd::daemon
