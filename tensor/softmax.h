// tensor/softmax.h — softmax over the last dimension.
//   x, out: (N, C) (leading dims flattened), same dtype; computed in f32.
#pragma once
#include "tensor/tensor.h"

namespace mpitron {

void softmax_forward(const Tensor& x, const Tensor& out, Stream s = Stream());
// dx = out ⊙ (dout − Σ_c dout·out)  (overwritten); uses the forward output, not x.
void softmax_backward(const Tensor& dout, const Tensor& out, const Tensor& dx, Stream s = Stream());

}  // namespace mpitron
