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

// One attention problem on raw device pointers, the form both the cuDNN graphs and
// the fallback take (attention.h's packed call and attention_block.h's block call
// both become one). An operand (B, T, H, HD) has element (b, t, head, e) at
// p + b·sb + t·st + head·HD + e (elements): the heads of a row packed, free row and
// batch strides.
struct AttnRows {
  void* p = nullptr;
  int64_t sb = 0, st = 0;
};
struct AttnProblem {
  int device = 0;  // the CUDA device of every pointer
  int64_t B = 0, Tq = 0, Tk = 0, NH = 0, G = 0;
  int64_t HD = 0;  // q's and k's head width (Dqk)
  int64_t Dv = 0;  // v's and out's head width: HD, except for MLA's value heads (a block only)
  DType dt = DType::F32;
  AttnRows q, k, v, out;      // (B, Tq, NH, HD), (B, Tk, G, HD), (B, Tk, G, Dv), (B, Tq, NH, Dv)
  AttnRows dout, dq, dk, dv;  // backward only: dout like out, dq like q, dk like k, dv like v
  float* lse = nullptr;       // (B, NH, Tq) f32: element (b, h, i) at lse + b·lse_sb + h·lse_sh + i
  int64_t lse_sb = 0, lse_sh = 0;
  int64_t q_start = 0, k_start = 0;  // global positions of query and key row 0
  int64_t seq = 0;                   // the whole sequence length the dropout mask keys on
  bool causal = true;                // key p visible from query q iff p <= q
  const int32_t* kv_len = nullptr;   // (B) i32 on the device: keys j >= len_b masked; null: none
  int64_t window = 0;                // > 0 (causal): key p visible from query q iff q − window <= p
  const float* bias = nullptr;       // (Tq, Tk, NH) f32: added to S[b,h,i,j] (attention_block.h); null: none
  float* bias_grad = nullptr;        // (Tq, Tk, NH) f32: backward adds Σ_b dS into it; null: none
  float softcap = 0.0f;              // > 0: scores (bias included) → softcap·tanh(S/softcap); the fallback's alone
};
// The packed whole call of attention.h: qkv (B, T, NH + 2G, HD) or 5-D, out, lse, mask;
// dout/dqkv may be undefined (forward).
AttnProblem attention_problem(const Tensor& qkv, const Tensor& out, const Tensor& lse, const AttentionMask& mask,
                              const Tensor& dout = Tensor(), const Tensor& dqkv = Tensor());

// The cuBLAS + softmax attention (attention_fallback.cu): out and lse (forward), dq,
// dk, dv (backward, overwritten) of the problem, as attention.h / attention_block.h.
void attention_fallback_forward(const AttnProblem& p, float scale, const AttentionDropout& drop, Stream s);
void attention_fallback_backward(const AttnProblem& p, float scale, const AttentionDropout& drop, Stream s);

}  // namespace mpitron::cuda
