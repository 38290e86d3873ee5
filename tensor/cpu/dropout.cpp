// tensor/cpu/dropout.cpp — Philox dropout; the mask is regenerated in backward.
#include "core/philox.h"
#include "tensor/cpu/common.h"
#include "tensor/cpu/ops.h"

namespace mpitron::cpu {

namespace {
void apply_mask(const Tensor& in, const Tensor& out, float p, uint64_t seed, uint64_t offset, const char* what) {
  const int64_t n = in.numel();
  const float keep_scale = 1.0f / (1.0f - p);
  dispatch_float(in.dtype(), what, [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(in.data_ptr());
    T* y = static_cast<T*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (n > 16384)
    for (int64_t i = 0; i < n; ++i) {
      const bool keep = philox_uniform(seed, offset, static_cast<uint64_t>(i)) >= p;
      y[i] = from_f32<T>(keep ? to_f32(x[i]) * keep_scale : 0.0f);
    }
  });
}
}  // namespace

void dropout_forward(const Tensor& x, const Tensor& out, float p, uint64_t seed, uint64_t offset, Stream) {
  apply_mask(x, out, p, seed, offset, "dropout_forward");
}

void dropout_backward(const Tensor& dout, const Tensor& dx, float p, uint64_t seed, uint64_t offset, Stream) {
  apply_mask(dout, dx, p, seed, offset, "dropout_backward");
}

}  // namespace mpitron::cpu
