// tensor/dropout.h — dropout with a counter-based (Philox) mask.
//
//   keep[i] = philox_uniform(seed, offset, i) >= p;  out[i] = keep[i] ? x[i] / (1 − p) : 0
// The mask is never stored: backward regenerates it from (seed, offset), and
// the CPU and CUDA backends give the same mask. i is the flat element index of
// the contiguous tensor. out may alias x; dx may alias dout. 0 <= p < 1.
#pragma once
#include <cstdint>

#include "tensor/tensor.h"

namespace mpitron {

void dropout_forward(const Tensor& x, const Tensor& out, float p, uint64_t seed, uint64_t offset,
                     Stream s = Stream());
void dropout_backward(const Tensor& dout, const Tensor& dx, float p, uint64_t seed, uint64_t offset,
                      Stream s = Stream());

}  // namespace mpitron
