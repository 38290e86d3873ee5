// tensor/adamw.h — fused AdamW step (PyTorch's torch.optim.AdamW semantics).
//
//   g      = grad · grad_scale            (grad_scale folds in 1/loss_scale and clipping)
//   param  = param · (1 − lr · weight_decay)
//   m      = beta1 · m + (1 − beta1) · g
//   v      = beta2 · v + (1 − beta2) · g²
//   param -= lr · (m / (1 − beta1^step)) / (sqrt(v / (1 − beta2^step)) + eps)
// param, m, v: (N) f32 (master weights and moments); grad: (N) f32/bf16/f16;
// param_copy: (N) bf16/f16/f32 or undefined — receives the updated param in the
// compute dtype. step counts from 1.
#pragma once
#include <cstdint>

#include "tensor/tensor.h"

namespace mpitron {

struct AdamWArgs {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  float grad_scale = 1.0f;
  int64_t step = 1;
};

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const Tensor& param_copy, const AdamWArgs& args, Stream s = Stream());

}  // namespace mpitron
