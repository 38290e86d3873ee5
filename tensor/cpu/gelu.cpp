// tensor/cpu/gelu.cpp — GELU forward and backward: the tanh approximation and the
// exact erf form.
//
// With u = √(2/π)(x + 0.044715x³) and s = sigmoid(2u) = (1 + tanh u)/2:
//   gelu(x)  = x·s
//   gelu'(x) = s + 2·x·s·(1 − s)·du/dx
// which avoids the cancellation of 1 + tanh(u) for very negative x. The exact form,
// with Φ the normal CDF and φ its density (erfc, not 1 + erf, for the same reason):
//   gelu_erf(x)  = x·Φ(x),  Φ(x) = erfc(−x/√2)/2
//   gelu_erf'(x) = Φ(x) + x·φ(x)
// (std::erfc is a scalar call: these loops are not vectorised; BERT-sized MLPs only.)
#include <cmath>

#include "tensor/cpu/common.h"
#include "tensor/cpu/ops.h"
#include "tensor/cpu/vecmath.h"

namespace mpitron::cpu {

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCoef = 0.044715f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;
inline float normal_cdf(float x) { return 0.5f * std::erfc(-kInvSqrt2 * x); }
}  // namespace

void gelu_forward(const Tensor& x, const Tensor& out, Stream) {
  const int64_t n = x.numel();
  dispatch_float(x.dtype(), "gelu_forward", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
#pragma omp parallel for simd schedule(static) if (n > 16384)
    for (int64_t i = 0; i < n; ++i) {
      const float v = to_f32(xp[i]);
      op[i] = from_f32<T>(v * fast_sigmoid(2.0f * kSqrt2OverPi * (v + kCoef * v * v * v)));
    }
  });
}

void gelu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, Stream) {
  const int64_t n = x.numel();
  dispatch_float(x.dtype(), "gelu_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* dp = static_cast<const T*>(dout.data_ptr());
    T* dxp = static_cast<T*>(dx.data_ptr());
#pragma omp parallel for simd schedule(static) if (n > 16384)
    for (int64_t i = 0; i < n; ++i) {
      const float v = to_f32(xp[i]);
      const float u = kSqrt2OverPi * (v + kCoef * v * v * v);
      const float sg = fast_sigmoid(2.0f * u);
      const float du = kSqrt2OverPi * (1.0f + 3.0f * kCoef * v * v);
      const float grad = sg + 2.0f * v * sg * (1.0f - sg) * du;
      dxp[i] = from_f32<T>(to_f32(dp[i]) * grad);
    }
  });
}

void gelu_erf_forward(const Tensor& x, const Tensor& out, Stream) {
  const int64_t n = x.numel();
  dispatch_float(x.dtype(), "gelu_erf_forward", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (n > 16384)
    for (int64_t i = 0; i < n; ++i) {
      const float v = to_f32(xp[i]);
      op[i] = from_f32<T>(v * normal_cdf(v));
    }
  });
}

void gelu_erf_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, Stream) {
  const int64_t n = x.numel();
  dispatch_float(x.dtype(), "gelu_erf_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* dp = static_cast<const T*>(dout.data_ptr());
    T* dxp = static_cast<T*>(dx.data_ptr());
#pragma omp parallel for schedule(static) if (n > 16384)
    for (int64_t i = 0; i < n; ++i) {
      const float v = to_f32(xp[i]);
      const float grad = normal_cdf(v) + v * kInvSqrt2Pi * std::exp(-0.5f * v * v);
      dxp[i] = from_f32<T>(to_f32(dp[i]) * grad);
    }
  });
}

}  // namespace mpitron::cpu
