// tensor/cuda/layernorm.cu — layer normalisation over the last dim, forward and backward.
//
//   forward:  x, out (N, C); weight, bias (C) x's dtype; mean, rstd (N) f32
//             out = (x − mean)·rstd·weight + bias, rstd = 1/√(var + eps) (biased var)
//   backward: dx (N, C)  = or += (accumulate_dx) rstd·(g − mean_c(g) − x̂·mean_c(g·x̂)),
//                          g = dout·weight, x̂ = (x − mean)·rstd
//             dweight (C) += Σ_n dout·x̂,  dbias (C) += Σ_n dout   (f32 or x's dtype)
//
// One warp per row, f32 math; a row is read three times (sum, centred sum of
// squares, output), the re-reads come from L1. 16-byte accesses when C is a
// multiple of 8 and the pointers allow it. dweight/dbias come from the
// deterministic column sums of reduce.cuh (no atomics), at the price of one more
// read of dout and x.
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/map.cuh"
#include "tensor/cuda/ops.h"
#include "tensor/cuda/reduce.cuh"

namespace mpitron::cuda {

namespace {
constexpr int kWarpsPerBlock = 8;

template <typename T, int V>
__global__ void layernorm_forward_kernel(const T* x, const T* weight, const T* bias, T* out, float* mean_out,
                                         float* rstd_out, int64_t rows, int cols, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  const T* xr = x + row * cols;
  T* outr = out + row * cols;
  float sum = 0.0f;
  for (int c = lane * V; c < cols; c += 32 * V) {
    float u[V];
    load_f<V>(xr + c, u);
#pragma unroll
    for (int k = 0; k < V; ++k) sum += u[k];
  }
  const float mean = warp_sum(sum) / cols;
  float sq = 0.0f;
  for (int c = lane * V; c < cols; c += 32 * V) {
    float u[V];
    load_f<V>(xr + c, u);
#pragma unroll
    for (int k = 0; k < V; ++k) sq += (u[k] - mean) * (u[k] - mean);
  }
  const float rstd = rsqrtf(warp_sum(sq) / cols + eps);
  for (int c = lane * V; c < cols; c += 32 * V) {
    float u[V], w[V], b[V];
    load_f<V>(xr + c, u);
    load_f<V>(weight + c, w);
    load_f<V>(bias + c, b);
#pragma unroll
    for (int k = 0; k < V; ++k) u[k] = (u[k] - mean) * rstd * w[k] + b[k];
    store_f<V>(outr + c, u);
  }
  if (lane == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

template <typename T, int V>
__global__ void layernorm_backward_dx_kernel(const T* dout, const T* x, const T* weight, const float* mean,
                                             const float* rstd, T* dx, int64_t rows, int cols, bool accumulate) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  const T* dr = dout + row * cols;
  const T* xr = x + row * cols;
  T* dxr = dx + row * cols;
  const float mu = mean[row], rs = rstd[row];
  float sum_g = 0.0f, sum_gx = 0.0f;
  for (int c = lane * V; c < cols; c += 32 * V) {
    float d[V], u[V], w[V];
    load_f<V>(dr + c, d);
    load_f<V>(xr + c, u);
    load_f<V>(weight + c, w);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float g = d[k] * w[k];
      sum_g += g;
      sum_gx += g * (u[k] - mu) * rs;
    }
  }
  const float mean_g = warp_sum(sum_g) / cols, mean_gx = warp_sum(sum_gx) / cols;
  for (int c = lane * V; c < cols; c += 32 * V) {
    float d[V], u[V], w[V], o[V];
    load_f<V>(dr + c, d);
    load_f<V>(xr + c, u);
    load_f<V>(weight + c, w);
    if (accumulate) load_f<V>(dxr + c, o);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float v = rs * (d[k] * w[k] - mean_g - (u[k] - mu) * rs * mean_gx);
      o[k] = accumulate ? o[k] + v : v;
    }
    store_f<V>(dxr + c, o);
  }
}

// Column-sum functor: (dout·x̂, dout) at (row, col).
template <typename T> struct LayerNormParamGrads {
  const T* dout;
  const T* x;
  const float* mean;
  const float* rstd;
  int64_t cols;
  __device__ float2 operator()(int64_t r, int c) const {
    const float d = to_float(dout[r * cols + c]);
    const float xh = (to_float(x[r * cols + c]) - mean[r]) * rstd[r];
    return make_float2(d * xh, d);
  }
};
}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out,
                       const Tensor& mean, const Tensor& rstd, float eps, Stream s) {
  DeviceGuard g(x);
  const int cols = static_cast<int>(x.dim(-1));
  const int64_t rows = cols ? x.numel() / cols : 0;
  if (rows == 0) return;
  const int grid = static_cast<int>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const cudaStream_t st = stream_of(s);
  MPT_DISPATCH_DEV_FLOAT(x.dtype(), "layernorm_forward", [&](auto tag) {
    using T = decltype(tag);
    const T *px = static_cast<const T*>(x.data_ptr()), *pw = static_cast<const T*>(weight.data_ptr()),
            *pb = static_cast<const T*>(bias.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    float *pm = static_cast<float*>(mean.data_ptr()), *pr = static_cast<float*>(rstd.data_ptr());
    const bool vec = cols % kMapVec == 0 && vec_aligned(px, sizeof(T)) && vec_aligned(pw, sizeof(T)) &&
                     vec_aligned(pb, sizeof(T)) && vec_aligned(po, sizeof(T));
    count_vec_path("layernorm_forward", vec);
    if (vec)
      MPT_LAUNCH(grid, 32 * kWarpsPerBlock, 0, st, layernorm_forward_kernel<T, kMapVec>)(
          px, pw, pb, po, pm, pr, rows, cols, eps);
    else
      MPT_LAUNCH(grid, 32 * kWarpsPerBlock, 0, st, layernorm_forward_kernel<T, 1>)(
          px, pw, pb, po, pm, pr, rows, cols, eps);
  });
  MPT_KERNEL_CHECK("layernorm_forward");
}

void layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                        bool accumulate_dx, Stream s) {
  DeviceGuard g(x);
  const int cols = static_cast<int>(x.dim(-1));
  const int64_t rows = cols ? x.numel() / cols : 0;
  const cudaStream_t st = stream_of(s);
  MPT_DISPATCH_DEV_FLOAT(x.dtype(), "layernorm_backward", [&](auto tag) {
    using T = decltype(tag);
    const T *pd = static_cast<const T*>(dout.data_ptr()), *px = static_cast<const T*>(x.data_ptr()),
            *pw = static_cast<const T*>(weight.data_ptr());
    const float *pm = static_cast<const float*>(mean.data_ptr()), *pr = static_cast<const float*>(rstd.data_ptr());
    if (dx.defined() && rows > 0) {
      T* pdx = static_cast<T*>(dx.data_ptr());
      const int grid = static_cast<int>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
      const bool vec = cols % kMapVec == 0 && vec_aligned(pd, sizeof(T)) && vec_aligned(px, sizeof(T)) &&
                       vec_aligned(pw, sizeof(T)) && vec_aligned(pdx, sizeof(T));
      count_vec_path("layernorm_backward", vec);
      if (vec)
        MPT_LAUNCH(grid, 32 * kWarpsPerBlock, 0, st, layernorm_backward_dx_kernel<T, kMapVec>)(
            pd, px, pw, pm, pr, pdx, rows, cols, accumulate_dx);
      else
        MPT_LAUNCH(grid, 32 * kWarpsPerBlock, 0, st, layernorm_backward_dx_kernel<T, 1>)(
            pd, px, pw, pm, pr, pdx, rows, cols, accumulate_dx);
      MPT_KERNEL_CHECK("layernorm_backward (dx)");
    }
    if (!dweight.defined() && !dbias.defined()) return;
    const LayerNormParamGrads<T> f{pd, px, pm, pr, cols};
    const DType dw_t = dweight.defined() ? dweight.dtype() : DType::F32;
    const DType db_t = dbias.defined() ? dbias.dtype() : DType::F32;
    MPT_DISPATCH_DEV_FLOAT(dw_t, "layernorm_backward dweight", [&](auto wtag) {
      using W = decltype(wtag);
      MPT_DISPATCH_DEV_FLOAT(db_t, "layernorm_backward dbias", [&](auto btag) {
        using B = decltype(btag);
        column_sums(f, rows, cols, dweight.defined() ? static_cast<W*>(dweight.data_ptr()) : nullptr,
                    dbias.defined() ? static_cast<B*>(dbias.data_ptr()) : nullptr, /*accumulate=*/true,
                    x.device().index, s);
      });
    });
  });
}

}  // namespace mpitron::cuda
