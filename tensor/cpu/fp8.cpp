// tensor/cpu/fp8.cpp — fp8 amax and quantise–dequantise (fp8.h) on the host: the emulated fp8
// operand of the CPU backend, the same per-element function as the CUDA kernels.
#include <cmath>

#include "tensor/cpu/common.h"
#include "tensor/cpu/ops.h"

namespace mpitron::cpu {

void fp8_amax(const Tensor& x, const Tensor& amax, Stream) {
  const int64_t n = x.numel();
  float m = 0.0f;
  dispatch_float(x.dtype(), "fp8_amax", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.data_ptr());
#pragma omp parallel for reduction(max : m) schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) {
      const float a = std::fabs(to_f32(xp[i]));
      if (a > m) m = a;  // NaN compares false: ignored, as fmaxf
    }
  });
  *static_cast<float*>(amax.data_ptr()) = m;
}

void fp8_quantize_dequantize(const Tensor& x, const Tensor& scale, Fp8Format f, const Tensor& out, Stream) {
  const int64_t n = x.numel();
  const float sc = *static_cast<const float*>(scale.data_ptr()), inv = 1.0f / sc;
  dispatch_float(x.dtype(), "fp8_quantize_dequantize", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) op[i] = from_f32<T>(fp8_quantize_dequantize(to_f32(xp[i]), sc, inv, f));
  });
}

}  // namespace mpitron::cpu
