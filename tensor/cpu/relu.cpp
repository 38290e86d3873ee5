// tensor/cpu/relu.cpp — ReLU forward and backward (relu.h): out = max(x, 0),
// dx = dout·[x > 0]. Element-wise in f32; out may alias x, dx may alias dout.
#include "tensor/cpu/common.h"
#include "tensor/cpu/ops.h"

namespace mpitron::cpu {

void relu_forward(const Tensor& x, const Tensor& out, Stream) {
  const int64_t n = x.numel();
  dispatch_float(x.dtype(), "relu_forward", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) {
      const float v = to_f32(xp[i]);
      op[i] = from_f32<T>(v > 0.0f || v != v ? v : 0.0f);  // NaN propagates (torch.relu)
    }
  });
}

void relu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, Stream) {
  const int64_t n = x.numel();
  dispatch_float(x.dtype(), "relu_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* dp = static_cast<const T*>(dout.data_ptr());
    T* dxp = static_cast<T*>(dx.data_ptr());
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) dxp[i] = from_f32<T>(to_f32(xp[i]) > 0.0f ? to_f32(dp[i]) : 0.0f);
  });
}

}  // namespace mpitron::cpu
