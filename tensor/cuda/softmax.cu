// tensor/cuda/softmax.cu — row-wise softmax over the last dim, forward and backward.
//   forward:  x, out (N, C):  out = exp(x − max) / Σ exp(x − max)        (f32 math, any C)
//   backward: dx (N, C) = out ⊙ (dout − Σ_c dout·out)   (overwritten; uses out, not x)
// One warp per row. Forward keeps an online (max, sum) pair per lane so the row
// is read once for the statistics and once for the output.
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/map.cuh"
#include "tensor/cuda/ops.h"
#include "tensor/cuda/row_stats.cuh"

namespace mpitron::cuda {

namespace {
constexpr int kWarpsPerBlock = 8;

template <typename T, int V>
__global__ void softmax_forward_kernel(const T* x, T* out, int64_t rows, int cols) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  const T* xr = x + row * cols;
  T* outr = out + row * cols;
  float m = -INFINITY, s = 0.0f;
  thread_max_sum<T, V>(xr, cols, lane * V, 32 * V, m, s);
  warp_max_sum(m, s);
  const float inv = 1.0f / s;
  for (int c = lane * V; c < cols; c += 32 * V) {
    float u[V];
    load_f<V>(xr + c, u);
#pragma unroll
    for (int k = 0; k < V; ++k) u[k] = expf(u[k] - m) * inv;
    store_f<V>(outr + c, u);
  }
}

template <typename T, int V>
__global__ void softmax_backward_kernel(const T* dout, const T* out, T* dx, int64_t rows, int cols) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  const T* dr = dout + row * cols;
  const T* yr = out + row * cols;
  T* dxr = dx + row * cols;
  float dot = 0.0f;
  for (int c = lane * V; c < cols; c += 32 * V) {
    float d[V], y[V];
    load_f<V>(dr + c, d);
    load_f<V>(yr + c, y);
#pragma unroll
    for (int k = 0; k < V; ++k) dot += d[k] * y[k];
  }
  dot = warp_sum(dot);
  for (int c = lane * V; c < cols; c += 32 * V) {
    float d[V], y[V];
    load_f<V>(dr + c, d);
    load_f<V>(yr + c, y);
#pragma unroll
    for (int k = 0; k < V; ++k) d[k] = y[k] * (d[k] - dot);
    store_f<V>(dxr + c, d);
  }
}
}  // namespace

void softmax_forward(const Tensor& x, const Tensor& out, Stream s) {
  DeviceGuard g(x);
  const int cols = static_cast<int>(x.dim(-1));
  const int64_t rows = cols ? x.numel() / cols : 0;
  if (rows == 0) return;
  const int grid = static_cast<int>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const cudaStream_t st = stream_of(s);
  MPT_DISPATCH_DEV_FLOAT(x.dtype(), "softmax_forward", [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    const bool vec = cols % kMapVec == 0 && vec_aligned(px, sizeof(T)) && vec_aligned(po, sizeof(T));
    count_vec_path("softmax_forward", vec);
    if (vec)
      MPT_LAUNCH(grid, 32 * kWarpsPerBlock, 0, st, softmax_forward_kernel<T, kMapVec>)(px, po, rows, cols);
    else
      MPT_LAUNCH(grid, 32 * kWarpsPerBlock, 0, st, softmax_forward_kernel<T, 1>)(px, po, rows, cols);
  });
  MPT_KERNEL_CHECK("softmax_forward");
}

void softmax_backward(const Tensor& dout, const Tensor& out, const Tensor& dx, Stream s) {
  DeviceGuard g(out);
  const int cols = static_cast<int>(out.dim(-1));
  const int64_t rows = cols ? out.numel() / cols : 0;
  if (rows == 0) return;
  const int grid = static_cast<int>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const cudaStream_t st = stream_of(s);
  MPT_DISPATCH_DEV_FLOAT(out.dtype(), "softmax_backward", [&](auto tag) {
    using T = decltype(tag);
    const T *pd = static_cast<const T*>(dout.data_ptr()), *py = static_cast<const T*>(out.data_ptr());
    T* pdx = static_cast<T*>(dx.data_ptr());
    const bool vec = cols % kMapVec == 0 && vec_aligned(pd, sizeof(T)) && vec_aligned(py, sizeof(T)) && vec_aligned(pdx, sizeof(T));
    count_vec_path("softmax_backward", vec);
    if (vec)
      MPT_LAUNCH(grid, 32 * kWarpsPerBlock, 0, st, softmax_backward_kernel<T, kMapVec>)(pd, py, pdx, rows, cols);
    else
      MPT_LAUNCH(grid, 32 * kWarpsPerBlock, 0, st, softmax_backward_kernel<T, 1>)(pd, py, pdx, rows, cols);
  });
  MPT_KERNEL_CHECK("softmax_backward");
}

}  // namespace mpitron::cuda
