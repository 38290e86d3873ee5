// tensor/cuda/rmsnorm.cu — RMS normalisation over the last dim, forward and backward.
//
//   forward:  x, out (N, C); weight (C) x's dtype; rstd (N) f32
//             out = x·rstd·weight, rstd = 1/√(mean_c(x²) + eps)
//   backward: dx (N, C) = or += (accumulate_dx) rstd·(g − x̂·mean_c(g·x̂)),
//                          g = dout·weight, x̂ = x·rstd
//             dweight (C) += Σ_n dout·x̂   (f32 or x's dtype)
//
// Same shape as layernorm.cu: one warp per row, f32 math, 16-byte accesses when
// C is a multiple of 8 and the pointers allow it; dweight from the deterministic
// column sums of reduce.cuh (no atomics).
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/map.cuh"
#include "tensor/cuda/ops.h"
#include "tensor/cuda/reduce.cuh"

namespace mpitron::cuda {

namespace {
constexpr int kWarpsPerBlock = 8;

template <typename T, int V>
__global__ void rmsnorm_forward_kernel(const T* x, const T* weight, T* out, float* rstd_out, int64_t rows, int cols,
                                       float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  const T* xr = x + row * cols;
  T* outr = out + row * cols;
  float sq = 0.0f;
  for (int c = lane * V; c < cols; c += 32 * V) {
    float u[V];
    load_f<V>(xr + c, u);
#pragma unroll
    for (int k = 0; k < V; ++k) sq += u[k] * u[k];
  }
  const float rstd = rsqrtf(warp_sum(sq) / cols + eps);
  for (int c = lane * V; c < cols; c += 32 * V) {
    float u[V], w[V];
    load_f<V>(xr + c, u);
    load_f<V>(weight + c, w);
#pragma unroll
    for (int k = 0; k < V; ++k) u[k] = u[k] * rstd * w[k];
    store_f<V>(outr + c, u);
  }
  if (lane == 0) rstd_out[row] = rstd;
}

template <typename T, int V>
__global__ void rmsnorm_backward_dx_kernel(const T* dout, const T* x, const T* weight, const float* rstd, T* dx,
                                           int64_t rows, int cols, bool accumulate) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  const T* dr = dout + row * cols;
  const T* xr = x + row * cols;
  T* dxr = dx + row * cols;
  const float rs = rstd[row];
  float sum_gx = 0.0f;
  for (int c = lane * V; c < cols; c += 32 * V) {
    float d[V], u[V], w[V];
    load_f<V>(dr + c, d);
    load_f<V>(xr + c, u);
    load_f<V>(weight + c, w);
#pragma unroll
    for (int k = 0; k < V; ++k) sum_gx += d[k] * w[k] * u[k] * rs;
  }
  const float mean_gx = warp_sum(sum_gx) / cols;
  for (int c = lane * V; c < cols; c += 32 * V) {
    float d[V], u[V], w[V], o[V];
    load_f<V>(dr + c, d);
    load_f<V>(xr + c, u);
    load_f<V>(weight + c, w);
    if (accumulate) load_f<V>(dxr + c, o);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float v = rs * (d[k] * w[k] - u[k] * rs * mean_gx);
      o[k] = accumulate ? o[k] + v : v;
    }
    store_f<V>(dxr + c, o);
  }
}

// Column-sum functor: (dout·x̂, 0) at (row, col); the second sum is dropped.
template <typename T> struct RmsNormWeightGrad {
  const T* dout;
  const T* x;
  const float* rstd;
  int64_t cols;
  __device__ float2 operator()(int64_t r, int c) const {
    return make_float2(to_float(dout[r * cols + c]) * to_float(x[r * cols + c]) * rstd[r], 0.0f);
  }
};
}  // namespace

void rmsnorm_forward(const Tensor& x, const Tensor& weight, const Tensor& out, const Tensor& rstd, float eps,
                     Stream s) {
  DeviceGuard g(x);
  const int cols = static_cast<int>(x.dim(-1));
  const int64_t rows = cols ? x.numel() / cols : 0;
  if (rows == 0) return;
  const int grid = static_cast<int>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const cudaStream_t st = stream_of(s);
  MPT_DISPATCH_DEV_FLOAT(x.dtype(), "rmsnorm_forward", [&](auto tag) {
    using T = decltype(tag);
    const T *px = static_cast<const T*>(x.data_ptr()), *pw = static_cast<const T*>(weight.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    float* pr = static_cast<float*>(rstd.data_ptr());
    const bool vec = cols % kMapVec == 0 && vec_aligned(px, sizeof(T)) && vec_aligned(pw, sizeof(T)) &&
                     vec_aligned(po, sizeof(T));
    count_vec_path("rmsnorm_forward", vec);
    if (vec)
      MPT_LAUNCH(grid, 32 * kWarpsPerBlock, 0, st, rmsnorm_forward_kernel<T, kMapVec>)(px, pw, po, pr, rows, cols, eps);
    else
      MPT_LAUNCH(grid, 32 * kWarpsPerBlock, 0, st, rmsnorm_forward_kernel<T, 1>)(px, pw, po, pr, rows, cols, eps);
  });
  MPT_KERNEL_CHECK("rmsnorm_forward");
}

void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dweight, bool accumulate_dx, Stream s) {
  DeviceGuard g(x);
  const int cols = static_cast<int>(x.dim(-1));
  const int64_t rows = cols ? x.numel() / cols : 0;
  const cudaStream_t st = stream_of(s);
  MPT_DISPATCH_DEV_FLOAT(x.dtype(), "rmsnorm_backward", [&](auto tag) {
    using T = decltype(tag);
    const T *pd = static_cast<const T*>(dout.data_ptr()), *px = static_cast<const T*>(x.data_ptr()),
            *pw = static_cast<const T*>(weight.data_ptr());
    const float* pr = static_cast<const float*>(rstd.data_ptr());
    if (dx.defined() && rows > 0) {
      T* pdx = static_cast<T*>(dx.data_ptr());
      const int grid = static_cast<int>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
      const bool vec = cols % kMapVec == 0 && vec_aligned(pd, sizeof(T)) && vec_aligned(px, sizeof(T)) &&
                       vec_aligned(pw, sizeof(T)) && vec_aligned(pdx, sizeof(T));
      count_vec_path("rmsnorm_backward", vec);
      if (vec)
        MPT_LAUNCH(grid, 32 * kWarpsPerBlock, 0, st, rmsnorm_backward_dx_kernel<T, kMapVec>)(pd, px, pw, pr, pdx, rows, cols, accumulate_dx);
      else
        MPT_LAUNCH(grid, 32 * kWarpsPerBlock, 0, st, rmsnorm_backward_dx_kernel<T, 1>)(pd, px, pw, pr, pdx, rows, cols, accumulate_dx);
      MPT_KERNEL_CHECK("rmsnorm_backward (dx)");
    }
    if (!dweight.defined()) return;
    const RmsNormWeightGrad<T> f{pd, px, pr, cols};
    MPT_DISPATCH_DEV_FLOAT(dweight.dtype(), "rmsnorm_backward dweight", [&](auto wtag) {
      using W = decltype(wtag);
      column_sums(f, rows, cols, static_cast<W*>(dweight.data_ptr()), static_cast<float*>(nullptr),
                  /*accumulate=*/true, x.device().index, s);
    });
  });
}

}  // namespace mpitron::cuda
