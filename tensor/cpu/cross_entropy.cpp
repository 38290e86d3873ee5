// tensor/cpu/cross_entropy.cpp — fused softmax cross-entropy (loss and dlogits per row).
#include <cmath>

#include "tensor/cpu/common.h"
#include "tensor/cpu/ops.h"
#include "tensor/cpu/vecmath.h"

namespace mpitron::cpu {

void softmax_cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& losses,
                           const Tensor& dlogits, float dloss_scale, Stream) {
  const int64_t n = logits.dim(0), v = logits.dim(1);
  float* lp = losses.data<float>();
  dispatch_float(logits.dtype(), "softmax_cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(logits.data_ptr());
    T* dx = dlogits.defined() ? static_cast<T*>(dlogits.data_ptr()) : nullptr;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; ++r) {
      const T* row = x + r * v;
      const int64_t tgt = load_index(targets, r);
      float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
      for (int64_t j = 0; j < v; ++j) mx = std::max(mx, to_f32(row[j]));
      const float sum = blocked_sum(v, [&](int64_t j) { return fast_exp(to_f32(row[j]) - mx); });
      const float lse = mx + std::log(sum);
      const bool valid = tgt >= 0 && tgt < v;
      lp[r] = valid ? lse - to_f32(row[tgt]) : 0.0f;
      if (!dx) continue;
      T* drow = dx + r * v;  // may alias row: each element is read before it is written
      if (!valid) {
        for (int64_t j = 0; j < v; ++j) drow[j] = from_f32<T>(0.0f);
        continue;
      }
#pragma omp simd
      for (int64_t j = 0; j < v; ++j) drow[j] = from_f32<T>(dloss_scale * fast_exp(to_f32(row[j]) - lse));
      drow[tgt] = from_f32<T>(to_f32(drow[tgt]) - dloss_scale);
    }
  });
}

// ---- vocab-parallel phases ---------------------------------------------------------------------
// Phase 1: f32 logsumexp over the slice's columns (every row, ignored ones too) and the target
// logit when the target's column lies in this slice (else 0).
void cross_entropy_local_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                               const Tensor& lse, const Tensor& target_logit, Stream) {
  const int64_t n = logits.dim(0), v = logits.dim(1);
  float* lp = lse.data<float>();
  float* tp = target_logit.data<float>();
  dispatch_float(logits.dtype(), "cross_entropy_local_stats", [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(logits.data_ptr());
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; ++r) {
      const T* row = x + r * v;
      float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
      for (int64_t j = 0; j < v; ++j) mx = std::max(mx, to_f32(row[j]));
      if (mx == -INFINITY) {
        lp[r] = -INFINITY;  // empty slice or all -inf: exp sums to 0 (and avoids -inf − -inf)
      } else {
        const float sum = blocked_sum(v, [&](int64_t j) { return fast_exp(to_f32(row[j]) - mx); });
        lp[r] = mx + std::log(sum);
      }
      const int64_t tgt = load_index(targets, r);
      const int64_t local = tgt - vocab_start;
      tp[r] = tgt >= 0 && local >= 0 && local < v ? to_f32(row[local]) : 0.0f;
    }
  });
}

// Phase 2: scale · (exp(x − lse) − onehot) with the global lse; ignored rows get 0.
void cross_entropy_grad_from_lse(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                 const Tensor& lse, const Tensor& dlogits, float scale, Stream) {
  const int64_t n = logits.dim(0), v = logits.dim(1);
  const float* lp = lse.data<float>();
  dispatch_float(logits.dtype(), "cross_entropy_grad_from_lse", [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(logits.data_ptr());
    T* dx = static_cast<T*>(dlogits.data_ptr());
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; ++r) {
      const T* row = x + r * v;
      T* drow = dx + r * v;  // may alias row: each element is read before it is written
      const int64_t tgt = load_index(targets, r);
      if (tgt < 0) {
        for (int64_t j = 0; j < v; ++j) drow[j] = from_f32<T>(0.0f);
        continue;
      }
      const float l = lp[r];
      const int64_t local = tgt - vocab_start;
      const bool here = local >= 0 && local < v;
      const float xt = here ? to_f32(row[local]) : 0.0f;  // read before an in-place overwrite
#pragma omp simd
      for (int64_t j = 0; j < v; ++j) drow[j] = from_f32<T>(scale * fast_exp(to_f32(row[j]) - l));
      if (here) drow[local] = from_f32<T>(scale * (fast_exp(xt - l) - 1.0f));
    }
  });
}

}  // namespace mpitron::cpu
