// tensor/cuda/map.cuh — the element-wise kernel skeleton shared by the
// pointwise families (elementwise, gelu, dropout, adamw, norm).
//
// A functor F provides `template <int V> __device__ void apply(int64_t i) const`,
// which processes elements [i, i + V). map_kernel<V> calls it on V-element
// chunks (V = 8: 16 bytes of bf16/f16 in one load, 32 bytes of f32 in two), then
// on the scalar tail with V = 1. launch_map picks V = 8 when every pointer the
// functor touches is aligned for it, V = 1 otherwise (views at odd offsets).
#pragma once
#include "tensor/cuda/common.cuh"

namespace mpitron::cuda {

constexpr int kMapVec = 8;

// V consecutive elements of T, loaded/stored as one aligned access (or two for 32 bytes).
template <typename T, int V> struct alignas(sizeof(T) * V <= 16 ? sizeof(T) * V : 16) Vec {
  T v[V];
};

template <int V, typename T> __device__ __forceinline__ void load_f(const T* p, float (&f)[V]) {
  MPT_CHECK_VECTOR_ALIGNED(p, alignof(Vec<T, V>));
  const Vec<T, V> x = *reinterpret_cast<const Vec<T, V>*>(p);
#pragma unroll
  for (int k = 0; k < V; ++k) f[k] = to_float(x.v[k]);
}
template <int V, typename T> __device__ __forceinline__ void store_f(T* p, const float (&f)[V]) {
  Vec<T, V> x;
#pragma unroll
  for (int k = 0; k < V; ++k) x.v[k] = from_float<T>(f[k]);
  MPT_CHECK_VECTOR_ALIGNED(p, alignof(Vec<T, V>));
  *reinterpret_cast<Vec<T, V>*>(p) = x;
}

template <int V, typename F> __global__ void map_kernel(int64_t n, F f) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = V > 1 ? n / V : 0;
  for (int64_t v = tid; v < nv; v += stride) f.template apply<V>(v * V);
  for (int64_t i = nv * V + tid; i < n; i += stride) f.template apply<1>(i);
}

// True when p can be accessed in kMapVec-element chunks of `elem_bytes` each
// (null pointers, i.e. absent operands, do not count).
inline bool vec_aligned(const void* p, size_t elem_bytes) {
  const size_t need = std::min<size_t>(16, elem_bytes * kMapVec);
  return p == nullptr || (reinterpret_cast<uintptr_t>(p) % need) == 0;
}

template <typename F> void launch_map(int64_t n, const F& f, bool vec_ok, Stream s, const char* what) {
  if (n <= 0) return;
  constexpr int kThreads = 256;
  const cudaStream_t st = stream_of(s);
  count_vec_path(what, vec_ok);
  if (vec_ok)
    MPT_LAUNCH(grid_for((n + kMapVec - 1) / kMapVec, kThreads, 16), kThreads, 0, st, map_kernel<kMapVec>)(n, f);
  else
    MPT_LAUNCH(grid_for(n, kThreads, 16), kThreads, 0, st, map_kernel<1>)(n, f);
  MPT_KERNEL_CHECK(what);
}

}  // namespace mpitron::cuda
