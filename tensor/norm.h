// tensor/norm.h — squared L2 norms for gradient clipping.
#pragma once
#include <vector>

#include "tensor/tensor.h"

namespace mpitron {

// out (1) f32 += Σ x²  over every element of x (any float dtype). Also flags
// non-finite values: the sum becomes Inf/NaN, which callers test.
void sum_squares(const Tensor& x, const Tensor& out, Stream s = Stream());

// sqrt(Σ over tensors of Σ x²), computed on the tensors' device, read back to host.
double global_l2_norm(const std::vector<Tensor>& ts, Stream s = Stream());

}  // namespace mpitron
