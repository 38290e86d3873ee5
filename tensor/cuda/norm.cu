// tensor/cuda/norm.cu — Σ x² for gradient clipping.
//   out[0] (f32) += Σ_i x[i]²   over x (n) of any float dtype; Inf/NaN propagate.
// Deterministic: a fixed grid (a function of n and the device) writes one
// partial per block to scratch, then one block adds the partials in order.
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/map.cuh"
#include "tensor/cuda/ops.h"

namespace mpitron::cuda {

namespace {
constexpr int kThreads = 512;

template <typename T, int V> __global__ void sum_squares_partials(const T* x, int64_t n, float* partial) {
  __shared__ float shared[32];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float acc = 0.0f;
  const int64_t nv = V > 1 ? n / V : 0;
  for (int64_t j = tid; j < nv; j += stride) {
    float u[V];
    load_f<V>(x + j * V, u);
#pragma unroll
    for (int k = 0; k < V; ++k) acc += u[k] * u[k];
  }
  for (int64_t i = nv * V + tid; i < n; i += stride) {
    const float u = to_float(x[i]);
    acc += u * u;
  }
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void sum_partials_into(const float* partial, int count, float* out) {
  __shared__ float shared[32];
  float acc = 0.0f;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) out[0] += acc;
}
}  // namespace

void sum_squares(const Tensor& x, const Tensor& out, Stream s) {
  DeviceGuard g(x);
  const int64_t n = x.numel();
  if (n == 0) return;
  const cudaStream_t st = stream_of(s);
  const int grid = grid_for((n + kMapVec - 1) / kMapVec, kThreads, 2);
  Scratch partial(x.device().index, sizeof(float) * grid, s);
  MPT_DISPATCH_DEV_FLOAT(x.dtype(), "sum_squares", [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(x.data_ptr());
    const bool vec = vec_aligned(p, sizeof(T));
    count_vec_path("sum_squares", vec);
    if (vec)
      MPT_LAUNCH(grid, kThreads, 0, st, sum_squares_partials<T, kMapVec>)(p, n, partial.get<float>());
    else
      MPT_LAUNCH(grid, kThreads, 0, st, sum_squares_partials<T, 1>)(p, n, partial.get<float>());
  });
  MPT_KERNEL_CHECK("sum_squares");
  MPT_LAUNCH(1, 1024, 0, st, sum_partials_into)(partial.get<float>(), grid, static_cast<float*>(out.data_ptr()));
  MPT_KERNEL_CHECK("sum_squares (final)");
}

}  // namespace mpitron::cuda
