// tensor/cuda/moe_permute.cu — MoE token permutation (tensor/moe_permute.h).
//   permute:   out[dest[n·k + j]] = x[n]                          one warp per token
//   backward:  dx[n] = Σ_j dout[dest[n·k + j]]                    one warp per token, j in order
//   unpermute: y[n]  = Σ_j probs[n, j] · in[dest[n·k + j]]        one warp per token, j in order
//   backward:  din[dest[n·k + j]] = probs[n, j] · dy[n]           one warp per (n, j), which also
//              dprobs[n, j] = ⟨dy[n], in[dest[n·k + j]]⟩          reduces its dot product (warp_sum)
// Every output row has one writer: no atomics, the same bits run to run. The sums over
// j run in the CPU's order; dprobs' sum over the row is a warp reduction (its order
// differs from the CPU's sequential one in the last bits). Rows move in 8-element
// vectors when C % 8 == 0 and the pointers allow.
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/map.cuh"
#include "tensor/cuda/ops.h"

namespace mpitron::cuda {

namespace {
constexpr int kWarps = 8;  // warps per block

__device__ __forceinline__ int64_t row_of(const int32_t* dest, int64_t i, int64_t rows) {
  const int64_t r = dest[i];
  return r >= 0 && r < rows ? r : -1;
}

template <typename T, int V>
__global__ void permute_kernel(const T* x, const int32_t* dest, T* out, int64_t N, int k, int C, int64_t R) {
  const int lane = threadIdx.x & 31;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (n >= N) return;
  for (int j = 0; j < k; ++j) {
    const int64_t r = row_of(dest, n * k + j, R);
    if (r < 0) continue;
    for (int c = lane * V; c < C; c += 32 * V) {
      float u[V];
      load_f<V>(x + n * C + c, u);
      store_f<V>(out + r * C + c, u);
    }
  }
}

// y[n] = Σ_j w_j · rows[dest[n·k + j]], w_j = probs[n, j] (or 1 without probs).
template <typename T, int V>
__global__ void gather_sum_kernel(const T* rows, const int32_t* dest, const float* probs, T* y, int64_t N, int k,
                                  int C, int64_t R) {
  const int lane = threadIdx.x & 31;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (n >= N) return;
  for (int c = lane * V; c < C; c += 32 * V) {
    float acc[V];
#pragma unroll
    for (int v = 0; v < V; ++v) acc[v] = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int64_t r = row_of(dest, n * k + j, R);
      if (r < 0) continue;
      const float w = probs ? probs[n * k + j] : 1.0f;
      float u[V];
      load_f<V>(rows + r * C + c, u);
#pragma unroll
      for (int v = 0; v < V; ++v) acc[v] += w * u[v];
    }
    store_f<V>(y + n * C + c, acc);
  }
}

template <typename T, int V>
__global__ void unpermute_backward_kernel(const T* dy, const T* in, const int32_t* dest, const float* probs, T* din,
                                          float* dprobs, int64_t N, int k, int C, int64_t R) {
  const int lane = threadIdx.x & 31;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);  // (n, j) = i
  if (i >= N * k) return;
  const int64_t n = i / k, r = row_of(dest, i, R);
  float dot = 0.0f;
  if (r >= 0) {
    const float w = probs[i];
    for (int c = lane * V; c < C; c += 32 * V) {
      float g[V], u[V], o[V];
      load_f<V>(dy + n * C + c, g);
      load_f<V>(in + r * C + c, u);
#pragma unroll
      for (int v = 0; v < V; ++v) {
        o[v] = w * g[v];
        dot += g[v] * u[v];
      }
      store_f<V>(din + r * C + c, o);
    }
  }
  dot = warp_sum(dot);
  if (lane == 0) dprobs[i] = dot;
}

template <typename T> bool rows_vec(int C, std::initializer_list<const void*> ps) {
  if (C % kMapVec != 0) return false;
  for (const void* p : ps)
    if (!vec_aligned(p, sizeof(T))) return false;
  return true;
}
int blocks(int64_t items) { return static_cast<int>((items + kWarps - 1) / kWarps); }
}  // namespace

void moe_permute(const Tensor& x, const Tensor& dest, const Tensor& out, Stream s) {
  DeviceGuard g(x);
  const int64_t N = x.dim(0), R = out.dim(0);
  const int C = static_cast<int>(x.dim(1)), k = static_cast<int>(N ? dest.numel() / N : 1);
  if (N == 0 || C == 0) return;
  const cudaStream_t st = stream_of(s);
  MPT_DISPATCH_DEV_FLOAT(x.dtype(), "moe_permute", [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    const bool vec = rows_vec<T>(C, {px, po});
    count_vec_path("moe_permute", vec);
    if (vec)
      MPT_LAUNCH(blocks(N), 32 * kWarps, 0, st, permute_kernel<T, kMapVec>)(px, dest.data<int32_t>(), po, N, k, C, R);
    else
      MPT_LAUNCH(blocks(N), 32 * kWarps, 0, st, permute_kernel<T, 1>)(px, dest.data<int32_t>(), po, N, k, C, R);
  });
  MPT_KERNEL_CHECK("moe_permute");
}

namespace {
void gather_sum(const Tensor& rows, const Tensor& dest, const float* probs, const Tensor& y, Stream s, const char* what) {
  DeviceGuard g(y);
  const int64_t N = y.dim(0), R = rows.dim(0);
  const int C = static_cast<int>(y.dim(1)), k = static_cast<int>(N ? dest.numel() / N : 1);
  if (N == 0 || C == 0) return;
  const cudaStream_t st = stream_of(s);
  MPT_DISPATCH_DEV_FLOAT(y.dtype(), what, [&](auto tag) {
    using T = decltype(tag);
    const T* pr = static_cast<const T*>(rows.data_ptr());
    T* py = static_cast<T*>(y.data_ptr());
    const bool vec = rows_vec<T>(C, {pr, py});
    count_vec_path(what, vec);
    if (vec)
      MPT_LAUNCH(blocks(N), 32 * kWarps, 0, st, gather_sum_kernel<T, kMapVec>)(pr, dest.data<int32_t>(), probs, py, N, k, C, R);
    else
      MPT_LAUNCH(blocks(N), 32 * kWarps, 0, st, gather_sum_kernel<T, 1>)(pr, dest.data<int32_t>(), probs, py, N, k, C, R);
  });
  MPT_KERNEL_CHECK(what);
}
}  // namespace

void moe_permute_backward(const Tensor& dout, const Tensor& dest, const Tensor& dx, Stream s) {
  gather_sum(dout, dest, nullptr, dx, s, "moe_permute_backward");
}

void moe_unpermute(const Tensor& in, const Tensor& dest, const Tensor& probs, const Tensor& y, Stream s) {
  gather_sum(in, dest, probs.data<float>(), y, s, "moe_unpermute");
}

void moe_unpermute_backward(const Tensor& dy, const Tensor& in, const Tensor& dest, const Tensor& probs,
                            const Tensor& din, const Tensor& dprobs, Stream s) {
  DeviceGuard g(dy);
  const int64_t N = dy.dim(0), R = in.dim(0);
  const int C = static_cast<int>(dy.dim(1)), k = static_cast<int>(N ? dest.numel() / N : 1);
  if (N == 0) return;
  const cudaStream_t st = stream_of(s);
  MPT_DISPATCH_DEV_FLOAT(dy.dtype(), "moe_unpermute_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* pdy = static_cast<const T*>(dy.data_ptr());
    const T* pi = static_cast<const T*>(in.data_ptr());
    T* pdi = static_cast<T*>(din.data_ptr());
    const bool vec = rows_vec<T>(C, {pdy, pi, pdi});
    count_vec_path("moe_unpermute_backward", vec);
    if (vec)
      MPT_LAUNCH(blocks(N * k), 32 * kWarps, 0, st, unpermute_backward_kernel<T, kMapVec>)(
          pdy, pi, dest.data<int32_t>(), probs.data<float>(), pdi, dprobs.data<float>(), N, k, C, R);
    else
      MPT_LAUNCH(blocks(N * k), 32 * kWarps, 0, st, unpermute_backward_kernel<T, 1>)(
          pdy, pi, dest.data<int32_t>(), probs.data<float>(), pdi, dprobs.data<float>(), N, k, C, R);
  });
  MPT_KERNEL_CHECK("moe_unpermute_backward");
}

}  // namespace mpitron::cuda
