// tensor/gelu.h — GELU, tanh approximation (as GPT-2 and Megatron's bias_gelu):
//   gelu(x) = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
// x, out, dout, dx: same shape and dtype, contiguous. out may alias x; dx may alias dout.
#pragma once
#include "tensor/tensor.h"

namespace mpitron {

void gelu_forward(const Tensor& x, const Tensor& out, Stream s = Stream());
// dx = dout · gelu'(x)  (overwritten)
void gelu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, Stream s = Stream());

}  // namespace mpitron
