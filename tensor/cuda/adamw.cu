// tensor/cuda/adamw.cu — fused AdamW step (torch.optim.AdamW semantics, adamw.h).
//   param, m, v (n) f32; grad (n) f32/bf16/f16; param_copy (n) bf16/f16/f32 or none.
//   g = grad·grad_scale; param ·= 1 − lr·wd; m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g²;
//   param −= lr · (m / bc1) / (√(v / bc2) + eps),  bc_i = 1 − β_i^step,
//   evaluated as param·decay − (lr/bc1)·m / (√v/√bc2 + eps) with the constants
//   computed on the host in double — the CPU backend's exact operation order.
// One pass over all five arrays; param_copy receives the new param in its dtype
// (the bf16 weights the next forward uses).
#include <cmath>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/map.cuh"
#include "tensor/cuda/ops.h"

namespace mpitron::cuda {

namespace {
template <typename G, typename P> struct AdamWOp {
  float* param;
  const G* grad;
  float* m;
  float* v;
  P* copy;  // may be null
  float step_size, bc2_sqrt, beta1, beta2, eps, decay, grad_scale;
  template <int V> __device__ void apply(int64_t i) const {
    float w[V], g[V], mm[V], vv[V];
    load_f<V>(param + i, w);
    load_f<V>(grad + i, g);
    load_f<V>(m + i, mm);
    load_f<V>(v + i, vv);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float gk = g[k] * grad_scale;
      mm[k] = beta1 * mm[k] + (1.0f - beta1) * gk;
      vv[k] = beta2 * vv[k] + (1.0f - beta2) * gk * gk;
      w[k] = w[k] * decay - step_size * mm[k] / (sqrtf(vv[k]) / bc2_sqrt + eps);
    }
    store_f<V>(param + i, w);
    store_f<V>(m + i, mm);
    store_f<V>(v + i, vv);
    if (copy) store_f<V>(copy + i, w);
  }
};
}  // namespace

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const Tensor& param_copy,
                const AdamWArgs& args, Stream s) {
  DeviceGuard guard(param);
  const double bc1 = 1.0 - std::pow(static_cast<double>(args.beta1), static_cast<double>(args.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(args.beta2), static_cast<double>(args.step));
  const float step_size = static_cast<float>(args.lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float decay = 1.0f - args.lr * args.weight_decay;
  const DType copy_dt = param_copy.defined() ? param_copy.dtype() : DType::F32;
  MPT_DISPATCH_DEV_FLOAT(grad.dtype(), "adamw_step", [&](auto gtag) {
    using G = decltype(gtag);
    MPT_DISPATCH_DEV_FLOAT(copy_dt, "adamw_step", [&](auto ptag) {
      using P = decltype(ptag);
      const AdamWOp<G, P> op{static_cast<float*>(param.data_ptr()),
                             static_cast<const G*>(grad.data_ptr()),
                             static_cast<float*>(m.data_ptr()),
                             static_cast<float*>(v.data_ptr()),
                             param_copy.defined() ? static_cast<P*>(param_copy.data_ptr()) : nullptr,
                             step_size,
                             bc2_sqrt,
                             args.beta1,
                             args.beta2,
                             args.eps,
                             decay,
                             args.grad_scale};
      const bool vec = vec_aligned(op.param, 4) && vec_aligned(op.grad, sizeof(G)) && vec_aligned(op.m, 4) &&
                       vec_aligned(op.v, 4) && vec_aligned(op.copy, sizeof(P));
      launch_map(param.numel(), op, vec, s, "adamw_step");
    });
  });
}

}  // namespace mpitron::cuda
