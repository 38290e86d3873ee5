// tensor/rmsnorm.h — RMS normalisation over the last dimension (Llama; Megatron's
// `--normalization RMSNorm` with `--norm-epsilon`).
//
//   out[n, :] = x[n, :] · rstd[n] · weight,   rstd[n] = 1/√(mean_c(x[n, c]²) + eps)
//   x, out: (N, C) (any leading dims flattened); weight: (C), x's dtype.
//   rstd: (N) f32, written by forward and read by backward.
// No mean is subtracted and there is no bias (Megatron's and HF's LlamaRMSNorm).
// Math in f32 whatever the storage dtype; out is rounded once.
#pragma once
#include "tensor/tensor.h"

namespace mpitron {

void rmsnorm_forward(const Tensor& x, const Tensor& weight, const Tensor& out, const Tensor& rstd,
                     float eps = 1e-5f, Stream s = Stream());

// With x̂ = x·rstd and g = dout·weight:
// dx (N, C): = (or += when accumulate_dx, to fold in the residual gradient)
//            rstd·(g − x̂·mean_c(g·x̂)).
// dweight (C): += Σ_n dout·x̂ (a parameter gradient; f32 or x's dtype). Either may be undefined (skipped).
void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dweight, bool accumulate_dx = false, Stream s = Stream());

}  // namespace mpitron
