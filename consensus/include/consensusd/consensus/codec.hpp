#pragma once
// Compressed estimates with error feedback (CHOCO-SGD: Koloskova, Stich,
// Jaggi, ICML 2019; docs/protocol.md, "Compressed estimates"). A sender
// keeps a public copy c of its own estimate, which every neighbour holds
// too; each round it sends q = Q(x - c) and both ends add the decoded q to
// their copy, bit for bit the same. What Q loses stays in x - c and goes
// out in a later round instead of piling up as a consensus error.
//
// The frames (little-endian):
//   bf16, fp16: one 2-byte value per coordinate (round to nearest even;
//               fp16 saturates at +-65504);
//   int8:       blocks of kInt8Block coordinates, each a float32 scale
//               (absmax / 127) then that many int8 (round to nearest),
//               the last block shorter.
// Pure functions, no state: the engine owns the copies.

#include <cstddef>
#include <cstdint>
#include <span>

#include "consensusd/data/names.hpp"

namespace consensusd::consensus {

enum class Compression : std::uint8_t { None, Bf16, Fp16, Int8 };
inline constexpr data::NameTable<Compression, 4> kCompressions{{{Compression::None, "none"},
                                                                {Compression::Bf16, "bf16"},
                                                                {Compression::Fp16, "fp16"},
                                                                {Compression::Int8, "int8"}}};

inline constexpr std::size_t kInt8Block = 256;  // coordinates per float32 scale

// The loops a machine runs: Best = AVX2 where the CPU has it; Baseline =
// plain x86-64 (for tests and benchmarks). Both give the same bits.
enum class Kernels { Best, Baseline };

// Bytes of one compressed frame of `dimension` coordinates (not for None).
std::size_t frameBytes(Compression codec, std::size_t dimension);

// The sender's step: frame = Q(x - copy), then copy += decode(frame).
// `frame` holds frameBytes(codec, x.size()) bytes.
template <class Scalar>
void encodeDifference(Compression codec, std::span<const Scalar> x, std::span<Scalar> copy,
                      std::span<std::byte> frame, Kernels kernels = Kernels::Best);

// What a receiver's copy became.
enum class FrameCheck {
  Applied,    // copy += decode(frame)
  Malformed,  // wrong size, or a scale or value that is not finite (or a negative scale):
              // the copy is untouched
  Overflow,   // the sum left the float range: the copy is no longer the sender's
};

// The receiver's step: copy += decode(frame), after checking the frame.
template <class Scalar>
FrameCheck applyDifference(Compression codec, std::span<const std::byte> frame,
                           std::span<Scalar> copy, Kernels kernels = Kernels::Best);

extern template void encodeDifference<float>(Compression, std::span<const float>, std::span<float>,
                                             std::span<std::byte>, Kernels);
extern template void encodeDifference<double>(Compression, std::span<const double>,
                                              std::span<double>, std::span<std::byte>, Kernels);
extern template FrameCheck applyDifference<float>(Compression, std::span<const std::byte>,
                                                  std::span<float>, Kernels);
extern template FrameCheck applyDifference<double>(Compression, std::span<const std::byte>,
                                                   std::span<double>, Kernels);

}  // namespace consensusd::consensus
