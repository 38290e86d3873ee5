// model/layers/cross_attention_layer.h — the cross-attention sublayer of a T5 decoder block
// (model/t5.h): the decoder's rows query the encoder's output.
//
//   in    (Nl, C)     the norm output (this rank's decoder rows; N/t with sequence parallelism), N = B·Td
//   mem   (Ml, C)     the encoder's output (BlockShape::cross.memory: this rank's rows), M = B·Te
//   q     (N, Cl)     = gather(in) · Wqᵀ (+ bq)          Cl = NHl·HD: this rank's query heads
//   kv    (M, 2·Gl·HD) = gather(mem) · Wkvᵀ (+ bkv)     Gl key heads, then Gl value heads
//   att   (N, Cl)     = attention(q, k, v)               bidirectional; key j of sample b masked when
//                                                        j >= cross.lengths[b] (the encoder's padding)
//   lse   (B, NHl, Td) f32
//   out   (Nl, C)     = reduce(att · Wprojᵀ + bproj)    all-reduce, or reduce-scatter rows (SP);
//                                                        bproj added by TP rank 0 only
// Dropout and the residual belong to the block skeleton (model/block.h). Attention dropout draws
// (seed, cross.attention_offset) with keys numbered i·max(Td, Te) + j (tensor/attention_block.h).
// Backward: returns d(in) (Nl, C) and ADDS d(mem) (Ml, C) into cross.memory_grad: every decoder
// layer reads the same encoder output, so its gradient is the sum over them (model/t5.cpp moves it
// into the encoder's tape). The weight part (dWq, dWkv, dWproj and biases, +=) runs now or is deferred.
#pragma once
#include <cstdint>

#include "autograd/tape.h"
#include "model/layers/block_shape.h"

namespace mpitron {

struct CrossAttentionParams {
  Var q_w, q_b;        // (NH·HD, C) split by rows (heads); bias may be undefined
  Var kv_w, kv_b;      // (2·G·HD, C) parts K | V, each split by rows
  Var proj_w, proj_b;  // (C, NH·HD) split by columns; bias may be undefined
};

struct CrossAttentionActs {
  Tensor in, q, kv, att, lse;  // in (Nl, C), q (N, Cl), kv (M, 2·Gl·HD), att (N, Cl), lse (B, NHl, Td)
};

Tensor cross_attention_forward(const BlockShape& s, const CrossAttentionParams& p, const Tensor& in,
                               CrossAttentionActs& a, uint64_t seed);
Tensor cross_attention_backward(const BlockShape& s, const CrossAttentionParams& p, const CrossAttentionActs& a,
                                const Tensor& dout, uint64_t seed, WeightGradWork* defer);

}  // namespace mpitron
