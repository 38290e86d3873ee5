// tensor/layernorm.h — layer normalisation over the last dimension.
//
//   out[n, :] = (x[n, :] - mean[n]) · rstd[n] · weight + bias
//   x, out: (N, C) (any leading dims flattened); weight, bias: (C), same dtype as x.
//   mean, rstd: (N) f32, written by forward and read by backward (rstd = 1/sqrt(var + eps),
//   var the biased variance).
#pragma once
#include "tensor/tensor.h"

namespace mpitron {

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out,
                       const Tensor& mean, const Tensor& rstd, float eps = 1e-5f, Stream s = Stream());

// dx (N, C): = (or += when accumulate_dx, used to fold in the residual gradient).
// dweight, dbias (C): += (parameter gradients; f32 or x's dtype). Undefined ones are skipped.
void layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                        bool accumulate_dx = false, Stream s = Stream());

}  // namespace mpitron
