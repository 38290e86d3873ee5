// model/layers/attention_layer.h — the self-attention sublayer of a block.
//
//   in   (Nl, C)   the norm output (this rank's rows; N/t with sequence parallelism)
//   in_f (N, C)    = in, or all-gathered rows under sequence parallelism
//   qkv  (N, QL)   = in_f · Wqkvᵀ + bqkv     QL = (NHl + 2·Gl)·HD: this rank's NHl query
//                                            heads, then Gl key and Gl value heads
//   qkv  ← rope(qkv) on the NHl + Gl query and key heads (rope only; in place)
//   att  (N, Cl)   = attention(qkv)          causal, grouped (head h uses group h/(NH/G)); with
//                                            context parallelism (s.cp) over the whole sequence's
//                                            keys across the cp group (parallel/context_parallel.h),
//                                            rope at the rows' global positions
//                                            T5 (s.attn_bias defined): the block form over the whole
//                                            sequence with the stack's relative bias (T, T, NHl) added to
//                                            the scores, its gradient added into s.attn_bias_grad
//   lse  (B, NHl, T) f32
//   out  (Nl, C)   = reduce(att · Wprojᵀ + bproj)   all-reduce, or reduce-scatter rows (SP);
//                                                   bproj added by TP rank 0 only
// Dropout and the residual belong to the block skeleton (model/block.h).
// Backward in two parts: the input part returns d(in) and either runs the weight
// part (dWqkv, dbqkv, dWproj, dbproj +=) at once or defers it to a WeightGradWork.
#pragma once
#include <cstdint>
#include <vector>

#include "autograd/tape.h"
#include "model/layers/block_shape.h"

namespace mpitron {

struct AttentionParams {
  Var qkv_w, qkv_b;    // (QL·t, C) global ((NH + 2G)·HD, C); bias may be undefined
  Var proj_w, proj_b;  // (C, C) split by columns; bias may be undefined
};

struct AttentionActs {
  Tensor in, qkv, att, lse;  // in (Nl, C), qkv (N, QL) after rope, att (N, Cl), lse (B, NHl, T)
};

// How the attention proper runs. Training and prefill: nullptr (causal attention
// over (B, T)). A KV-cache decode step supplies its own (model/inference/generate.cpp):
// it receives the rotated qkv (N, QL) and writes att (N, Cl).
class AttentionCore {
 public:
  virtual ~AttentionCore() = default;
  virtual void attend(const BlockShape& s, const Tensor& qkv, const Tensor& att) const = 0;
  // The position of each of the N rows, for rope (nullptr: row b·T + t is at t).
  virtual const std::vector<int64_t>* positions() const { return nullptr; }
};

// seed: the attention-dropout key (s.attention_offset names the layer's stream).
Tensor attention_layer_forward(const BlockShape& s, const AttentionParams& p, const Tensor& in, AttentionActs& a,
                               uint64_t seed, const AttentionCore* core = nullptr);
// dout (Nl, C) → d(in) (Nl, C). defer null: the weight part runs now.
Tensor attention_layer_backward(const BlockShape& s, const AttentionParams& p, const AttentionActs& a,
                                const Tensor& dout, uint64_t seed, WeightGradWork* defer);

}  // namespace mpitron
