// tensor/cuda/row_stats.cuh — the online (max, Σexp) statistics of a row, as
// softmax and the cross-entropy kernels compute them: each thread folds its
// V-wide chunks into a running (m, s) pair, then the pairs are merged across a
// warp (and across the block). s is Σ exp(x − m); -inf maxima carry no mass, so
// an empty or all -inf row gives (−inf, 0).
#pragma once
#include "tensor/cuda/common.cuh"

namespace mpitron::cuda {

// Merge running (max, sum-of-exp) pair (m, s) with (m2, s2).
__device__ __forceinline__ void merge_max_sum(float& m, float& s, float m2, float s2) {
  const float nm = fmaxf(m, m2);
  if (nm == -INFINITY) return;
  s = (m == -INFINITY ? 0.0f : s * expf(m - nm)) + (m2 == -INFINITY ? 0.0f : s2 * expf(m2 - nm));
  m = nm;
}

// This thread's chunks of row xr: elements [c, c + V) for c = first, first + stride, … < n.
template <typename T, int V>
__device__ __forceinline__ void thread_max_sum(const T* xr, int64_t n, int64_t first, int64_t stride, float& m,
                                               float& s) {
  for (int64_t c = first; c < n; c += stride) {
    float u[V];
    load_f<V>(xr + c, u);
    float cm = u[0];
#pragma unroll
    for (int k = 1; k < V; ++k) cm = fmaxf(cm, u[k]);
    float cs = 0.0f;
    if (cm != -INFINITY) {
#pragma unroll
      for (int k = 0; k < V; ++k) cs += expf(u[k] - cm);
    }
    merge_max_sum(m, s, cm, cs);
  }
}

// Every lane of the warp ends with the warp's merged pair.
__device__ __forceinline__ void warp_max_sum(float& m, float& s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    merge_max_sum(m, s, m2, s2);
  }
}

// logsumexp of row xr[0, n) over the whole block (blockDim.x a multiple of 32,
// at most 1024), returned to every thread; −inf for an empty or all −inf row.
// sh_m, sh_s: 32 floats each of shared memory. Contains __syncthreads().
template <typename T, int V>
__device__ __forceinline__ float block_logsumexp(const T* xr, int64_t n, float* sh_m, float* sh_s) {
  float m = -INFINITY, s = 0.0f;
  thread_max_sum<T, V>(xr, n, static_cast<int64_t>(threadIdx.x) * V, static_cast<int64_t>(blockDim.x) * V, m, s);
  warp_max_sum(m, s);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sh_m[warp] = m;
    sh_s[warp] = s;
  }
  __syncthreads();
  if (warp == 0) {
    const int nwarps = blockDim.x >> 5;
    m = lane < nwarps ? sh_m[lane] : -INFINITY;
    s = lane < nwarps ? sh_s[lane] : 0.0f;
    warp_max_sum(m, s);
    if (lane == 0) sh_m[0] = m == -INFINITY ? -INFINITY : m + logf(s);
  }
  __syncthreads();
  return sh_m[0];
}

}  // namespace mpitron::cuda
