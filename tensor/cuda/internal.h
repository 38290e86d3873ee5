// tensor/cuda/internal.h — entry points the CUDA op families share with each other
// (not part of the backend contract). Plain C++: usable from .cu and .cpp files.
#pragma once
#include <cstdint>

#include "tensor/attention.h"
#include "tensor/tensor.h"

namespace mpitron::cuda {

// A row-major matrix operand: `rows`×`cols` per batch entry, row stride ld,
// batch stride bstride (0: the same matrix for every batch entry). Elements.
struct MatOperand {
  const void* ptr;
  int64_t rows, cols, ld, bstride;
  MatOperand at(int64_t batch, DType dt) const {
    return {static_cast<const char*>(ptr) + batch * bstride * static_cast<int64_t>(dtype_size(dt)), rows, cols, ld,
            0};
  }
};

// cuBLASLt strided-batched GEMM on raw pointers (gemm.cu):
//   out (batch, M, N) [row stride out_ld, batch stride out_bstride] =
//     alpha · op(a) · op(b) + beta · out [+ bias (N), out's dtype]
// a and b have dtype in_dt, out has out_dt (in_dt or f32). Current device = `device`.
void strided_matmul(int device, Stream s, DType in_dt, DType out_dt, MatOperand a, bool ta, MatOperand b, bool tb,
                    void* out, int64_t out_ld, int64_t out_bstride, int64_t batch, float alpha, float beta,
                    const void* bias = nullptr);

// True when every pointer cuDNN attention would touch is 16-byte aligned
// (attention.cpp): qkv (and dqkv) with K and V at +C and +2C, out, lse and dout.
// Forward: dout and dqkv undefined. Host-only: looks at addresses, not data.
bool attention_cudnn_aligned(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                             const Tensor& dqkv);

// The cuBLAS + softmax attention (attention_fallback.cu); same contract as
// attention_forward / attention_backward in attention.h.
void attention_forward_fallback(const Tensor& qkv, const Tensor& out, const Tensor& lse, float scale,
                                const AttentionDropout& drop, const AttentionMask& mask, Stream s);
void attention_backward_fallback(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                 const Tensor& dqkv, float scale, const AttentionDropout& drop,
                                 const AttentionMask& mask, Stream s);

}  // namespace mpitron::cuda
