// IDX files (MNIST, Fashion-MNIST), gzip-compressed or plain.

#include <zlib.h>

#include <filesystem>
#include <memory>

#include "consensusd/data/dataset.hpp"

namespace consensusd::data {
namespace {

constexpr std::size_t kMaxIdxBytes = std::size_t{1} << 31;

[[noreturn]] void fail(const std::string& file, std::size_t byte, const std::string& message) {
  throw DataError(file + ": byte " + std::to_string(byte) + ": " + message);
}

// The whole (decompressed) file; zlib reads plain files transparently.
std::vector<unsigned char> readGzip(const std::string& file) {
  const std::unique_ptr<gzFile_s, int (*)(gzFile)> in(gzopen(file.c_str(), "rb"), gzclose);
  if (!in) throw DataError(file + ": cannot open file");
  std::vector<unsigned char> bytes;
  unsigned char buffer[1 << 16];
  for (;;) {
    const int n = gzread(in.get(), buffer, sizeof buffer);
    if (n < 0) break;
    bytes.insert(bytes.end(), buffer, buffer + n);
    if (bytes.size() > kMaxIdxBytes) fail(file, bytes.size(), "larger than 2 GiB decompressed");
    if (n == 0) break;
  }
  int code = Z_OK;
  const char* message = gzerror(in.get(), &code);
  if (code != Z_OK && code != Z_STREAM_END) {
    fail(file, bytes.size(), std::string("corrupt or truncated gzip data (zlib: ") + message + ")");
  }
  return bytes;
}

std::uint32_t bigEndian(const std::vector<unsigned char>& bytes, std::size_t at) {
  return (std::uint32_t{bytes[at]} << 24) | (std::uint32_t{bytes[at + 1]} << 16) |
         (std::uint32_t{bytes[at + 2]} << 8) | std::uint32_t{bytes[at + 3]};
}

struct IdxArray {
  std::vector<std::uint32_t> dims;
  std::vector<unsigned char> bytes;  // header included
  std::size_t dataOffset = 0;
};

// Unsigned-byte IDX array with `expectedDims` dimensions.
IdxArray readIdxArray(const std::string& file, std::uint32_t expectedDims) {
  IdxArray array;
  array.bytes = readGzip(file);
  const auto& bytes = array.bytes;
  if (bytes.size() < 4) fail(file, bytes.size(), "too short for an IDX header");
  const std::uint32_t magic = bigEndian(bytes, 0);
  const std::uint32_t expected = 0x0800u | expectedDims;
  if (magic != expected) {
    char text[80];
    std::snprintf(text, sizeof text, "wrong IDX magic 0x%08x, expected 0x%08x", magic, expected);
    fail(file, 0, text);
  }
  array.dataOffset = 4 + 4 * std::size_t{expectedDims};
  if (bytes.size() < array.dataOffset) fail(file, bytes.size(), "truncated IDX header");
  std::size_t count = 1;
  for (std::uint32_t d = 0; d < expectedDims; ++d) {
    array.dims.push_back(bigEndian(bytes, 4 + 4 * std::size_t{d}));
    count *= array.dims.back();
    if (count > kMaxIdxBytes) fail(file, 4 + 4 * std::size_t{d}, "dimensions too large");
  }
  if (bytes.size() - array.dataOffset != count) {
    fail(file, bytes.size(),
         "expected " + std::to_string(count) + " data bytes after the header, found " +
             std::to_string(bytes.size() - array.dataOffset));
  }
  return array;
}

std::string firstExisting(const std::string& folder, const std::string& name) {
  std::string plain = folder;
  plain += '/';
  plain += name;
  for (const std::string& candidate : {plain + ".gz", plain}) {
    if (std::filesystem::exists(candidate)) return candidate;
  }
  throw DataError(folder + "/" + name + ".gz: cannot open file");
}

}  // namespace

Dataset readIdx(const std::string& imagesFile, const std::string& labelsFile) {
  const IdxArray images = readIdxArray(imagesFile, 3);
  const IdxArray labels = readIdxArray(labelsFile, 1);
  const std::size_t n = images.dims[0];
  if (labels.dims[0] != n) {
    throw DataError(labelsFile + ": byte 4: " + std::to_string(labels.dims[0]) + " labels for " +
                    std::to_string(n) + " images in " + imagesFile);
  }
  const std::size_t dimension = std::size_t{images.dims[1]} * images.dims[2];
  Dataset data;
  data.features.resize(static_cast<Eigen::Index>(dimension), static_cast<Eigen::Index>(n));
  const unsigned char* pixels = images.bytes.data() + images.dataOffset;
  float* out = data.features.data();
  for (std::size_t i = 0; i < n * dimension; ++i) out[i] = static_cast<float>(pixels[i]);
  data.labels.resize(n);
  std::int32_t largest = 0;
  for (std::size_t i = 0; i < n; ++i) {
    data.labels[i] = labels.bytes[labels.dataOffset + i];
    largest = std::max(largest, data.labels[i]);
  }
  data.classes = largest + 1;
  return data;
}

TrainTest readIdxFolder(const std::string& folder) {
  TrainTest data;
  data.train = readIdx(firstExisting(folder, "train-images-idx3-ubyte"),
                       firstExisting(folder, "train-labels-idx1-ubyte"));
  data.test = readIdx(firstExisting(folder, "t10k-images-idx3-ubyte"),
                      firstExisting(folder, "t10k-labels-idx1-ubyte"));
  if (data.train.dimension() != data.test.dimension()) {
    throw DataError(folder + ": train and test images differ in size");
  }
  data.train.classes = data.test.classes = std::max(data.train.classes, data.test.classes);
  return data;
}

}  // namespace consensusd::data
