// tensor/gemm.h — matrix products (forward and backward).
//
//   out = alpha · op(a) · op(b) + beta · out  [+ bias broadcast over rows]
//   op(a) is (M, K): a is (M, K), or (K, M) when trans_a.
//   op(b) is (K, N): b is (K, N), or (N, K) when trans_b.
//   A linear layer y = x · Wᵀ + b (W stored (out, in) as in Megatron) is
//   gemm(x, W, y, false, true, &bias).
// Batched: a, b, out may carry one leading batch dim (B, ·, ·); a 2-D operand
// is shared by every batch entry. Strided-batched under the hood.
// dtypes: a and b share one of f32/bf16/f16; out is that dtype or f32; bias has
// out's dtype. Accumulation is always f32 (BLAS on CPU, cuBLASLt on CUDA).
// All tensors contiguous and on one device.
#pragma once
#include "tensor/tensor.h"

namespace mpitron {

struct GemmArgs {
  bool trans_a = false;
  bool trans_b = false;
  float alpha = 1.0f;
  float beta = 0.0f;  // 0: out is overwritten (its old contents are never read)
};

void gemm(const Tensor& a, const Tensor& b, const Tensor& out, const GemmArgs& args = {},
          const Tensor& bias = Tensor(), Stream s = Stream());

// Gradients of out = op(a)·op(b) + bias, given dout (shaped like out).
//   da (shaped like a) = dout·op(b)ᵀ  (or its transpose when trans_a)
//   db (shaped like b) = op(a)ᵀ·dout  (or its transpose when trans_b); with a
//      batched a/dout and a 2-D b, db is summed over the batch.
//   dbias (N)        = sum of dout over all rows (and batches).
// An undefined tensor is skipped. accumulate_a: da += instead of =;
// accumulate_b: db += and dbias += (the parameter-gradient convention).
void gemm_backward(const Tensor& dout, const Tensor& a, const Tensor& b, const Tensor& da,
                   const Tensor& db, const Tensor& dbias, const GemmArgs& args = {},
                   bool accumulate_a = false, bool accumulate_b = true, Stream s = Stream());

}  // namespace mpitron
