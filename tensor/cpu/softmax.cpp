// tensor/cpu/softmax.cpp — row softmax forward and backward.
#include <cmath>

#include "tensor/cpu/common.h"
#include "tensor/cpu/ops.h"
#include "tensor/cpu/vecmath.h"

namespace mpitron::cpu {

void softmax_forward(const Tensor& x, const Tensor& out, Stream) {
  const int64_t c = x.dim(-1), n = c ? x.numel() / c : 0;
  dispatch_float(x.dtype(), "softmax_forward", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
#pragma omp parallel
    {
      std::vector<float> e(static_cast<size_t>(c));
#pragma omp for schedule(static)
      for (int64_t r = 0; r < n; ++r) {
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j < c; ++j) mx = std::max(mx, to_f32(xp[r * c + j]));
#pragma omp simd
        for (int64_t j = 0; j < c; ++j) e[j] = fast_exp(to_f32(xp[r * c + j]) - mx);
        const float s = blocked_sum(c, [&](int64_t j) { return e[j]; });
        const float inv = 1.0f / s;
        for (int64_t j = 0; j < c; ++j) op[r * c + j] = from_f32<T>(e[j] * inv);
      }
    }
  });
}

void softmax_backward(const Tensor& dout, const Tensor& out, const Tensor& dx, Stream) {
  const int64_t c = out.dim(-1), n = c ? out.numel() / c : 0;
  dispatch_float(out.dtype(), "softmax_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* yp = static_cast<const T*>(out.data_ptr());
    const T* dp = static_cast<const T*>(dout.data_ptr());
    T* dxp = static_cast<T*>(dx.data_ptr());
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; ++r) {
      const float dot = blocked_sum(c, [&](int64_t j) { return to_f32(dp[r * c + j]) * to_f32(yp[r * c + j]); });
      for (int64_t j = 0; j < c; ++j) {
        const float y = to_f32(yp[r * c + j]);
        dxp[r * c + j] = from_f32<T>(y * (to_f32(dp[r * c + j]) - dot));
      }
    }
  });
}

}  // namespace mpitron::cpu
