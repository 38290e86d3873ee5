// tensor/relu.h — ReLU, the activation of T5's original DenseReluDense MLP (HF T5Config's
// dense_act_fn "relu", the t5-small … t5-11b checkpoints; torch.relu):
//   out = max(x, 0);   dx = dout · [x > 0]   (the subgradient 0 at x = 0, as torch)
// x, out, dout, dx: same shape and dtype (f32, bf16, f16), contiguous. out may alias x;
// dx may alias dout. NaN in x propagates to out (max(NaN, 0) is NaN, as torch.relu).
#pragma once
#include "tensor/tensor.h"

namespace mpitron {

void relu_forward(const Tensor& x, const Tensor& out, Stream s = Stream());
// dx = dout · [x > 0]  (overwritten)
void relu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, Stream s = Stream());

}  // namespace mpitron
