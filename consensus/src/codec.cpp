#include "consensusd/consensus/codec.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "cpu_features.hpp"

namespace consensusd::consensus {
namespace {

// The sender adds its own frame to its copy through the same decode as the
// receiver (applyBlock), and this file is built without floating-point
// contraction (CMakeLists.txt): both copies get the same bits.

constexpr float kFp16Max = 65504.0f;

std::uint16_t toBf16(float value) {
  const auto bits = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t rounded = bits + 0x7fffu + ((bits >> 16) & 1u);  // to nearest even
  // Rounding up past the largest bf16 would give Inf: truncate there instead.
  const bool overflows = ((rounded >> 23) & 0xffu) == 0xffu;
  return static_cast<std::uint16_t>((overflows ? bits : rounded) >> 16);
}

float fromBf16(std::uint16_t half) {
  return std::bit_cast<float>(std::uint32_t{half} << 16);
}

std::uint16_t toFp16(float value) {
  value = std::clamp(value, -kFp16Max, kFp16Max);
  const auto bits = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude < 0x38800000u) {  // below 2^-14: a subnormal half (or its smallest normal)
    const float scaled = std::bit_cast<float>(magnitude) * 16777216.0f;  // units of 2^-24
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(std::nearbyint(scaled)));
  }
  std::uint32_t rebiased = magnitude - (std::uint32_t{127 - 15} << 23);
  rebiased += 0xfffu + ((rebiased >> 13) & 1u);  // to nearest even
  return static_cast<std::uint16_t>(sign | (rebiased >> 13));
}

float fromFp16(std::uint16_t half) {
  const std::uint32_t sign = std::uint32_t{half & 0x8000u} << 16;
  const std::uint32_t exponent = (half >> 10) & 0x1fu;
  const std::uint32_t mantissa = half & 0x3ffu;
  if (exponent == 0) {
    const float value = static_cast<float>(mantissa) * 5.9604644775390625e-8f;  // 2^-24
    return sign != 0 ? -value : value;
  }
  return std::bit_cast<float>(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
}

// Little-endian 16-bit values, byte by byte (the loops vectorise these).
std::uint16_t load16(const std::byte* at) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(at);
  return static_cast<std::uint16_t>(bytes[0] | bytes[1] << 8);
}

void store16(std::byte* at, std::uint16_t value) {
  auto* bytes = reinterpret_cast<unsigned char*>(at);
  bytes[0] = static_cast<unsigned char>(value & 0xffu);
  bytes[1] = static_cast<unsigned char>(value >> 8);
}

float loadFloat(const std::byte* at) {
  float value;
  std::memcpy(&value, at, sizeof value);
  return value;
}

std::size_t blocks(std::size_t dimension) {
  return (dimension + kInt8Block - 1) / kInt8Block;
}

// copy[0, n) += decode(frame); false when a sum is not finite as a float.
// The frame was checked: every value and scale is finite. Plain loops of
// elementwise operations in a fixed order, so that any vector width gives
// the same bits (a sender and a receiver may run different kernels).
template <class Scalar>
[[gnu::always_inline]] inline bool applyBlock(Compression codec, const std::byte* frame,
                                              Scalar* copy, std::size_t n) {
  float poison = 0;  // 0 while every sum is finite as a float, else NaN (x * 0 is NaN for Inf)
  if (codec == Compression::Int8) {
    const auto scale = static_cast<Scalar>(loadFloat(frame));
    const auto* q = reinterpret_cast<const std::int8_t*>(frame + sizeof(float));
#pragma omp simd reduction(+ : poison)
    for (std::size_t i = 0; i < n; ++i) {
      copy[i] += static_cast<Scalar>(q[i]) * scale;
      poison += static_cast<float>(copy[i]) * 0.0f;
    }
    return poison == 0;
  }
  if (codec == Compression::Bf16) {
#pragma omp simd reduction(+ : poison)
    for (std::size_t i = 0; i < n; ++i) {
      copy[i] += static_cast<Scalar>(fromBf16(load16(frame + 2 * i)));
      poison += static_cast<float>(copy[i]) * 0.0f;
    }
    return poison == 0;
  }
#pragma omp simd reduction(+ : poison)
  for (std::size_t i = 0; i < n; ++i) {
    copy[i] += static_cast<Scalar>(fromFp16(load16(frame + 2 * i)));
    poison += static_cast<float>(copy[i]) * 0.0f;
  }
  return poison == 0;
}

// The bytes of block `b` (int8) or of coordinates [begin, begin + n) (16-bit codecs).
std::size_t blockOffset(Compression codec, std::size_t begin) {
  return codec == Compression::Int8 ? begin / kInt8Block * (sizeof(float) + kInt8Block) : 2 * begin;
}

bool frameFinite(Compression codec, std::span<const std::byte> frame, std::size_t dimension) {
  if (codec == Compression::Int8) {
    for (std::size_t b = 0; b < blocks(dimension); ++b) {
      const float scale = loadFloat(frame.data() + b * (sizeof(float) + kInt8Block));
      // Every decoded value q * scale, |q| <= 128, must be a finite float.
      if (!(scale >= 0 && scale <= std::numeric_limits<float>::max() / 128)) return false;
    }
    return true;
  }
  // Inf or NaN: every exponent bit set.
  const std::uint16_t exponent = codec == Compression::Bf16 ? 0x7f80u : 0x7c00u;
  std::size_t notFinite = 0;
#pragma omp simd reduction(+ : notFinite)
  for (std::size_t i = 0; i < dimension; ++i)
    notFinite += (load16(frame.data() + 2 * i) & exponent) == exponent;
  return notFinite == 0;
}

// The sender's pass over [0, x.size()): one int8 block, or as many 16-bit
// values, at a time.
template <class Scalar>
[[gnu::always_inline]] inline void encodeBlocks(Compression codec, const Scalar* x, Scalar* copy,
                                                std::byte* frame, std::size_t dimension) {
  for (std::size_t begin = 0; begin < dimension; begin += kInt8Block) {
    const std::size_t n = std::min(kInt8Block, dimension - begin);
    const Scalar* xs = x + begin;
    Scalar* cs = copy + begin;
    std::byte* out = frame + blockOffset(codec, begin);
    if (codec == Compression::Int8) {
      float absmax = 0;
#pragma omp simd reduction(max : absmax)
      for (std::size_t i = 0; i < n; ++i)
        absmax = std::max(absmax, static_cast<float>(std::abs(xs[i] - cs[i])));
      // At most what a receiver accepts (frameFinite): a difference past the
      // float range (a diverged model) still makes a frame it can check.
      const float scale = std::min(absmax / 127.0f, std::numeric_limits<float>::max() / 128);
      const float inverse = scale > 0 ? 1.0f / scale : 0.0f;
      std::memcpy(out, &scale, sizeof scale);
      auto* q = reinterpret_cast<std::int8_t*>(out + sizeof(float));
#pragma omp simd
      for (std::size_t i = 0; i < n; ++i) {
        const float scaled = static_cast<float>(xs[i] - cs[i]) * inverse;
        q[i] = static_cast<std::int8_t>(std::clamp(std::nearbyint(scaled), -127.0f, 127.0f));
      }
    } else if (codec == Compression::Bf16) {
#pragma omp simd
      for (std::size_t i = 0; i < n; ++i)
        store16(out + 2 * i, toBf16(static_cast<float>(xs[i] - cs[i])));
    } else {
#pragma omp simd
      for (std::size_t i = 0; i < n; ++i)
        store16(out + 2 * i, toFp16(static_cast<float>(xs[i] - cs[i])));
    }
    applyBlock(codec, out, cs, n);
  }
}

// The receiver's pass, after frameFinite; false when a sum is not finite.
template <class Scalar>
[[gnu::always_inline]] inline bool applyBlocks(Compression codec, const std::byte* frame,
                                               Scalar* copy, std::size_t dimension) {
  bool finite = true;
  for (std::size_t begin = 0; begin < dimension; begin += kInt8Block) {
    const std::size_t n = std::min(kInt8Block, dimension - begin);
    finite &= applyBlock(codec, frame + blockOffset(codec, begin), copy + begin, n);
  }
  return finite;
}

template <class Scalar>
void encodeBaseline(Compression codec, const Scalar* x, Scalar* copy, std::byte* frame,
                    std::size_t dimension) {
  encodeBlocks(codec, x, copy, frame, dimension);
}

template <class Scalar>
bool applyBaseline(Compression codec, const std::byte* frame, Scalar* copy, std::size_t dimension) {
  return applyBlocks(codec, frame, copy, dimension);
}

#if defined(__x86_64__)
// The same passes with AVX2's registers (and its rounding instruction for
// int8), chosen at run time: the binaries target baseline x86-64.
template <class Scalar>
__attribute__((target("avx2"))) void encodeAvx2(Compression codec, const Scalar* x, Scalar* copy,
                                                std::byte* frame, std::size_t dimension) {
  encodeBlocks(codec, x, copy, frame, dimension);
}

template <class Scalar>
__attribute__((target("avx2"))) bool applyAvx2(Compression codec, const std::byte* frame,
                                               Scalar* copy, std::size_t dimension) {
  return applyBlocks(codec, frame, copy, dimension);
}

#endif

bool haveAvx2(Kernels kernels) {
  return kernels == Kernels::Best && cpuHasAvx2();
}

}  // namespace

std::size_t frameBytes(Compression codec, std::size_t dimension) {
  if (codec == Compression::None) throw std::logic_error("codec: no frame for 'none'");
  if (codec == Compression::Int8) return blocks(dimension) * sizeof(float) + dimension;
  return 2 * dimension;
}

template <class Scalar>
void encodeDifference(Compression codec, std::span<const Scalar> x, std::span<Scalar> copy,
                      std::span<std::byte> frame, Kernels kernels) {
  const std::size_t dimension = x.size();
  if (copy.size() != dimension || frame.size() != frameBytes(codec, dimension))
    throw std::logic_error("codec: buffers of the wrong size");
#if defined(__x86_64__)
  if (haveAvx2(kernels)) return encodeAvx2(codec, x.data(), copy.data(), frame.data(), dimension);
#endif
  encodeBaseline(codec, x.data(), copy.data(), frame.data(), dimension);
}

template <class Scalar>
FrameCheck applyDifference(Compression codec, std::span<const std::byte> frame,
                           std::span<Scalar> copy, Kernels kernels) {
  const std::size_t dimension = copy.size();
  if (frame.size() != frameBytes(codec, dimension) || !frameFinite(codec, frame, dimension))
    return FrameCheck::Malformed;
  const auto check = [](bool finite) {
    return finite ? FrameCheck::Applied : FrameCheck::Overflow;
  };
#if defined(__x86_64__)
  if (haveAvx2(kernels)) return check(applyAvx2(codec, frame.data(), copy.data(), dimension));
#endif
  return check(applyBaseline(codec, frame.data(), copy.data(), dimension));
}

template void encodeDifference<float>(Compression, std::span<const float>, std::span<float>,
                                      std::span<std::byte>, Kernels);
template void encodeDifference<double>(Compression, std::span<const double>, std::span<double>,
                                       std::span<std::byte>, Kernels);
template FrameCheck applyDifference<float>(Compression, std::span<const std::byte>,
                                           std::span<float>, Kernels);
template FrameCheck applyDifference<double>(Compression, std::span<const std::byte>,
                                            std::span<double>, Kernels);

}  // namespace consensusd::consensus
