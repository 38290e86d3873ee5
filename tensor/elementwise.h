// tensor/elementwise.h — residual add, casts, scaling and accumulation.
// All tensors contiguous, same shape and device; math in f32.
#pragma once
#include "tensor/tensor.h"

namespace mpitron {

// out = a + b (same dtype; out may alias a or b) — the residual connection.
void add_forward(const Tensor& a, const Tensor& b, const Tensor& out, Stream s = Stream());
// Residual backward: the gradient flows unchanged to both inputs.
// da, db = dout (or += when accumulate); undefined ones are skipped.
void add_backward(const Tensor& dout, const Tensor& da, const Tensor& db, bool accumulate = false,
                  Stream s = Stream());

// dst = src converted to dst's dtype (f32, bf16, f16; round to nearest even).
void cast(const Tensor& src, const Tensor& dst, Stream s = Stream());
// y = alpha · x + beta · y   (x and y may differ in float dtype; beta = 0 never reads y).
void axpby(float alpha, const Tensor& x, float beta, const Tensor& y, Stream s = Stream());
// x *= alpha
void scale(const Tensor& x, float alpha, Stream s = Stream());

}  // namespace mpitron
