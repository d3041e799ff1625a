#pragma once
// Which vector kernels this CPU runs: the binaries target baseline x86-64,
// and the passes over model-sized vectors are compiled once more for AVX2.

namespace consensusd::consensus {

inline bool cpuHasAvx2() {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
#else
  return false;
#endif
}

}  // namespace consensusd::consensus
