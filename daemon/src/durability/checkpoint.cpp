#include "consensusd/daemon/checkpoint.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <stdexcept>
#include <system_error>

namespace consensusd::daemon {
namespace {

namespace fs = std::filesystem;

// Format 2 names the node by a tag of its id (the same file resumes in a
// graph where its index differs); format 1 named it by index in one graph.
constexpr char kMagic[8] = {'C', 'N', 'S', 'D', 'C', 'K', 'P', '2'};
constexpr char kMagicByIndex[8] = {'C', 'N', 'S', 'D', 'C', 'K', 'P', '1'};

// FNV-1a, 32 bits: a node's id in the header's fixed field.
std::uint32_t idTag(const std::string& id) {
  std::uint32_t hash = 2166136261u;
  for (const char c : id) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 16777619u;
  }
  return hash;
}
constexpr std::size_t kHeaderBytes = 8 + 8 + 8 + 4 + 4 + 8 + 4;  // magic .. vectors, see save()

template <class T>
void append(std::vector<std::byte>& out, T value) {
  const auto* bytes =
      reinterpret_cast<const std::byte*>(&value);  // little-endian hosts only (x86, arm64)
  out.insert(out.end(), bytes, bytes + sizeof(T));
}

template <class T>
T read(std::span<const std::byte> in, std::size_t at) {
  T value;
  std::memcpy(&value, in.data() + at, sizeof(T));
  return value;
}

void check(int result, const std::string& what) {
  if (result < 0) throw std::system_error(errno, std::generic_category(), what);
}

void writeAll(int fd, std::span<const std::byte> bytes, const std::string& path) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    check(static_cast<int>(n < 0 ? -1 : 0), "write " + path);
    done += static_cast<std::size_t>(n);
  }
}

void fsyncPath(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  check(fd, "open " + path);
  const int result = ::fsync(fd);
  ::close(fd);
  check(result, "fsync " + path);
}

struct Listing {
  std::vector<std::pair<std::int64_t, fs::path>> rounds;  // round-<R>.ckpt, newest first
  std::vector<fs::path> temps;                            // .round-<R>.ckpt.tmp
  std::vector<fs::path> skipped;  // named like a checkpoint, not a regular file
};

Listing listFiles(const std::string& folder) {
  Listing listing;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(folder, error)) {
    const std::string name = entry.path().filename().string();
    const bool temp = name.rfind(".round-", 0) == 0 && entry.path().extension() == ".tmp";
    const bool round = name.rfind("round-", 0) == 0 && entry.path().extension() == ".ckpt";
    if (!temp && !round) continue;
    std::error_code kind;
    if (!entry.is_regular_file(kind)) {  // a directory, FIFO, socket...: never read or removed
      listing.skipped.push_back(entry.path());
      continue;
    }
    if (temp) listing.temps.push_back(entry.path());
    if (!round) continue;
    try {
      listing.rounds.emplace_back(std::stoll(name.substr(6)), entry.path());
    } catch (const std::exception&) {
      continue;  // not ours
    }
  }
  std::sort(listing.rounds.begin(), listing.rounds.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  return listing;
}

}  // namespace

CheckpointStore::CheckpointStore(std::string folder, std::size_t keep)
    : folder_(std::move(folder)), keep_(keep) {
  if (const char* spec = std::getenv("CONSENSUSD_FAILPOINT")) {
    const std::string text = spec;
    const std::size_t at = text.find('@');
    failpoint_ = text.substr(0, at);
    failAtSave_ = at == std::string::npos ? 1 : std::atoll(text.c_str() + at + 1);
  }
}

void CheckpointStore::failpoint(const char* name) const {
  if (saves_ == failAtSave_ && failpoint_ == name) ::raise(SIGKILL);
}

std::string CheckpointStore::save(const Checkpoint& checkpoint) {
  return save(checkpoint, checkpoint.params, checkpoint.velocity);
}

std::string CheckpointStore::save(const Checkpoint& checkpoint, std::span<const std::byte> params,
                                  std::span<const std::byte> velocity) {
  ++saves_;
  fs::create_directories(folder_);
  std::vector<std::byte> header;
  header.insert(header.end(), reinterpret_cast<const std::byte*>(kMagic),
                reinterpret_cast<const std::byte*>(kMagic) + 8);
  append(header, checkpoint.round);
  append(header, checkpoint.topologyHash);
  append(header, idTag(checkpoint.nodeId));
  append(header, static_cast<std::uint32_t>(checkpoint.dtype));
  append(header, checkpoint.dimension);
  if (!velocity.empty() && velocity.size() != params.size())
    throw std::invalid_argument("checkpoint velocity and parameters differ in size");
  // Vectors that follow the header: the parameters, then the velocity if any.
  append(header, static_cast<std::uint32_t>(velocity.empty() ? 1 : 2));
  std::vector<std::byte> trailer;
  append(trailer, wire::checksum(velocity.data(), velocity.size(),
                                 wire::checksum(params.data(), params.size(),
                                                wire::checksum(header.data(), header.size()))));

  char name[40];
  std::snprintf(name, sizeof name, "round-%012lld.ckpt", static_cast<long long>(checkpoint.round));
  std::string path = folder_ + "/" + name;
  const std::string temp = folder_ + "/." + name + ".tmp";
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  check(fd, "open " + temp);
  bool open = true;
  try {
    for (const std::span<const std::byte> part : {std::span<const std::byte>(header), params,
                                                  velocity, std::span<const std::byte>(trailer)})
      writeAll(fd, part, temp);
    failpoint("checkpoint-before-fsync");
    check(::fsync(fd), "fsync " + temp);
    open = false;  // closed even when close reports an error
    check(::close(fd), "close " + temp);
  } catch (...) {
    if (open) ::close(fd);
    ::unlink(temp.c_str());  // a full disk keeps no partial file; older generations stay
    throw;
  }
  failpoint("checkpoint-before-rename");
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(temp.c_str());
    throw std::system_error(error, std::generic_category(), "rename " + temp);
  }
  failpoint("checkpoint-before-dir-fsync");
  fsyncPath(folder_, O_RDONLY | O_DIRECTORY);

  // Committed: older generations beyond `keep`, and temp files a crash left, go.
  const auto [rounds, temps, skipped] = listFiles(folder_);
  std::error_code ignored;
  for (std::size_t i = keep_; i < rounds.size(); ++i) fs::remove(rounds[i].second, ignored);
  for (const fs::path& leftover : temps) fs::remove(leftover, ignored);
  return path;
}

std::variant<Checkpoint, std::string> parseCheckpoint(std::span<const std::byte> bytes,
                                                      const Checkpoint& expect) {
  if (bytes.size() < kHeaderBytes + 4) return "truncated: size " + std::to_string(bytes.size());
  const bool byIndex = std::memcmp(bytes.data(), kMagicByIndex, 8) == 0;
  if (!byIndex && std::memcmp(bytes.data(), kMagic, 8) != 0) return "not a consensusd checkpoint";
  const std::size_t paramBytes = expect.dimension * wire::bytesPer(expect.dtype);
  // Files of the first format wrote 0 here and held the parameters only.
  const auto vectors = std::max<std::uint32_t>(1, read<std::uint32_t>(bytes, 40));
  const std::size_t expected = kHeaderBytes + vectors * paramBytes + 4;
  if (vectors > 2 || bytes.size() != expected)
    return "size " + std::to_string(bytes.size()) + ", expected " + std::to_string(expected);
  if (wire::checksum(bytes.data(), bytes.size() - 4) !=
      read<std::uint32_t>(bytes, bytes.size() - 4))
    return "checksum mismatch (torn or corrupt)";
  Checkpoint checkpoint;
  checkpoint.round = read<std::int64_t>(bytes, 8);
  checkpoint.topologyHash = read<std::uint64_t>(bytes, 16);
  checkpoint.node = read<std::uint32_t>(bytes, 24);
  checkpoint.dtype = static_cast<wire::Dtype>(read<std::uint32_t>(bytes, 28));
  checkpoint.dimension = read<std::uint64_t>(bytes, 32);
  const bool sameNode =
      byIndex ? checkpoint.topologyHash == expect.topologyHash && checkpoint.node == expect.node
              : checkpoint.node == idTag(expect.nodeId);
  if (!sameNode || checkpoint.dtype != expect.dtype || checkpoint.dimension != expect.dimension)
    return byIndex ? "written for another topology, node, dtype or model"
                   : "written for another node, dtype or model";
  checkpoint.nodeId = expect.nodeId;
  const auto params = bytes.subspan(kHeaderBytes, paramBytes);
  checkpoint.params.assign(params.begin(), params.end());
  if (vectors == 2) {
    const auto velocity = bytes.subspan(kHeaderBytes + paramBytes, paramBytes);
    checkpoint.velocity.assign(velocity.begin(), velocity.end());
  }
  return checkpoint;
}

CheckpointStore::Loaded CheckpointStore::loadNewest(const Checkpoint& expect) const {
  Loaded loaded;
  const Listing listing = listFiles(folder_);
  for (const fs::path& path : listing.skipped) loaded.skipped.push_back(path.string());
  for (const auto& [round, path] : listing.rounds) {
    std::ifstream in(path, std::ios::binary);
    const std::vector<char> raw((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
    auto parsed = parseCheckpoint(std::as_bytes(std::span(raw)), expect);
    if (auto* why = std::get_if<std::string>(&parsed)) {
      loaded.rejected.push_back({path.string(), std::move(*why)});
      continue;
    }
    loaded.checkpoint = std::move(std::get<Checkpoint>(parsed));
    loaded.path = path.string();
    return loaded;
  }
  return loaded;
}

void CheckpointStore::setAside(const std::vector<Rejected>& rejected) {
  for (const Rejected& file : rejected) {
    std::error_code ignored;
    fs::rename(file.path, file.path + ".rejected", ignored);
  }
}

}  // namespace consensusd::daemon
