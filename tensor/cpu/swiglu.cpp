// tensor/cpu/swiglu.cpp — the gated activations (SwiGLU, GeGLU) forward and backward, rows
// in parallel, columns vectorised.
//
// SwiGLU: 1 − σ(a) is computed as e·σ(a), e = exp(−a), for a ≥ 0 (no cancellation when
// σ(a) → 1) and as 1 − σ(a) for a < 0 (where it is ≥ 1/2).
// GeGLU: the tanh GELU and its derivative of tensor/cuda/gelu_math.h (the CUDA kernels' own
// arithmetic).
#include "tensor/cpu/common.h"
#include "tensor/cpu/ops.h"
#include "tensor/cpu/vecmath.h"
#include "tensor/cuda/gelu_math.h"

namespace mpitron::cpu {

namespace {

struct Silu {
  static float act(float a) { return a * fast_sigmoid(a); }
  static float grad(float a) {
    const float e = fast_exp(-a), sg = 1.0f / (1.0f + e), one_minus = a >= 0.0f ? e * sg : 1.0f - sg;
    return sg * (1.0f + a * one_minus);
  }
  static float db(float d, float a) { return d * a * fast_sigmoid(a); }
};

struct GeluTanh {
  static float act(float a) { return gelu_math::gelu(a); }
  static float grad(float a) { return gelu_math::gelu_grad(a); }
  static float db(float d, float a) { return d * gelu_math::gelu(a); }
};

// out = act(a)·b over x = [a | b].
template <class Act> void glu_forward(const Tensor& x, const Tensor& out, const char* name) {
  const int64_t f = out.dim(-1), n = f ? out.numel() / f : 0;
  dispatch_float(x.dtype(), name, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (n * f > 16384)
    for (int64_t r = 0; r < n; ++r) {
      const T* a = xp + r * 2 * f;
      const T* b = a + f;
      T* o = op + r * f;
#pragma omp simd
      for (int64_t j = 0; j < f; ++j) o[j] = from_f32<T>(Act::act(to_f32(a[j])) * to_f32(b[j]));
    }
  });
}

// dx = [dout·b·act'(a) | dout·act(a)].
template <class Act> void glu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, const char* name) {
  const int64_t f = dout.dim(-1), n = f ? dout.numel() / f : 0;
  dispatch_float(x.dtype(), name, [&](auto tag) {
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
        // Element j reads a[j], b[j] and writes the same two places: dx may alias x.
        da[j] = from_f32<T>(dv * bv * Act::grad(av));
        db[j] = from_f32<T>(Act::db(dv, av));
      }
    }
  });
}

}  // namespace

void swiglu_forward(const Tensor& x, const Tensor& out, Stream) { glu_forward<Silu>(x, out, "swiglu_forward"); }
void swiglu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, Stream) {
  glu_backward<Silu>(dout, x, dx, "swiglu_backward");
}
void geglu_forward(const Tensor& x, const Tensor& out, Stream) { glu_forward<GeluTanh>(x, out, "geglu_forward"); }
void geglu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, Stream) {
  glu_backward<GeluTanh>(dout, x, dx, "geglu_backward");
}

}  // namespace mpitron::cpu
