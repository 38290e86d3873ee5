// autograd/functions.h — differentiable ops: each computes its result and, when
// the tape records, a node whose backward accumulates into its inputs' grads.
// Shapes follow the tensor/ headers; activations are (N, C) with N = B·T.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "autograd/tape.h"
#include "tensor/attention.h"
#include "tensor/rope.h"

namespace mpitron::ag {

// y (N, out) = x (N, in) · wᵀ (w: (out, in)) + b (out) — b may be undefined.
Var linear(Tape& tape, const Var& x, const Var& w, const Var& b);
// The same y as two nodes, so that `between` runs in backward after the input gradient (which
// reads w) and before the weight gradient (which writes w's and b's, reading only w's shape):
// ZeRO-3 frees a gathered w there before it allocates w's gradient. The same gradients as linear.
Var linear_split(Tape& tape, const Var& x, const Var& w, const Var& b, std::function<void()> between);
// Records a node whose backward calls f: placed after some nodes, f runs before their
// backward; placed before them, after it (ZeRO-3's gathers and reductions around a use).
void on_backward(Tape& tape, std::function<void()> f);
// y (N, C) = layernorm(x) · weight + bias
Var layernorm(Tape& tape, const Var& x, const Var& weight, const Var& bias, float eps = 1e-5f);
// y (N, C) = x / √(mean_c(x²) + eps) · weight   (Llama's RMSNorm)
Var rmsnorm(Tape& tape, const Var& x, const Var& weight, float eps = 1e-5f);
Var gelu(Tape& tape, const Var& x, bool exact = false);  // exact: the erf form (tensor/gelu.h)
// y (N, F) = silu(a) · b over the halves x (N, 2F) = [a | b]   (Megatron's --swiglu)
Var swiglu(Tape& tape, const Var& x);
// y (N, H·D) = rotary embedding of x viewed as (batch, seq, H, D): heads [0, rotate_heads)
// rotate (tensor/rope.h), the rest pass through. x: (N, H·D) with N = batch·seq.
Var rope(Tape& tape, const Var& x, int64_t batch, int64_t seq, int64_t heads, int64_t rotate_heads,
         const RopeArgs& args);
Var add(Tape& tape, const Var& a, const Var& b);
// y (N, Ca + Cb) = [a | b]: a (N, Ca) and b (N, Cb) side by side (MTP's [enorm(e) | hnorm(h)]).
Var concat_cols(Tape& tape, const Var& a, const Var& b);
// y = cap · tanh(x / cap)   (logit soft-capping, tensor/softcap.h; Gemma 2's final_logit_softcapping)
Var softcap(Tape& tape, const Var& x, float cap);
// y = alpha · x (math in f32, rounded once to x's dtype)
Var scale(Tape& tape, const Var& x, float alpha);
// y (N, C) = table[ids − vocab_start]  (ids (N) i32/i64: a constant, not a Var); ids outside
// the table's rows give zero rows (vocab-parallel: the table is one TP rank's slice).
Var embedding(Tape& tape, const Tensor& ids, const Var& table, int64_t vocab_start = 0);
// out (B, T, NH·HD) = causal attention over qkv viewed as (B, T, 3, NH, HD), or with
// kv_groups G > 0 as (B, T, NH + 2G, HD) (grouped-query attention; 0 means G = NH).
Var causal_attention(Tape& tape, const Var& qkv, int64_t batch, int64_t seq, int64_t heads, int64_t kv_groups = 0);
// The same under any AttentionMask (tensor/attention.h), e.g. BERT's bidirectional
// attention with a key padding mask: {false, kv_lengths (B) i32 on qkv's device}.
// The mask's tensor is held by the tape node until backward.
Var attention(Tape& tape, const Var& qkv, int64_t batch, int64_t seq, int64_t heads, int64_t kv_groups,
              const AttentionMask& mask);
// Philox dropout; (seed, offset) names the mask.
Var dropout(Tape& tape, const Var& x, float p, uint64_t seed, uint64_t offset);
// Dropout of x (N, C) segment by segment: rows [row, row + rows) take the mask
// (seed, offset) of their segment (context parallelism: each run of rows at its
// single-process offset); the segments cover every row once.
struct DropoutRows {
  int64_t row, rows;
  uint64_t offset;
};
Var dropout(Tape& tape, const Var& x, float p, uint64_t seed, const std::vector<DropoutRows>& segments);
// Mean over valid positions (targets >= 0) of softmax cross-entropy: a (1) f32 Var.
// When the tape records, the logits' buffer is overwritten IN PLACE by the
// gradient of the mean loss (fused classifier): do not read the logits after.
Var cross_entropy(Tape& tape, const Var& logits, const Tensor& targets);
// The fused classifier's tape node for any loss computed that way: `dlogits`
// (usually the logits' own buffer) already holds d(loss)/d(logits); backward
// scales it by loss's incoming gradient into logits' grad. Records nothing
// when the tape is off or logits need no grad.
void record_fused_loss(Tape& tape, const Var& logits, const Var& loss, const Tensor& dlogits);

}  // namespace mpitron::ag
