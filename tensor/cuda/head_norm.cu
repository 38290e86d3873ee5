// tensor/cuda/head_norm.cu — RMS normalisation of head views in two phases (head_norm.h).
//
//   x, out, dout, dx: (N, H, D) views, heads packed: row n's H·D values are contiguous at
//   p + n·s (s the view's row stride); its G groups (H per head, 1 whole row) are the runs
//   of L = H·D/G values at + g·L, the weight index of a value its offset e < L.
//   sumsq:    ss[n, g]   = Σ_e x²
//   forward:  rstd[n, g] = 1/√(ss/count + eps),  out = x·rstd·w[e]     (out may alias x)
//   dot:      dot[n, g]  = Σ_e dout·w[e]·x·rstd
//   backward: dx = rstd·(dout·w[e] − x·rstd·dot/count)                  (dx may alias dout)
//             dweight[e] += Σ_(n, g) dout·x·rstd  — the deterministic column sums of reduce.cuh
//             over the N·G groups as rows, launched BEFORE the dx kernel so an aliased dout
//             is read first (one stream: in order).
// One warp per group (rmsnorm.cu's shape), f32 math; 16-byte accesses (V = 8) when L and
// every row stride are multiples of 8 elements and every pointer is 16-byte aligned, else
// scalar — counted as "<op>.vec8" / "<op>.scalar" (tensor/path_stats.h).
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/map.cuh"
#include "tensor/cuda/ops.h"
#include "tensor/cuda/reduce.cuh"

namespace mpitron::cuda {

namespace {
constexpr int kWarpsPerBlock = 8;

// Group r = n·G + g of a view with row stride s: its L values at p + n·s + g·L.
template <typename T>
__device__ __forceinline__ T* group_at(T* p, int64_t s, int64_t r, int G, int L) {
  return p + (r / G) * s + (r % G) * static_cast<int64_t>(L);
}

template <typename T, int V>
__global__ void head_norm_sumsq_kernel(const T* x, int64_t sx, float* ss, int64_t groups, int G, int L) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (r >= groups) return;
  const T* xr = group_at(x, sx, r, G, L);
  float acc = 0.0f;
  for (int c = lane * V; c < L; c += 32 * V) {
    float u[V];
    load_f<V>(xr + c, u);
#pragma unroll
    for (int k = 0; k < V; ++k) acc += u[k] * u[k];
  }
  acc = warp_sum(acc);
  if (lane == 0) ss[r] = acc;
}

template <typename T, int V>
__global__ void head_norm_forward_kernel(const T* x, int64_t sx, const float* ss, const T* w, T* out, int64_t so,
                                         float* rstd, int64_t groups, int G, int L, float inv_count, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (r >= groups) return;
  const float rs = rsqrtf(ss[r] * inv_count + eps);
  const T* xr = group_at(x, sx, r, G, L);
  T* orow = group_at(out, so, r, G, L);
  for (int c = lane * V; c < L; c += 32 * V) {
    float u[V], wv[V];
    load_f<V>(xr + c, u);
    load_f<V>(w + c, wv);
#pragma unroll
    for (int k = 0; k < V; ++k) u[k] = u[k] * rs * wv[k];
    store_f<V>(orow + c, u);
  }
  if (lane == 0) rstd[r] = rs;
}

template <typename T, int V>
__global__ void head_norm_dot_kernel(const T* dout, int64_t sd, const T* x, int64_t sx, const T* w,
                                     const float* rstd, float* dot, int64_t groups, int G, int L) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (r >= groups) return;
  const float rs = rstd[r];
  const T* dr = group_at(dout, sd, r, G, L);
  const T* xr = group_at(x, sx, r, G, L);
  float acc = 0.0f;
  for (int c = lane * V; c < L; c += 32 * V) {
    float d[V], u[V], wv[V];
    load_f<V>(dr + c, d);
    load_f<V>(xr + c, u);
    load_f<V>(w + c, wv);
#pragma unroll
    for (int k = 0; k < V; ++k) acc += d[k] * wv[k] * (u[k] * rs);
  }
  acc = warp_sum(acc);
  if (lane == 0) dot[r] = acc;
}

template <typename T, int V>
__global__ void head_norm_backward_dx_kernel(const T* dout, int64_t sd, const T* x, int64_t sx, const T* w,
                                             const float* rstd, const float* dot, T* dx, int64_t sdx,
                                             int64_t groups, int G, int L, float inv_count) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (r >= groups) return;
  const float rs = rstd[r], c0 = dot[r] * inv_count;
  const T* dr = group_at(dout, sd, r, G, L);
  const T* xr = group_at(x, sx, r, G, L);
  T* gr = group_at(dx, sdx, r, G, L);
  for (int c = lane * V; c < L; c += 32 * V) {
    float d[V], u[V], wv[V];
    load_f<V>(dr + c, d);
    load_f<V>(xr + c, u);
    load_f<V>(w + c, wv);
#pragma unroll
    for (int k = 0; k < V; ++k) d[k] = rs * (d[k] * wv[k] - u[k] * rs * c0);
    store_f<V>(gr + c, d);
  }
}

// Column-sum functor over the groups as rows: (dout·x·rstd, 0) at (group r, offset c).
template <typename T> struct HeadNormWeightGrad {
  const T* dout;
  const T* x;
  const float* rstd;
  int64_t sd, sx;
  int G, L;
  __device__ float2 operator()(int64_t r, int c) const {
    return make_float2(to_float(group_at(dout, sd, r, G, L)[c]) * to_float(group_at(x, sx, r, G, L)[c]) * rstd[r],
                       0.0f);
  }
};

// The layout of one call: groups = N·G of L values; rows of a view at its stride(0).
struct Layout {
  int64_t groups;
  int G, L;
};
Layout layout_of(const Tensor& x, const Tensor& stat) {
  const int64_t G = stat.dim(1);
  return {x.dim(0) * G, static_cast<int>(G), static_cast<int>(x.dim(1) * x.dim(2) / G)};
}
int64_t row_stride(const Tensor& t) { return t.defined() ? t.strides()[0] : 0; }
// V = 8 is possible when L and each view's row stride are multiples of 8 and its pointer is aligned.
bool vec_ok(const Layout& l, size_t es, std::initializer_list<const Tensor*> views) {
  if (l.L % kMapVec != 0) return false;
  for (const Tensor* t : views)
    if (t->defined() && (row_stride(*t) % kMapVec != 0 || !vec_aligned(t->data_ptr(), es))) return false;
  return true;
}
int warp_grid(int64_t groups) { return static_cast<int>((groups + kWarpsPerBlock - 1) / kWarpsPerBlock); }
}  // namespace

void head_norm_sumsq(const Tensor& x, const Tensor& ss, Stream s) {
  DeviceGuard g(x);
  const Layout l = layout_of(x, ss);
  if (l.groups == 0) return;
  const cudaStream_t st = stream_of(s);
  MPT_DISPATCH_DEV_FLOAT(x.dtype(), "head_norm_sumsq", [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    float* ps = static_cast<float*>(ss.data_ptr());
    const bool vec = vec_ok(l, sizeof(T), {&x});
    count_vec_path("head_norm_sumsq", vec);
    if (vec)
      MPT_LAUNCH(warp_grid(l.groups), 32 * kWarpsPerBlock, 0, st, head_norm_sumsq_kernel<T, kMapVec>)(
          px, row_stride(x), ps, l.groups, l.G, l.L);
    else
      MPT_LAUNCH(warp_grid(l.groups), 32 * kWarpsPerBlock, 0, st, head_norm_sumsq_kernel<T, 1>)(
          px, row_stride(x), ps, l.groups, l.G, l.L);
  });
  MPT_KERNEL_CHECK("head_norm_sumsq");
}

void head_norm_forward(const Tensor& x, const Tensor& ss, int64_t count, float eps, const Tensor& weight,
                       const Tensor& out, const Tensor& rstd, Stream s) {
  DeviceGuard g(x);
  const Layout l = layout_of(x, ss);
  if (l.groups == 0) return;
  const cudaStream_t st = stream_of(s);
  const float inv_count = 1.0f / static_cast<float>(count);
  MPT_DISPATCH_DEV_FLOAT(x.dtype(), "head_norm_forward", [&](auto tag) {
    using T = decltype(tag);
    const T *px = static_cast<const T*>(x.data_ptr()), *pw = static_cast<const T*>(weight.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    const float* ps = static_cast<const float*>(ss.data_ptr());
    float* pr = static_cast<float*>(rstd.data_ptr());
    const bool vec = vec_ok(l, sizeof(T), {&x, &out, &weight});
    count_vec_path("head_norm_forward", vec);
    if (vec)
      MPT_LAUNCH(warp_grid(l.groups), 32 * kWarpsPerBlock, 0, st, head_norm_forward_kernel<T, kMapVec>)(
          px, row_stride(x), ps, pw, po, row_stride(out), pr, l.groups, l.G, l.L, inv_count, eps);
    else
      MPT_LAUNCH(warp_grid(l.groups), 32 * kWarpsPerBlock, 0, st, head_norm_forward_kernel<T, 1>)(
          px, row_stride(x), ps, pw, po, row_stride(out), pr, l.groups, l.G, l.L, inv_count, eps);
  });
  MPT_KERNEL_CHECK("head_norm_forward");
}

void head_norm_backward_dot(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                            const Tensor& dot, Stream s) {
  DeviceGuard g(x);
  const Layout l = layout_of(x, rstd);
  if (l.groups == 0) return;
  const cudaStream_t st = stream_of(s);
  MPT_DISPATCH_DEV_FLOAT(x.dtype(), "head_norm_backward_dot", [&](auto tag) {
    using T = decltype(tag);
    const T *pd = static_cast<const T*>(dout.data_ptr()), *px = static_cast<const T*>(x.data_ptr()),
            *pw = static_cast<const T*>(weight.data_ptr());
    const float* pr = static_cast<const float*>(rstd.data_ptr());
    float* pdot = static_cast<float*>(dot.data_ptr());
    const bool vec = vec_ok(l, sizeof(T), {&dout, &x, &weight});
    count_vec_path("head_norm_backward_dot", vec);
    if (vec)
      MPT_LAUNCH(warp_grid(l.groups), 32 * kWarpsPerBlock, 0, st, head_norm_dot_kernel<T, kMapVec>)(
          pd, row_stride(dout), px, row_stride(x), pw, pr, pdot, l.groups, l.G, l.L);
    else
      MPT_LAUNCH(warp_grid(l.groups), 32 * kWarpsPerBlock, 0, st, head_norm_dot_kernel<T, 1>)(
          pd, row_stride(dout), px, row_stride(x), pw, pr, pdot, l.groups, l.G, l.L);
  });
  MPT_KERNEL_CHECK("head_norm_backward_dot");
}

void head_norm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                        const Tensor& dot, int64_t count, const Tensor& dx, const Tensor& dweight, Stream s) {
  DeviceGuard g(x);
  const Layout l = layout_of(x, rstd);
  const cudaStream_t st = stream_of(s);
  const float inv_count = 1.0f / static_cast<float>(count);
  MPT_DISPATCH_DEV_FLOAT(x.dtype(), "head_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    const T *pd = static_cast<const T*>(dout.data_ptr()), *px = static_cast<const T*>(x.data_ptr()),
            *pw = static_cast<const T*>(weight.data_ptr());
    const float* pr = static_cast<const float*>(rstd.data_ptr());
    if (dweight.defined()) {  // first: dx may overwrite dout
      const HeadNormWeightGrad<T> f{pd, px, pr, row_stride(dout), row_stride(x), l.G, l.L};
      MPT_DISPATCH_DEV_FLOAT(dweight.dtype(), "head_norm_backward dweight", [&](auto wtag) {
        using W = decltype(wtag);
        column_sums(f, l.groups, l.L, static_cast<W*>(dweight.data_ptr()), static_cast<float*>(nullptr),
                    /*accumulate=*/true, x.device().index, s);
      });
    }
    if (!dx.defined() || l.groups == 0) return;
    T* pdx = static_cast<T*>(dx.data_ptr());
    const float* pdot = static_cast<const float*>(dot.data_ptr());
    const bool vec = vec_ok(l, sizeof(T), {&dout, &x, &weight, &dx});
    count_vec_path("head_norm_backward", vec);
    if (vec)
      MPT_LAUNCH(warp_grid(l.groups), 32 * kWarpsPerBlock, 0, st, head_norm_backward_dx_kernel<T, kMapVec>)(
          pd, row_stride(dout), px, row_stride(x), pw, pr, pdot, pdx, row_stride(dx), l.groups, l.G, l.L, inv_count);
    else
      MPT_LAUNCH(warp_grid(l.groups), 32 * kWarpsPerBlock, 0, st, head_norm_backward_dx_kernel<T, 1>)(
          pd, row_stride(dout), px, row_stride(x), pw, pr, pdot, pdx, row_stride(dx), l.groups, l.G, l.L, inv_count);
    MPT_KERNEL_CHECK("head_norm_backward (dx)");
  });
}

}  // namespace mpitron::cuda
