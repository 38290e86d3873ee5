// model/block.h — one pre-LN transformer block: forward and its hand-written backward.
//
//   x (N, C), N = B·T tokens of the micro-batch
//   h1  = LN1(x)                          ln1 (N, C), mean1/rstd1 (N)
//   qkv = h1 · Wqkvᵀ + bqkv               qkv (N, 3C)  = (B, T, 3, NH, HD)
//   att = causal_attention(qkv)           att (N, C), lse (B, NH, T); with attention dropout
//                                         softmax(S) ∘ M/(1 − p) · V (M regenerated in backward)
//   x2  = x + dropout(att · Wprojᵀ + bproj)
//   h2  = LN2(x2)                         ln2 (N, C), mean2/rstd2 (N)
//   fc  = h2 · Wfcᵀ + bfc                 fc (N, F)   (pre-GELU, saved)
//   g   = gelu(fc)                        g (N, F)
//   y   = x2 + dropout(g · Wmpᵀ + bmp)
// Invariant of the backward: parameter gradients use +=, activation
// gradients use = (dx is accumulated into x's grad by the tape node).
// Dropout masks are named by (seed, offset): the same in recompute.
//
// Tensor parallelism (BlockShape::tp, t ranks): qkv and mlp.fc are
// column-parallel (this rank's NH/t heads and F/t features), attn.proj and
// mlp.proj row-parallel; their partial (N, C) outputs are all-reduced (or
// reduce-scattered to this rank's N/t rows with sequence parallelism, where
// x, y, the layernorms, dropouts and residuals hold N/t rows and the
// layernorm outputs are all-gathered before the column-parallel matmuls; only
// this rank's rows of them are saved, and backward gathers them again).
// Row-parallel biases are added once (by tp rank 0, before the reduction);
// their gradients come from the full output gradient on every rank. Dropout
// offsets are those of the global (N, C) element, so masks equal one rank's.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "autograd/tape.h"
#include "model/config.h"
#include "model/params.h"
#include "model/tensor_parallel.h"

namespace mpitron {

struct BlockParams {
  Var ln1_w, ln1_b;     // (C), (C)
  Var qkv_w, qkv_b;     // (3C, C), (3C)
  Var proj_w, proj_b;   // (C, C), (C)
  Var ln2_w, ln2_b;     // (C), (C)
  Var fc_w, fc_b;       // (F, C), (F)
  Var mproj_w, mproj_b; // (C, F), (C)
  static BlockParams from(const ParamSet& ps, const std::string& prefix);  // prefix "layers.3."
};

// Saved activations of one block's forward.
struct BlockActs {
  Tensor ln1, mean1, rstd1, qkv, att, lse, x2, ln2, mean2, rstd2, fc, g;
  void release() { *this = BlockActs(); }
};

struct BlockShape {
  int64_t batch, seq, hidden, heads, ffn;  // global sizes (heads, ffn before the TP split)
  float dropout;
  float eps;
  TensorParallel tp{};
  float attention_dropout = 0.0f;  // on the attention probabilities
  uint64_t attention_offset = 0;   // its Philox stream (attention.h): layer l uses l·⌈T²/4⌉
  int64_t tokens() const { return batch * seq; }                   // N
  int64_t local_rows() const { return tp.local_rows(tokens()); }   // rows of x and y
};

// y = block(x); fills acts. seed/offset name the two dropout masks (offset, offset + N·C);
// the attention-probability mask is (seed, s.attention_offset) in attention.h's
// streams (their own high counter word: never a hidden-dropout mask).
void block_forward(const BlockShape& s, const BlockParams& p, const Tensor& x, const Tensor& y, BlockActs& a,
                   uint64_t seed, uint64_t offset);
// dx (N, C) = d(block)/dx · dy (overwritten); parameter grads +=.
void block_backward(const BlockShape& s, const BlockParams& p, const Tensor& x, const Tensor& dy,
                    const Tensor& dx, const BlockActs& a, uint64_t seed, uint64_t offset);

// The block as one tape node; with recompute it keeps only x and replays the forward.
// grads_ready (may be empty) is called after the node's backward: the block's
// parameter gradients are final for this micro-batch.
Var block(Tape& tape, const BlockShape& s, const BlockParams& p, const Var& x, uint64_t seed, uint64_t offset,
          bool recompute, std::function<void()> grads_ready = {});

}  // namespace mpitron
