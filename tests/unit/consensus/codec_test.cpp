#include "consensusd/consensus/codec.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

using consensusd::consensus::applyDifference;
using consensusd::consensus::Compression;
using consensusd::consensus::encodeDifference;
using consensusd::consensus::frameBytes;
using consensusd::consensus::FrameCheck;
using consensusd::consensus::Kernels;
using consensusd::consensus::kInt8Block;

namespace {

constexpr Compression kLossy[] = {Compression::Bf16, Compression::Fp16, Compression::Int8};

std::vector<float> randomVector(std::size_t n, std::uint32_t seed, float spread = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, spread);
  std::vector<float> values(n);
  for (float& v : values) v = normal(rng);
  return values;
}

// One frame of x against `copy` (which it advances).
std::vector<std::byte> encode(Compression codec, const std::vector<float>& x,
                              std::vector<float>& copy, Kernels kernels = Kernels::Best) {
  std::vector<std::byte> frame(frameBytes(codec, x.size()));
  encodeDifference<float>(codec, x, copy, frame, kernels);
  return frame;
}

float valueAt(Compression codec, std::uint16_t half) {
  std::vector<float> copy(1, 0.0f);
  std::vector<std::byte> frame(2);
  std::memcpy(frame.data(), &half, 2);
  REQUIRE(applyDifference<float>(codec, frame, copy) == FrameCheck::Applied);
  return copy[0];
}

}  // namespace

TEST_CASE("codec: frame sizes") {
  CHECK(frameBytes(Compression::Bf16, 1000) == 2000);
  CHECK(frameBytes(Compression::Fp16, 1000) == 2000);
  // Four blocks (256, 256, 256, 232), a float32 scale each.
  CHECK(frameBytes(Compression::Int8, 1000) == 4 * 4 + 1000);
  CHECK(frameBytes(Compression::Int8, kInt8Block) == 4 + kInt8Block);
  CHECK_THROWS(frameBytes(Compression::None, 10));
}

TEST_CASE("codec: one frame's error is within the codec's bound") {
  const std::size_t n = 10 * kInt8Block + 17;
  // Values over many magnitudes, so blocks and exponents differ.
  std::vector<float> x = randomVector(n, 7);
  for (std::size_t i = 0; i < n; ++i) x[i] *= std::pow(10.0f, static_cast<float>(i % 7) - 3.0f);
  for (const Compression codec : kLossy) {
    CAPTURE(static_cast<int>(codec));
    std::vector<float> copy(n, 0.0f);
    encode(codec, x, copy);
    for (std::size_t i = 0; i < n; ++i) {
      const float error = std::abs(x[i] - copy[i]);
      if (codec == Compression::Bf16) {
        CHECK(error <= std::abs(x[i]) * 0x1p-8f);
      } else if (codec == Compression::Fp16) {
        CHECK(error <= std::max(std::abs(x[i]) * 0x1p-11f, 0x1p-25f));
      } else {  // half a step of absmax / 127 in its block
        const std::size_t begin = i / kInt8Block * kInt8Block;
        float absmax = 0;
        for (std::size_t j = begin; j < std::min(n, begin + kInt8Block); ++j)
          absmax = std::max(absmax, std::abs(x[j]));
        CHECK(error <= absmax / 254.0f * 1.0001f);
      }
    }
  }
}

TEST_CASE("codec: the 16-bit codecs round to nearest even and fp16 saturates") {
  std::vector<float> x{1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1e6f, -1e6f, 3e-8f, 1.0f + 0x1p-11f};
  std::vector<float> bf(x.size(), 0.0f);
  encode(Compression::Bf16, x, bf);
  CHECK(bf[0] == 1.0f);                // a tie goes to the even neighbour
  CHECK(bf[1] == 1.0f + 4 * 0x1p-8f);  // the other tie, up to even
  CHECK(bf[2] == 999424.0f);           // 1e6 to 8 significant bits
  std::vector<float> half(x.size(), 0.0f);
  encode(Compression::Fp16, x, half);
  CHECK(half[2] == 65504.0f);  // saturated, not Inf
  CHECK(half[3] == -65504.0f);
  CHECK(half[4] == 0x1p-24f);  // the nearest subnormal: 3e-8 is 0.503 steps of 2^-24
  CHECK(half[5] == 1.0f);      // tie to even
  // What the wire values mean, bit by bit.
  CHECK(valueAt(Compression::Fp16, 0x3c00) == 1.0f);
  CHECK(valueAt(Compression::Fp16, 0x0001) == 0x1p-24f);
  CHECK(valueAt(Compression::Fp16, 0xfbff) == -65504.0f);
  CHECK(valueAt(Compression::Bf16, 0x3f80) == 1.0f);
  CHECK(valueAt(Compression::Bf16, 0xc040) == -3.0f);
}

TEST_CASE("codec: a receiver's copy is the sender's, bit for bit, frame after frame") {
  const std::size_t n = 3 * kInt8Block + 100;
  for (const Compression codec : kLossy) {
    CAPTURE(static_cast<int>(codec));
    std::vector<float> sender(n, 0.0f);
    std::vector<float> receiver(n, 0.0f);
    std::vector<float> x = randomVector(n, 1);
    for (std::uint32_t round = 0; round < 20; ++round) {
      const std::vector<float> step = randomVector(n, 100 + round, 0.01f);
      for (std::size_t i = 0; i < n; ++i) x[i] += step[i];
      const auto frame = encode(codec, x, sender);
      REQUIRE(applyDifference<float>(codec, frame, receiver) == FrameCheck::Applied);
      CHECK(std::memcmp(sender.data(), receiver.data(), n * sizeof(float)) == 0);
    }
    // Error feedback: what the copy still misses is one frame's error, not twenty.
    double missing = 0;
    for (std::size_t i = 0; i < n; ++i)
      missing = std::max(missing, double{std::abs(x[i] - sender[i])});
    CHECK(missing < 0.02);
  }
}

// A sender with AVX2 and a receiver without (or the other way round) must
// hold the same copy: the vector loops give the baseline's bits.
TEST_CASE("codec: the AVX2 and the baseline loops give the same frames and copies") {
  const std::size_t n = 5 * kInt8Block + 77;
  for (const Compression codec : kLossy) {
    CAPTURE(static_cast<int>(codec));
    std::vector<float> best(n, 0.0f);
    std::vector<float> baseline(n, 0.0f);
    std::vector<float> received(n, 0.0f);
    std::vector<float> x = randomVector(n, 11);
    for (std::size_t i = 0; i < n; ++i) x[i] *= std::pow(10.0f, static_cast<float>(i % 9) - 5.0f);
    for (std::uint32_t round = 0; round < 10; ++round) {
      const std::vector<float> step = randomVector(n, 200 + round, 0.01f);
      for (std::size_t i = 0; i < n; ++i) x[i] += step[i];
      const auto frame = encode(codec, x, best, Kernels::Best);
      CHECK(encode(codec, x, baseline, Kernels::Baseline) == frame);
      CHECK(std::memcmp(best.data(), baseline.data(), n * sizeof(float)) == 0);
      REQUIRE(applyDifference<float>(codec, frame, received, Kernels::Baseline) ==
              FrameCheck::Applied);
      CHECK(std::memcmp(best.data(), received.data(), n * sizeof(float)) == 0);
    }
    if (codec == Compression::Fp16) continue;  // saturates at 65504: cannot overflow a copy
    std::vector<float> overflowing(kInt8Block, 3e38f);  // the overflow check in both loops
    std::vector<float> sender(kInt8Block, 0.0f);
    const auto frame = encode(codec, std::vector<float>(kInt8Block, 2e38f), sender);
    for (const Kernels kernels : {Kernels::Best, Kernels::Baseline}) {
      auto copy = overflowing;
      CHECK(applyDifference<float>(codec, frame, copy, kernels) == FrameCheck::Overflow);
    }
  }
}

TEST_CASE("codec: a frame that is not finite, too short or forged leaves the copy untouched") {
  const std::size_t n = 2 * kInt8Block;
  const std::vector<float> x = randomVector(n, 3);
  const std::vector<float> before = randomVector(n, 4);
  const auto rejected = [&](Compression codec, const std::vector<std::byte>& frame) {
    std::vector<float> copy = before;
    const FrameCheck check = applyDifference<float>(codec, frame, copy);
    CHECK(copy == before);
    return check == FrameCheck::Malformed;
  };
  for (const Compression codec : kLossy) {
    CAPTURE(static_cast<int>(codec));
    std::vector<float> copy(n, 0.0f);
    const auto frame = encode(codec, x, copy);
    CHECK(rejected(codec, std::vector<std::byte>(frame.begin(), frame.end() - 1)));
    CHECK(rejected(codec, std::vector<std::byte>()));
    auto longer = frame;
    longer.push_back(std::byte{0});
    CHECK(rejected(codec, longer));
  }
  std::vector<float> copy(n, 0.0f);
  const auto frame = encode(Compression::Int8, x, copy);
  // The second block's scale: NaN, Inf, negative, so large that q * scale overflows.
  for (const float scale : {std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(), -1.0f, 3e37f}) {
    CAPTURE(scale);
    auto forged = frame;
    std::memcpy(forged.data() + 4 + kInt8Block, &scale, sizeof scale);
    CHECK(rejected(Compression::Int8, forged));
  }
  for (const Compression codec : {Compression::Bf16, Compression::Fp16}) {
    std::vector<float> copy16(n, 0.0f);
    auto forged = encode(codec, x, copy16);
    const std::uint16_t nan = codec == Compression::Bf16 ? 0x7fc0 : 0x7e00;
    std::memcpy(forged.data() + 2 * (n - 1), &nan, 2);  // the last value
    CHECK(rejected(codec, forged));
  }
}

TEST_CASE("codec: a sum past the float range is reported, not hidden") {
  std::vector<float> copy(kInt8Block, 3e38f);
  std::vector<float> sender(kInt8Block, 0.0f);
  std::vector<float> big(kInt8Block, 2e38f);
  const auto frame = encode(Compression::Int8, big, sender);  // +2e38 everywhere
  CHECK(applyDifference<float>(Compression::Int8, frame, copy) == FrameCheck::Overflow);
}

// CHOCO-gossip (Koloskova et al. 2019, Algorithm 1 without gradients) over a
// ring of 8 with W = 1/3 on self and both neighbours: every node's x reaches
// the true average although only int8 frames move; quantizing the estimates
// themselves instead stops at the quantization's error.
TEST_CASE("codec: int8 gossip with error feedback reaches the average, without it does not") {
  const std::size_t nodes = 8;
  const std::size_t n = 4 * kInt8Block;
  std::vector<std::vector<float>> start;
  for (std::size_t i = 0; i < nodes; ++i)
    start.push_back(randomVector(n, 50 + static_cast<std::uint32_t>(i)));
  std::vector<double> average(n, 0.0);
  for (const auto& x : start)
    for (std::size_t k = 0; k < n; ++k) average[k] += double{x[k]} / static_cast<double>(nodes);
  const auto worstError = [&](const std::vector<std::vector<float>>& xs) {
    double worst = 0;
    for (const auto& x : xs)
      for (std::size_t k = 0; k < n; ++k)
        worst = std::max(worst, std::abs(double{x[k]} - average[k]));
    return worst;
  };
  const int rounds = 300;

  auto x = start;
  std::vector<std::vector<float>> copies(nodes, std::vector<float>(n, 0.0f));
  const float gamma = 1.0f;  // int8's error is small enough for the full consensus step
  for (int round = 0; round < rounds; ++round) {
    for (std::size_t i = 0; i < nodes; ++i) encode(Compression::Int8, x[i], copies[i]);
    for (std::size_t i = 0; i < nodes; ++i) {
      const auto& left = copies[(i + nodes - 1) % nodes];
      const auto& right = copies[(i + 1) % nodes];
      for (std::size_t k = 0; k < n; ++k)
        x[i][k] += gamma / 3.0f * ((left[k] - copies[i][k]) + (right[k] - copies[i][k]));
    }
  }
  const double withFeedback = worstError(x);
  CHECK(withFeedback < 1e-5);  // float rounding: about 4e-7

  x = start;
  for (int round = 0; round < rounds; ++round) {
    std::vector<std::vector<float>> sent;
    for (std::size_t i = 0; i < nodes; ++i) {
      std::vector<float> zero(n, 0.0f);
      encode(Compression::Int8, x[i], zero);  // Q(x_i) itself
      sent.push_back(zero);
    }
    for (std::size_t i = 0; i < nodes; ++i)
      for (std::size_t k = 0; k < n; ++k)
        x[i][k] = (sent[(i + nodes - 1) % nodes][k] + sent[i][k] + sent[(i + 1) % nodes][k]) / 3.0f;
  }
  const double withoutFeedback = worstError(x);
  CHECK(withoutFeedback > 1e-2);  // about 0.17: the mean drifts
  CHECK(withoutFeedback > 100 * withFeedback);
}
