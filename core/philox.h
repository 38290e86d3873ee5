// core/philox.h — counter-based Philox4x32-10 RNG, identical on host and device.
//
// A stream is named by (seed, offset). Element i of the stream is lane (i % 4)
// of philox(counter = offset + i / 4, key = seed). The function is pure, so a
// CUDA thread, an OpenMP thread and a serial loop produce the same numbers for
// the same (seed, offset, i) — that is what makes dropout masks reproducible
// across backends and lets backward regenerate a mask instead of storing it.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define MPT_HD __host__ __device__ __forceinline__
#else
#define MPT_HD inline
#endif

namespace mpitron {

struct Philox4 {
  uint32_t x[4];
};

MPT_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

// Philox4x32 with 10 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").
MPT_HD Philox4 philox4x32_10(uint64_t counter_lo, uint64_t counter_hi, uint64_t key) {
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(0xD2511F53u, c0, hi0, lo0);
    philox_mulhilo(0xCD9E8D57u, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// The i-th 32-bit number of stream (seed, offset).
MPT_HD uint32_t philox_u32(uint64_t seed, uint64_t offset, uint64_t i) {
  const Philox4 r = philox4x32_10(offset + (i >> 2), 0, seed);
  return r.x[i & 3];
}

// Uniform in [0, 1) with 24 random bits (exactly representable in float).
MPT_HD float philox_uniform(uint64_t seed, uint64_t offset, uint64_t i) {
  return static_cast<float>(philox_u32(seed, offset, i) >> 8) * (1.0f / 16777216.0f);
}

// Standard normal via Box-Muller on two uniforms of block (i/2); used for init.
float philox_normal(uint64_t seed, uint64_t offset, uint64_t i);

}  // namespace mpitron
