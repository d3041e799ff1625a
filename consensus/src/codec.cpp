#include "consensusd/consensus/codec.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

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

bool bf16Finite(std::uint16_t half) {
  return (half & 0x7f80u) != 0x7f80u;
}
bool fp16Finite(std::uint16_t half) {
  return (half & 0x7c00u) != 0x7c00u;
}

std::uint16_t load16(const std::byte* at) {
  std::uint16_t value;
  std::memcpy(&value, at, sizeof value);
  return value;
}

float loadFloat(const std::byte* at) {
  float value;
  std::memcpy(&value, at, sizeof value);
  return value;
}

std::size_t blocks(std::size_t dimension) {
  return (dimension + kInt8Block - 1) / kInt8Block;
}

// copy[0, n) += decode(frame); false when a sum is not finite. The frame
// was checked: every value and scale is finite.
template <class Scalar>
bool applyBlock(Compression codec, const std::byte* frame, Scalar* copy, std::size_t n) {
  constexpr auto kMax = static_cast<double>(std::numeric_limits<float>::max());
  bool finite = true;
  if (codec == Compression::Int8) {
    const auto scale = static_cast<Scalar>(loadFloat(frame));
    const auto* q = reinterpret_cast<const std::int8_t*>(frame + sizeof(float));
    for (std::size_t i = 0; i < n; ++i) {
      copy[i] += static_cast<Scalar>(q[i]) * scale;
      finite &= std::abs(static_cast<double>(copy[i])) <= kMax;
    }
    return finite;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t half = load16(frame + 2 * i);
    copy[i] += static_cast<Scalar>(codec == Compression::Bf16 ? fromBf16(half) : fromFp16(half));
    finite &= std::abs(static_cast<double>(copy[i])) <= kMax;
  }
  return finite;
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
  const auto finite = codec == Compression::Bf16 ? bf16Finite : fp16Finite;
  bool all = true;
  for (std::size_t i = 0; i < dimension; ++i) all &= finite(load16(frame.data() + 2 * i));
  return all;
}

}  // namespace

std::size_t frameBytes(Compression codec, std::size_t dimension) {
  if (codec == Compression::None) throw std::logic_error("codec: no frame for 'none'");
  if (codec == Compression::Int8) return blocks(dimension) * sizeof(float) + dimension;
  return 2 * dimension;
}

template <class Scalar>
void encodeDifference(Compression codec, std::span<const Scalar> x, std::span<Scalar> copy,
                      std::span<std::byte> frame) {
  const std::size_t dimension = x.size();
  if (copy.size() != dimension || frame.size() != frameBytes(codec, dimension))
    throw std::logic_error("codec: buffers of the wrong size");
  constexpr std::size_t kStep = kInt8Block;  // one int8 block, or as many 16-bit values
  for (std::size_t begin = 0; begin < dimension; begin += kStep) {
    const std::size_t n = std::min(kStep, dimension - begin);
    const Scalar* xs = x.data() + begin;
    Scalar* cs = copy.data() + begin;
    std::byte* out = frame.data() + blockOffset(codec, begin);
    if (codec == Compression::Int8) {
      float absmax = 0;
      for (std::size_t i = 0; i < n; ++i)
        absmax = std::max(absmax, static_cast<float>(std::abs(xs[i] - cs[i])));
      // At most what a receiver accepts (frameFinite): a difference past the
      // float range (a diverged model) still makes a frame it can check.
      const float scale = std::min(absmax / 127.0f, std::numeric_limits<float>::max() / 128);
      const float inverse = scale > 0 ? 1.0f / scale : 0.0f;
      std::memcpy(out, &scale, sizeof scale);
      auto* q = reinterpret_cast<std::int8_t*>(out + sizeof(float));
      for (std::size_t i = 0; i < n; ++i) {
        const float scaled = static_cast<float>(xs[i] - cs[i]) * inverse;
        q[i] = static_cast<std::int8_t>(std::clamp(std::nearbyint(scaled), -127.0f, 127.0f));
      }
    } else {
      const auto encode = codec == Compression::Bf16 ? toBf16 : toFp16;
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint16_t half = encode(static_cast<float>(xs[i] - cs[i]));
        std::memcpy(out + 2 * i, &half, sizeof half);
      }
    }
    applyBlock(codec, out, cs, n);
  }
}

template <class Scalar>
FrameCheck applyDifference(Compression codec, std::span<const std::byte> frame,
                           std::span<Scalar> copy) {
  const std::size_t dimension = copy.size();
  if (frame.size() != frameBytes(codec, dimension) || !frameFinite(codec, frame, dimension))
    return FrameCheck::Malformed;
  bool finite = true;
  for (std::size_t begin = 0; begin < dimension; begin += kInt8Block) {
    const std::size_t n = std::min(kInt8Block, dimension - begin);
    finite &= applyBlock(codec, frame.data() + blockOffset(codec, begin), copy.data() + begin, n);
  }
  return finite ? FrameCheck::Applied : FrameCheck::Overflow;
}

template void encodeDifference<float>(Compression, std::span<const float>, std::span<float>,
                                      std::span<std::byte>);
template void encodeDifference<double>(Compression, std::span<const double>, std::span<double>,
                                       std::span<std::byte>);
template FrameCheck applyDifference<float>(Compression, std::span<const std::byte>,
                                           std::span<float>);
template FrameCheck applyDifference<double>(Compression, std::span<const std::byte>,
                                            std::span<double>);

}  // namespace consensusd::consensus
