// tensor/fp8.h — fp8 quantisation (issue 45), the ops a per-tensor-scaled fp8 GEMM needs:
//
//   fp8_amax:                 amax (1) = max |x|            (f32; NaN ignored, as fmaxf; 0 for no elements)
//   fp8_quantize_dequantize:  out (n) = decode(encode(x·scale, saturating)) / scale   (tensor/fp8_format.h)
//
// x, out: same shape and floating dtype (f32, bf16, f16), contiguous; out may alias x. amax and
// scale: f32 tensors of one element on x's device (a scale lives on the device, so current
// scaling needs no host round trip); scale must be finite and > 0 (not checked on the device).
// The round trip is the emulation of an fp8 operand: an fp8 GEMM with f32 accumulation equals
// the f32 GEMM of the dequantised operands up to the order of the sums.
#pragma once
#include "tensor/fp8_format.h"
#include "tensor/tensor.h"

namespace mpitron {

void fp8_amax(const Tensor& x, const Tensor& amax, Stream s = Stream());
void fp8_quantize_dequantize(const Tensor& x, const Tensor& scale, Fp8Format f, const Tensor& out,
                             Stream s = Stream());

}  // namespace mpitron
