// tensor/cpu/swiglu.cpp — SwiGLU forward and backward, rows in parallel, columns vectorised.
//
// 1 − σ(a) is computed as e·σ(a), e = exp(−a), for a ≥ 0 (no cancellation when σ(a) → 1)
// and as 1 − σ(a) for a < 0 (where it is ≥ 1/2).
#include "tensor/cpu/common.h"
#include "tensor/cpu/ops.h"
#include "tensor/cpu/vecmath.h"

namespace mpitron::cpu {

void swiglu_forward(const Tensor& x, const Tensor& out, Stream) {
  const int64_t f = out.dim(-1), n = f ? out.numel() / f : 0;
  dispatch_float(x.dtype(), "swiglu_forward", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (n * f > 16384)
    for (int64_t r = 0; r < n; ++r) {
      const T* a = xp + r * 2 * f;
      const T* b = a + f;
      T* o = op + r * f;
#pragma omp simd
      for (int64_t j = 0; j < f; ++j) {
        const float av = to_f32(a[j]);
        o[j] = from_f32<T>(av * fast_sigmoid(av) * to_f32(b[j]));
      }
    }
  });
}

void swiglu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, Stream) {
  const int64_t f = dout.dim(-1), n = f ? dout.numel() / f : 0;
  dispatch_float(x.dtype(), "swiglu_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* dp = static_cast<const T*>(dout.data_ptr());
    T* gp = static_cast<T*>(dx.data_ptr());
#pragma omp parallel for schedule(static) if (n * f > 16384)
    for (int64_t r = 0; r < n; ++r) {
      const T* a = xp + r * 2 * f;
      const T* b = a + f;
      const T* d = dp + r * f;
      T* da = gp + r * 2 * f;
      T* db = da + f;
#pragma omp simd
      for (int64_t j = 0; j < f; ++j) {
        const float av = to_f32(a[j]), bv = to_f32(b[j]), dv = to_f32(d[j]);
        const float e = fast_exp(-av), sg = 1.0f / (1.0f + e), one_minus = av >= 0.0f ? e * sg : 1.0f - sg;
        const float dsilu = sg * (1.0f + av * one_minus);
        // Element j reads a[j], b[j] and writes the same two places: dx may alias x.
        da[j] = from_f32<T>(dv * bv * dsilu);
        db[j] = from_f32<T>(dv * av * sg);
      }
    }
  });
}

}  // namespace mpitron::cpu
