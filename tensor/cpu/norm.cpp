// tensor/cpu/norm.cpp — sum of squares (f64 accumulation) for global-norm clipping.
#include "tensor/cpu/common.h"
#include "tensor/cpu/ops.h"

namespace mpitron::cpu {

void sum_squares(const Tensor& x, const Tensor& out, Stream) {
  const int64_t n = x.numel();
  double acc = 0;
  dispatch_float(x.dtype(), "sum_squares", [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(x.data_ptr());
#pragma omp parallel for schedule(static) reduction(+ : acc) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) {
      const double v = to_f32(p[i]);
      acc += v * v;
    }
  });
  out.data<float>()[0] += static_cast<float>(acc);
}

}  // namespace mpitron::cpu
