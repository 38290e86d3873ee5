// tensor/cpu/gelu.cpp — GELU (tanh approximation) forward and backward.
#include <cmath>

#include "tensor/cpu/common.h"
#include "tensor/cpu/ops.h"

namespace mpitron::cpu {

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCoef = 0.044715f;
}  // namespace

void gelu_forward(const Tensor& x, const Tensor& out, Stream) {
  const int64_t n = x.numel();
  dispatch_float(x.dtype(), "gelu_forward", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (n > 16384)
    for (int64_t i = 0; i < n; ++i) {
      const float v = to_f32(xp[i]);
      op[i] = from_f32<T>(0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + kCoef * v * v * v))));
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
#pragma omp parallel for schedule(static) if (n > 16384)
    for (int64_t i = 0; i < n; ++i) {
      const float v = to_f32(xp[i]);
      const float u = kSqrt2OverPi * (v + kCoef * v * v * v);
      const float t = std::tanh(u);
      const float du = kSqrt2OverPi * (1.0f + 3.0f * kCoef * v * v);
      const float grad = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
      dxp[i] = from_f32<T>(to_f32(dp[i]) * grad);
    }
  });
}

}  // namespace mpitron::cpu
