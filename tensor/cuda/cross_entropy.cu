// tensor/cuda/cross_entropy.cu — fused softmax cross-entropy over the vocabulary.
//   logits (N, V) f32/bf16/f16; targets (N) i32/i64 (< 0 or >= V: ignored)
//   losses (N) f32 = logsumexp(logits[n]) − logits[n, t_n]   (0 when ignored)
//   dlogits (N, V) logits' dtype, may BE logits (in place), optional:
//     dloss_scale · (softmax(logits[n]) − onehot(t_n))       (0 when ignored)
// One block per row, two reads of the row: pass 1 an online (max, Σexp) per
// thread merged across the block; pass 2 writes the gradient. No probability
// tensor. In place is safe: the target logit is read in pass 1, and in pass 2
// every element is read and then written by the same thread.
//
// Vocab-parallel phases (cross_entropy_local_stats / cross_entropy_grad_from_lse):
// logits (N, Vl) are columns [vocab_start, vocab_start + Vl) of the full vocabulary;
// targets are global ids (< 0: ignored).
//   phase 1: one block per row, the same online (max, Σexp) reduction → lse (N) f32
//            for every row (ignored ones too) and target_logit (N) f32 (0 off-slice);
//   phase 2: pointwise over N·Vl: scale · (exp(x − lse[n]) − onehot), 0 for ignored
//            rows; in place is safe (each element read then written by one thread).
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/map.cuh"
#include "tensor/cuda/ops.h"
#include "tensor/cuda/row_stats.cuh"

namespace mpitron::cuda {

namespace {
constexpr int kThreads = 512;

template <typename T, typename I, int V>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_kernel(const T* logits, const I* targets, float* losses, T* dlogits, int64_t vocab,
                         float dloss_scale) {
  __shared__ float sh_m[32], sh_s[32];
  __shared__ float sh_target_logit;
  const int64_t row = blockIdx.x;
  const T* xr = logits + row * vocab;
  const int64_t t = static_cast<int64_t>(targets[row]);
  const bool valid = t >= 0 && t < vocab;

  if (threadIdx.x == 0) sh_target_logit = valid ? to_float(xr[t]) : 0.0f;  // before the block's syncs
  const float lse = block_logsumexp<T, V>(xr, vocab, sh_m, sh_s);
  if (threadIdx.x == 0) losses[row] = valid ? lse - sh_target_logit : 0.0f;
  if (!dlogits) return;

  T* dr = dlogits + row * vocab;
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * V; c < vocab; c += static_cast<int64_t>(blockDim.x) * V) {
    float u[V];
    load_f<V>(xr + c, u);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float p = expf(u[k] - lse);
      u[k] = valid ? dloss_scale * (p - (c + k == t ? 1.0f : 0.0f)) : 0.0f;
    }
    store_f<V>(dr + c, u);
  }
}
}  // namespace

void softmax_cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& losses, const Tensor& dlogits,
                           float dloss_scale, Stream s) {
  DeviceGuard g(logits);
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  if (rows == 0) return;
  const cudaStream_t st = stream_of(s);
  MPT_DISPATCH_DEV_FLOAT(logits.dtype(), "softmax_cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    MPT_DISPATCH_INDEX(targets.dtype(), "softmax_cross_entropy", [&](auto itag) {
      using I = decltype(itag);
      const T* px = static_cast<const T*>(logits.data_ptr());
      T* pd = dlogits.defined() ? static_cast<T*>(dlogits.data_ptr()) : nullptr;
      const I* pt = static_cast<const I*>(targets.data_ptr());
      float* pl = static_cast<float*>(losses.data_ptr());
      const bool vec = vocab % kMapVec == 0 && vec_aligned(px, sizeof(T)) && vec_aligned(pd, sizeof(T));
      count_vec_path("softmax_cross_entropy", vec);
      if (vec)
        MPT_LAUNCH(static_cast<unsigned>(rows), kThreads, 0, st, cross_entropy_kernel<T, I, kMapVec>)(px, pt, pl, pd, vocab, dloss_scale);
      else
        MPT_LAUNCH(static_cast<unsigned>(rows), kThreads, 0, st, cross_entropy_kernel<T, I, 1>)(px, pt, pl, pd, vocab,
                                                                                       dloss_scale);
    });
  });
  MPT_KERNEL_CHECK("softmax_cross_entropy");
}

// ---- vocab-parallel phases ---------------------------------------------------------------------
namespace {

template <typename T, typename I, int V>
__global__ void __launch_bounds__(kThreads)
    ce_local_stats_kernel(const T* logits, const I* targets, int64_t vocab, int64_t vocab_start, float* lse,
                          float* target_logit) {
  __shared__ float sh_m[32], sh_s[32];
  const int64_t row = blockIdx.x;
  const T* xr = logits + row * vocab;

  // An empty slice or an all -inf row has Σexp = 0: lse = -inf.
  const float l = block_logsumexp<T, V>(xr, vocab, sh_m, sh_s);
  if (threadIdx.x == 0) {
    lse[row] = l;
    const int64_t t = static_cast<int64_t>(targets[row]);
    const int64_t local = t - vocab_start;
    target_logit[row] = t >= 0 && local >= 0 && local < vocab ? to_float(xr[local]) : 0.0f;
  }
}

// Pointwise functor for launch_map: element i of the flattened (N, Vl) matrix. The V-wide
// path is only used when Vl % V == 0, so a chunk never straddles two rows.
template <typename T, typename I> struct GradFromLse {
  const T* x;
  const I* targets;
  const float* lse;
  T* dx;
  int64_t vocab, vocab_start;
  float scale;

  template <int V> __device__ __forceinline__ void apply(int64_t i) const {
    const int64_t row = i / vocab, col = i - row * vocab;
    const int64_t t = static_cast<int64_t>(targets[row]);
    float u[V];
    if (t < 0) {
#pragma unroll
      for (int k = 0; k < V; ++k) u[k] = 0.0f;
    } else {
      const float l = lse[row];
      const int64_t local = t - vocab_start;
      load_f<V>(x + i, u);
#pragma unroll
      for (int k = 0; k < V; ++k) u[k] = scale * (expf(u[k] - l) - (col + k == local ? 1.0f : 0.0f));
    }
    store_f<V>(dx + i, u);
  }
};

}  // namespace

void cross_entropy_local_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start, const Tensor& lse,
                               const Tensor& target_logit, Stream s) {
  DeviceGuard g(logits);
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  if (rows == 0) return;
  const cudaStream_t st = stream_of(s);
  MPT_DISPATCH_DEV_FLOAT(logits.dtype(), "cross_entropy_local_stats", [&](auto tag) {
    using T = decltype(tag);
    MPT_DISPATCH_INDEX(targets.dtype(), "cross_entropy_local_stats", [&](auto itag) {
      using I = decltype(itag);
      const T* px = static_cast<const T*>(logits.data_ptr());
      const I* pt = static_cast<const I*>(targets.data_ptr());
      float* pl = static_cast<float*>(lse.data_ptr());
      float* ptl = static_cast<float*>(target_logit.data_ptr());
      const bool vec = vocab % kMapVec == 0 && vec_aligned(px, sizeof(T));
      count_vec_path("cross_entropy_local_stats", vec);
      if (vec)
        MPT_LAUNCH(static_cast<unsigned>(rows), kThreads, 0, st, ce_local_stats_kernel<T, I, kMapVec>)(px, pt, vocab, vocab_start, pl, ptl);
      else
        MPT_LAUNCH(static_cast<unsigned>(rows), kThreads, 0, st, ce_local_stats_kernel<T, I, 1>)(px, pt, vocab, vocab_start, pl, ptl);
    });
  });
  MPT_KERNEL_CHECK("cross_entropy_local_stats");
}

void cross_entropy_grad_from_lse(const Tensor& logits, const Tensor& targets, int64_t vocab_start, const Tensor& lse,
                                 const Tensor& dlogits, float scale, Stream s) {
  DeviceGuard g(logits);
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  if (rows == 0 || vocab == 0) return;
  MPT_DISPATCH_DEV_FLOAT(logits.dtype(), "cross_entropy_grad_from_lse", [&](auto tag) {
    using T = decltype(tag);
    MPT_DISPATCH_INDEX(targets.dtype(), "cross_entropy_grad_from_lse", [&](auto itag) {
      using I = decltype(itag);
      GradFromLse<T, I> f{static_cast<const T*>(logits.data_ptr()), static_cast<const I*>(targets.data_ptr()),
                          static_cast<const float*>(lse.data_ptr()), static_cast<T*>(dlogits.data_ptr()),
                          vocab, vocab_start, scale};
      const bool vec_ok = vocab % kMapVec == 0 && vec_aligned(f.x, sizeof(T)) && vec_aligned(f.dx, sizeof(T));
      launch_map(rows * vocab, f, vec_ok, s, "cross_entropy_grad_from_lse");
    });
  });
}

}  // namespace mpitron::cuda
