// tensor/cpu/softcap.cpp — logit soft-capping forward and backward (softcap.h):
// out = cap·tanh(x/cap), dx = dout·(1 − (out/cap)²). Element-wise in f32; out may alias x,
// dx may alias dout.
#include <cmath>

#include "tensor/cpu/common.h"
#include "tensor/cpu/ops.h"

namespace mpitron::cpu {

void softcap_forward(const Tensor& x, const Tensor& out, float cap, Stream) {
  const int64_t n = x.numel();
  const float inv = 1.0f / cap;
  dispatch_float(x.dtype(), "softcap_forward", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) op[i] = from_f32<T>(cap * std::tanh(to_f32(xp[i]) * inv));
  });
}

void softcap_backward(const Tensor& dout, const Tensor& out, const Tensor& dx, float cap, Stream) {
  const int64_t n = out.numel();
  const float inv = 1.0f / cap;
  dispatch_float(out.dtype(), "softcap_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* op = static_cast<const T*>(out.data_ptr());
    const T* dp = static_cast<const T*>(dout.data_ptr());
    T* dxp = static_cast<T*>(dx.data_ptr());
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) {
      const float t = to_f32(op[i]) * inv;
      dxp[i] = from_f32<T>(to_f32(dp[i]) * (1.0f - t * t));
    }
  });
}

}  // namespace mpitron::cpu
