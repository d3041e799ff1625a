#include "consensusd/daemon/wire.hpp"

#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <optional>
#include <stdexcept>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace consensusd::wire {
namespace {

constexpr std::uint32_t kCrc32cPoly = 0x82F63B78u;  // CRC-32C (Castagnoli), bit-reflected

template <class T>
void put(std::array<std::byte, kHeaderSize>& out, std::size_t at, T value) {
  using U = std::make_unsigned_t<T>;
  auto bits = static_cast<U>(value);
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    out[at + i] = static_cast<std::byte>(bits & 0xffu);
    bits = static_cast<U>(bits >> 8);
  }
}

template <class T>
T get(std::span<const std::byte> in, std::size_t at) {
  using U = std::make_unsigned_t<T>;
  U bits = 0;
  for (std::size_t i = sizeof(T); i-- > 0;)
    bits = static_cast<U>((bits << 8) | std::to_integer<U>(in[at + i]));
  return static_cast<T>(bits);
}

}  // namespace

// Inf and NaN are the values whose exponent bits are all set. `high` is that
// mask on a 32-bit word holding the exponent (float: every word; double: the
// upper word of each value, the lower words are compared against an impossible
// pattern). Branch-free, 16 bytes per step with SSE2, any alignment.
bool exponentsAllClear(std::span<const std::byte> payload, bool isDouble) {
  const std::uint32_t high = isDouble ? 0x7ff00000u : 0x7f800000u;
  std::size_t at = 0;
#if defined(__x86_64__)
  const __m128i mask = isDouble
                           ? _mm_set_epi32(static_cast<int>(high), 0, static_cast<int>(high), 0)
                           : _mm_set1_epi32(static_cast<int>(high));
  const __m128i target =
      isDouble ? _mm_set_epi32(static_cast<int>(high), 1, static_cast<int>(high), 1) : mask;
  __m128i bad = _mm_setzero_si128();
  for (; at + 16 <= payload.size(); at += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(payload.data() + at));
    bad = _mm_or_si128(bad, _mm_cmpeq_epi32(_mm_and_si128(v, mask), target));
  }
  if (_mm_movemask_epi8(bad) != 0) return false;
#endif
  const std::size_t step = isDouble ? 8 : 4;
  for (; at + step <= payload.size(); at += step) {
    std::uint32_t word = 0;
    std::memcpy(&word, payload.data() + at + (isDouble ? 4 : 0), 4);  // little-endian
    if ((word & high) == high) return false;
  }
  return true;
}

namespace {

// Finiteness inside the CRC's pass, on the 64-bit words it reads anyway:
// (word & mask) + add carries into a lane's top bit exactly when the lane's
// exponent bits are all set (Inf, NaN): two float32 lanes or one float64 per
// word, no carry crossing a lane. Three integer operations a word fit in the
// ALU slots the CRC's 3-cycle latency leaves idle. mask = add = 0: none.
struct Exponents {
  std::uint64_t mask = 0;
  std::uint64_t add = 0;
  static constexpr std::uint64_t kTopBits = 0x8000000080000000ull;
};
constexpr Exponents kFloatExponents{0x7f8000007f800000ull, 0x0080000000800000ull};
constexpr Exponents kDoubleExponents{0x7ff0000000000000ull, 0x0010000000000000ull};

inline std::uint64_t exponentFlags(std::uint64_t word, Exponents e) {
  return (word & e.mask) + e.add;
}

}  // namespace

std::size_t bytesPer(Dtype dtype) {
  return dtype == Dtype::Float64 ? 8 : 4;
}

Dtype frameDtype(consensus::Compression codec) {
  switch (codec) {
    case consensus::Compression::Bf16:
      return Dtype::Bf16;
    case consensus::Compression::Fp16:
      return Dtype::Fp16;
    case consensus::Compression::Int8:
      return Dtype::Int8;
    case consensus::Compression::None:
      break;
  }
  throw std::logic_error("frameDtype: no frames without compression");
}

std::uint64_t Expectation::totalBytes(Dtype of) const {
  return of == dtype ? dimension * bytesPer(dtype)
                     : consensus::frameBytes(compression, static_cast<std::size_t>(dimension));
}

std::uint32_t crc32cPortable(std::uint32_t crc, const unsigned char* at, std::size_t bytes) {
  static const auto table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) != 0 ? (c >> 1) ^ kCrc32cPoly : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  for (std::size_t i = 0; i < bytes; ++i) crc = table[(crc ^ at[i]) & 0xffu] ^ (crc >> 8);
  return crc;
}

namespace {

// a * b modulo the CRC polynomial, bit-reflected (x^0 is the top bit), as
// zlib's crc32_combine does it.
std::uint32_t multiplyModP(std::uint32_t a, std::uint32_t b) {
  std::uint32_t product = 0;
  for (std::uint32_t m = 1u << 31; m != 0; m >>= 1) {
    if ((a & m) != 0) product ^= b;
    b = (b & 1u) != 0 ? (b >> 1) ^ kCrc32cPoly : b >> 1;
  }
  return product;
}

// x^n modulo the polynomial, bit-reflected: multiplying a CRC register by
// x^(8 * k) runs k zero bytes through it.
std::uint32_t xPowerModP(std::uint64_t n) {
  std::uint32_t result = 1u << 31;  // 1
  std::uint32_t power = 1u << 30;   // x
  for (; n != 0; n >>= 1) {
    if ((n & 1u) != 0) result = multiplyModP(power, result);
    power = multiplyModP(power, power);
  }
  return result;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) std::uint64_t crc32cWords(std::uint64_t c,
                                                            const unsigned char* at,
                                                            std::size_t words, Exponents e,
                                                            std::uint64_t& flags) {
  for (; words > 0; --words, at += 8) {
    std::uint64_t word = 0;
    std::memcpy(&word, at, 8);
    c = _mm_crc32_u64(c, word);
    flags |= exponentFlags(word, e);
  }
  return c;
}

// SSE4.2's crc32 instruction: 8 bytes per step. It has a 3-cycle latency and
// a 1-cycle throughput, so three independent streams over the three thirds of
// a large payload run about three times as fast as one; their CRCs are then
// combined (CRC(A B) = CRC(A) shifted over |B| zero bytes, xor CRC of B from 0).
// `flags` collects exponentFlags of every whole value (a trailing 4 bytes
// count as one float32).
__attribute__((target("sse4.2"))) std::uint32_t crc32cHardware(std::uint32_t crc,
                                                               const unsigned char* at,
                                                               std::size_t bytes, Exponents e,
                                                               std::uint64_t& flags) {
  std::uint64_t c = crc;
  constexpr std::size_t kThreeStreamsFrom = 3 * 4096;  // below: the combine costs more
  if (bytes >= kThreeStreamsFrom) {
    const std::size_t words = bytes / 24;  // per stream
    const unsigned char* b = at + 8 * words;
    const unsigned char* d = b + 8 * words;
    std::uint64_t c1 = 0;
    std::uint64_t c2 = 0;
    for (std::size_t i = 0; i < words; ++i, at += 8, b += 8, d += 8) {
      std::uint64_t w0 = 0;
      std::uint64_t w1 = 0;
      std::uint64_t w2 = 0;
      std::memcpy(&w0, at, 8);
      std::memcpy(&w1, b, 8);
      std::memcpy(&w2, d, 8);
      c = _mm_crc32_u64(c, w0);
      c1 = _mm_crc32_u64(c1, w1);
      c2 = _mm_crc32_u64(c2, w2);
      flags |= exponentFlags(w0, e) | exponentFlags(w1, e) | exponentFlags(w2, e);
    }
    const std::uint32_t shift = xPowerModP(64 * words);
    c = multiplyModP(shift, static_cast<std::uint32_t>(c)) ^ static_cast<std::uint32_t>(c1);
    c = multiplyModP(shift, static_cast<std::uint32_t>(c)) ^ static_cast<std::uint32_t>(c2);
    at = d;
    bytes -= 24 * words;
  }
  c = crc32cWords(c, at, bytes / 8, e, flags);
  at += bytes / 8 * 8;
  bytes %= 8;
  if (bytes == 4) {  // a last float32: the low lane of a word, the high lane zero
    std::uint32_t last = 0;
    std::memcpy(&last, at, 4);
    flags |= exponentFlags(last, e) & 0xffffffffull;
  }
  auto rest = static_cast<std::uint32_t>(c);
  for (; bytes > 0; --bytes, ++at) rest = _mm_crc32_u8(rest, *at);
  return rest;
}

// Carry-less multiplication folding (Intel, "Fast CRC Computation for Generic
// Polynomials Using PCLMULQDQ"), 256-bit wide: the CRC-32 instruction does 8
// bytes a cycle at best, a vpclmulqdq pair folds 32. Take 128 bits of pending
// message A = H x^64 + L (H the first 8 bytes, bit-reflected as the CRC is)
// that F bits of message B follow: A x^F + B = H x^(F+64) + L x^F + B, and
// modulo P each product is a 64 x 32-bit carry-less product, so 128 bits
// again. A reflected product comes out multiplied by x, hence x^(F+63) and
// x^(F-1). What is left after the last fold is CRC'd as 16 message bytes.
//
// {x^(F+63), x^(F-1)} for a fold over F bits, each reflected into the top
// half of a 64-bit clmul operand (bit j is x^(63-j)).
struct FoldPair {
  std::uint64_t first;
  std::uint64_t second;
};

FoldPair foldPair(std::uint64_t f) {
  static constexpr auto operand = [](std::uint32_t r) { return std::uint64_t{r} << 32; };
  return {operand(xPowerModP(f + 63)), operand(xPowerModP(f - 1))};
}

const std::array<FoldPair, 2>& foldConstants() {
  static const std::array<FoldPair, 2> constants{foldPair(128), foldPair(1024)};
  return constants;  // one 16-byte block onto the next; 128 bytes ahead
}

__attribute__((target("pclmul"))) __m128i fold16(__m128i a, __m128i next, __m128i k) {
  return _mm_xor_si128(
      _mm_xor_si128(_mm_clmulepi64_si128(a, k, 0x00), _mm_clmulepi64_si128(a, k, 0x11)), next);
}

__attribute__((target("avx2,vpclmulqdq"))) __m256i fold32(__m256i a, __m256i next, __m256i k) {
  return _mm256_xor_si256(
      _mm256_xor_si256(_mm256_clmulepi64_epi128(a, k, 0x00), _mm256_clmulepi64_epi128(a, k, 0x11)),
      next);
}

// 32 bytes, their exponentFlags or'd into `seen`.
__attribute__((target("avx2"), always_inline)) inline __m256i load32(const unsigned char* from,
                                                                     __m256i mask, __m256i add,
                                                                     __m256i& seen) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from));
  seen = _mm256_or_si256(seen, _mm256_add_epi64(_mm256_and_si256(v, mask), add));
  return v;
}

constexpr std::size_t kFoldingFrom = 256;  // bytes; below, the final folds cost more

// crc32cHardware's contract, folding payloads of kFoldingFrom bytes or more.
__attribute__((target("avx2,vpclmulqdq,pclmul,sse4.2"))) std::uint32_t crc32cFolding(
    std::uint32_t crc, const unsigned char* at, std::size_t bytes, Exponents e,
    std::uint64_t& flags) {
  if (bytes < kFoldingFrom) return crc32cHardware(crc, at, bytes, e, flags);
  const auto [by16, by128] = foldConstants();
  const __m128i k16 =
      _mm_set_epi64x(static_cast<long long>(by16.second), static_cast<long long>(by16.first));
  const __m256i k128 =
      _mm256_set_epi64x(static_cast<long long>(by128.second), static_cast<long long>(by128.first),
                        static_cast<long long>(by128.second), static_cast<long long>(by128.first));
  const __m256i mask = _mm256_set1_epi64x(static_cast<long long>(e.mask));
  const __m256i add = _mm256_set1_epi64x(static_cast<long long>(e.add));
  __m256i seen = _mm256_setzero_si256();
  // The register's value enters as the message's first 32 bits.
  __m256i acc[4] = {_mm256_xor_si256(load32(at, mask, add, seen), _mm256_set_epi64x(0, 0, 0, crc)),
                    load32(at + 32, mask, add, seen), load32(at + 64, mask, add, seen),
                    load32(at + 96, mask, add, seen)};
  at += 128;
  bytes -= 128;
  for (; bytes >= 128; at += 128, bytes -= 128)
    for (int j = 0; j < 4; ++j) acc[j] = fold32(acc[j], load32(at + 32 * j, mask, add, seen), k128);
  // The eight 16-byte blocks in message order, folded into one.
  __m128i x = _mm256_castsi256_si128(acc[0]);
  for (int j = 0; j < 4; ++j) {
    if (j > 0) x = fold16(x, _mm256_castsi256_si128(acc[j]), k16);
    x = fold16(x, _mm256_extracti128_si256(acc[j], 1), k16);
  }
  __m128i seen16 = _mm_or_si128(_mm256_castsi256_si128(seen), _mm256_extracti128_si256(seen, 1));
  for (; bytes >= 16; at += 16, bytes -= 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(at));
    seen16 = _mm_or_si128(seen16, _mm_add_epi64(_mm_and_si128(v, _mm256_castsi256_si128(mask)),
                                                _mm256_castsi256_si128(add)));
    x = fold16(x, v, k16);
  }
  flags |= static_cast<std::uint64_t>(_mm_cvtsi128_si64(seen16)) |
           static_cast<std::uint64_t>(_mm_extract_epi64(seen16, 1));
  std::uint64_t c = _mm_crc32_u64(0, static_cast<std::uint64_t>(_mm_cvtsi128_si64(x)));
  c = _mm_crc32_u64(c, static_cast<std::uint64_t>(_mm_extract_epi64(x, 1)));
  return crc32cHardware(static_cast<std::uint32_t>(c), at, bytes, e, flags);
}
#endif

}  // namespace

namespace {

// The path every checksum takes: the fastest this CPU has, unless a test or
// benchmark picks another (useCrcPath).
std::atomic<CrcPath>& chosenPath() {
  static std::atomic<CrcPath> path{crcPaths().back()};
  return path;
}

// CRC-32C update and finiteness flags in one pass (not on the portable path).
std::uint32_t crc32cFlagged(CrcPath path, std::uint32_t crc, const unsigned char* at,
                            std::size_t bytes, Exponents e, std::uint64_t& flags) {
#if defined(__x86_64__)
  if (path == CrcPath::Folding) return crc32cFolding(crc, at, bytes, e, flags);
  return crc32cHardware(crc, at, bytes, e, flags);
#else
  (void)path, (void)e, (void)flags;
  return crc32cPortable(crc, at, bytes);
#endif
}

// The payload's checksum matches, and no value is Inf or NaN: one pass
// where the CPU has SSE4.2 (the payload is read once, not twice).
std::optional<Reject> checkPayload(std::span<const std::byte> payload, std::uint32_t expected,
                                   bool isDouble) {
  const auto* at = reinterpret_cast<const unsigned char*>(payload.data());
  if (const CrcPath path = chosenPath().load(std::memory_order_relaxed);
      path != CrcPath::Portable) {
    std::uint64_t flags = 0;
    const std::uint32_t crc = ~crc32cFlagged(path, ~0u, at, payload.size(),
                                             isDouble ? kDoubleExponents : kFloatExponents, flags);
    if (crc != expected) return Reject::Checksum;
    return (flags & Exponents::kTopBits) != 0 ? std::optional(Reject::NonFinite) : std::nullopt;
  }
  if (~crc32cPortable(~0u, at, payload.size()) != expected) return Reject::Checksum;
  if (!exponentsAllClear(payload, isDouble)) return Reject::NonFinite;
  return std::nullopt;
}

}  // namespace

std::vector<CrcPath> crcPaths() {
  std::vector<CrcPath> paths{CrcPath::Portable};
#if defined(__x86_64__)
  if (__builtin_cpu_supports("sse4.2")) paths.push_back(CrcPath::Sse42);
  if (__builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("pclmul") &&
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("vpclmulqdq"))
    paths.push_back(CrcPath::Folding);
#endif
  return paths;
}

void useCrcPath(CrcPath path) {
  chosenPath().store(path, std::memory_order_relaxed);
}

std::uint32_t checksum(const void* data, std::size_t bytes, std::uint32_t previous) {
  const auto* at = static_cast<const unsigned char*>(data);
  const CrcPath path = chosenPath().load(std::memory_order_relaxed);
  if (path == CrcPath::Portable) return ~crc32cPortable(~previous, at, bytes);
  std::uint64_t unused = 0;
  return ~crc32cFlagged(path, ~previous, at, bytes, Exponents{}, unused);
}

std::array<std::byte, kHeaderSize> encode(const Header& header) {
  std::array<std::byte, kHeaderSize> out{};
  put(out, 0, kMagic);
  put(out, 4, kVersion);
  put(out, 6, static_cast<std::uint8_t>(header.kind));
  put(out, 7, static_cast<std::uint8_t>(header.dtype));
  put(out, 8, header.sender);
  put(out, 12, header.checksum);
  put(out, 16, header.round);
  put(out, 24, header.dimension);
  put(out, 32, header.topologyHash);
  put(out, 40, header.base);
  put(out, 48, header.payloadBytes);
  put(out, 56, header.kind == Kind::Estimate ? header.offset : header.flags);
  return out;
}

std::variant<Header, Reject> decodeHeader(std::span<const std::byte> frame) {
  if (frame.size() != kHeaderSize) return Reject::Size;
  if (get<std::uint32_t>(frame, 0) != kMagic) return Reject::Magic;
  if (get<std::uint16_t>(frame, 4) != kVersion) return Reject::Version;
  const auto kind = get<std::uint8_t>(frame, 6);
  if (kind < 1 || kind > 6) return Reject::Kind;
  const auto dtype = get<std::uint8_t>(frame, 7);
  if (dtype < 1 || dtype > 5) return Reject::Dtype;
  Header header;
  header.kind = static_cast<Kind>(kind);
  header.dtype = static_cast<Dtype>(dtype);
  header.sender = get<std::uint32_t>(frame, 8);
  header.checksum = get<std::uint32_t>(frame, 12);
  header.round = get<std::int64_t>(frame, 16);
  header.dimension = get<std::uint64_t>(frame, 24);
  header.topologyHash = get<std::uint64_t>(frame, 32);
  header.base = get<std::int64_t>(frame, 40);
  header.payloadBytes = get<std::uint64_t>(frame, 48);
  (header.kind == Kind::Estimate ? header.offset : header.flags) = get<std::uint64_t>(frame, 56);
  return header;
}

std::optional<Reject> validate(const Header& header, std::span<const std::byte> payload,
                               const Expectation& expect) {
  if (header.topologyHash != expect.topologyHash) return Reject::Topology;
  // A whole estimate has the parameters' dtype; anything else, frames
  // included, the link's (so nodes that differ in compression never talk).
  const bool whole = header.kind == Kind::Estimate && header.dtype == expect.dtype;
  if (!whole && header.dtype != expect.linkDtype()) return Reject::Dtype;
  if (header.dimension != expect.dimension) return Reject::Dimension;
  if (header.kind != Kind::Estimate)
    return payload.empty() ? std::nullopt : std::optional(Reject::Length);
  if (header.round < 0) return Reject::Round;
  const std::uint64_t total = expect.totalBytes(header.dtype);
  const std::uint64_t unit = whole ? bytesPer(expect.dtype) : 1;
  const std::uint64_t bytes = payload.size();
  if (bytes != header.payloadBytes || bytes == 0 || bytes % unit != 0 ||
      header.offset % unit != 0 || header.offset > total || bytes > total - header.offset) {
    return Reject::Length;
  }
  if (!whole)
    return checksum(payload.data(), payload.size()) == header.checksum
               ? std::nullopt
               : std::optional(Reject::Checksum);
  return checkPayload(payload, header.checksum, expect.dtype == Dtype::Float64);
}

const char* toString(Reject reason) {
  return data::nameOf(kRejectNames, reason).data();
}

}  // namespace consensusd::wire
