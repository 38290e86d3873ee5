// tensor/cpu/adamw.cpp — fused AdamW step (torch.optim.AdamW semantics).
#include <cmath>

#include "tensor/cpu/common.h"
#include "tensor/cpu/ops.h"

namespace mpitron::cpu {

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const Tensor& param_copy, const AdamWArgs& a, Stream) {
  const int64_t n = param.numel();
  float* p = param.data<float>();
  float* mp = m.data<float>();
  float* vp = v.data<float>();
  const double bc1 = 1.0 - std::pow(static_cast<double>(a.beta1), static_cast<double>(a.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(a.beta2), static_cast<double>(a.step));
  const float step_size = static_cast<float>(a.lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float decay = 1.0f - a.lr * a.weight_decay;
  dispatch_float(grad.dtype(), "adamw_step", [&](auto tag) {
    using G = decltype(tag);
    const G* g = static_cast<const G*>(grad.data_ptr());
#pragma omp parallel for schedule(static) if (n > 16384)
    for (int64_t i = 0; i < n; ++i) {
      const float gi = to_f32(g[i]) * a.grad_scale;
      const float mi = a.beta1 * mp[i] + (1.0f - a.beta1) * gi;
      const float vi = a.beta2 * vp[i] + (1.0f - a.beta2) * gi * gi;
      mp[i] = mi;
      vp[i] = vi;
      p[i] = p[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + a.eps);
    }
  });
  if (param_copy.defined()) cpu::cast(param.view(param_copy.shape()), param_copy, Stream());
}

}  // namespace mpitron::cpu
