// tensor/cuda/fp8.cu — fp8 amax and quantise–dequantise (fp8.h):
//   amax: each block folds max|x| over its grid-stride share into partial[block] (warp then
//         block reduction), one block folds the partials into amax[0] (no atomics: the same
//         value on every run, and max is order-free anyway);
//   quantise–dequantise: element-wise on the map.cuh skeleton, the scale read on the device.
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/map.cuh"
#include "tensor/cuda/ops.h"

namespace mpitron::cuda {

namespace {
constexpr int kAmaxThreads = 256;
constexpr int kAmaxMaxBlocks = 1024;

// max over the block of v (blockDim.x == kAmaxThreads); valid in thread 0.
__device__ __forceinline__ float block_max(float v, float* sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kAmaxThreads / 32 ? sh[lane] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  }
  return v;
}

template <typename T> __global__ void amax_partial_kernel(const T* x, int64_t n, float* partial) {
  __shared__ float sh[32];
  float m = 0.0f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    m = fmaxf(m, fabsf(to_float(x[i])));
  m = block_max(m, sh);
  if (threadIdx.x == 0) partial[blockIdx.x] = m;
}

__global__ void amax_final_kernel(const float* partial, int count, float* amax) {
  __shared__ float sh[32];
  float m = 0.0f;
  for (int i = threadIdx.x; i < count; i += blockDim.x) m = fmaxf(m, partial[i]);
  m = block_max(m, sh);
  if (threadIdx.x == 0) amax[0] = m;
}

template <typename T> struct QdqOp {
  const T* x;
  T* out;
  const float* scale;
  Fp8Format f;
  template <int V> __device__ void apply(int64_t i) const {
    const float sc = *scale, inv = 1.0f / sc;
    float u[V];
    load_f<V>(x + i, u);
#pragma unroll
    for (int k = 0; k < V; ++k) u[k] = fp8_quantize_dequantize(u[k], sc, inv, f);
    store_f<V>(out + i, u);
  }
};
}  // namespace

void fp8_amax(const Tensor& x, const Tensor& amax, Stream s) {
  DeviceGuard g(x);
  const int64_t n = x.numel();
  const int blocks = std::max(1, std::min(grid_for(std::max<int64_t>(n, 1), kAmaxThreads), kAmaxMaxBlocks));
  const cudaStream_t st = stream_of(s);
  Scratch partial(x.device().index, sizeof(float) * static_cast<size_t>(blocks), s);
  MPT_DISPATCH_DEV_FLOAT(x.dtype(), "fp8_amax", [&](auto tag) {
    using T = decltype(tag);
    MPT_LAUNCH(blocks, kAmaxThreads, 0, st, amax_partial_kernel<T>)(static_cast<const T*>(x.data_ptr()), n,
                                                                    partial.get<float>());
  });
  MPT_KERNEL_CHECK("fp8_amax");
  MPT_LAUNCH(1, kAmaxThreads, 0, st, amax_final_kernel)(partial.get<float>(), blocks,
                                                         static_cast<float*>(amax.data_ptr()));
  MPT_KERNEL_CHECK("fp8_amax");
}

void fp8_quantize_dequantize(const Tensor& x, const Tensor& scale, Fp8Format f, const Tensor& out, Stream s) {
  DeviceGuard g(x);
  MPT_DISPATCH_DEV_FLOAT(x.dtype(), "fp8_quantize_dequantize", [&](auto tag) {
    using T = decltype(tag);
    const QdqOp<T> op{static_cast<const T*>(x.data_ptr()), static_cast<T*>(out.data_ptr()),
                      static_cast<const float*>(scale.data_ptr()), f};
    launch_map(x.numel(), op, vec_aligned(op.x, sizeof(T)) && vec_aligned(op.out, sizeof(T)), s,
               "fp8_quantize_dequantize");
  });
}

}  // namespace mpitron::cuda
