// tensor/attention_block.h — the block form of attention (attention.h), the kernel
// context parallelism is built from: the queries of one block of rows against the
// keys and values of another, each block knowing where it sits in the whole
// sequence, returning its output AND its log-sum-exp so partial results over
// different key blocks merge exactly (attention_merge); and the backward of one
// block given the merged output and log-sum-exp (flash attention's recurrence).
//
//   q      (B, Tq, NH, Dqk) queries at global positions q_start … q_start + Tq − 1
//   k      (B, Tk, G, Dqk)  keys at k_start … k_start + Tk − 1; query head h reads kv
//                           group h / (NH/G) (GQA; G = NH is MHA)
//   v      (B, Tk, G, Dv)   values of the same keys; Dv may differ from Dqk (DeepSeek's
//                           MLA: q and k heads are nope + rope = 192 wide, v heads 128)
//   out    (B, Tq, NH, Dv)  = softmax(q·kᵀ·scale, mask) · v over THIS block's keys
//   lse    (B, NH, Tq) f32  = log Σ_j exp(score_ij) over this block's visible keys
//   mask   causal: the key at global position p is visible from the query at q iff
//          p <= q; otherwise every key is visible. With blk.kv_lengths, key j (local
//          index) of sample b is also masked for every query when j >= kv_lengths[b]
//          (a key padding mask, T5's encoder padding). A row that sees no key of the
//          block gets out 0 and lse −∞ (attention_merge then ignores it).
//   bias   blk.bias (Tq, Tk, NH) f32, optional: an additive score bias shared by every
//          sample (T5's relative position bias), h this call's local head index:
//            S[b,h,i,j] = scale·q_i·k_j + bias[i, j, h]   on visible keys
//          lse and the softmax include it; masked keys stay masked whatever the bias.
//   softcap blk.softcap = c > 0 (Gemma 2's attn_logit_softcapping): the score, bias included
//          (the bias is added BEFORE the cap), becomes c·tanh(S/c) before the mask and the softmax:
//            S[b,h,i,j] = c·tanh((scale·q_i·k_j + bias[i, j, h]) / c)
//          0: off (S as above).
//
// Views: q, k, v, out, dout, dq, dk, dv may be strided views of bigger tensors
// (e.g. the Q, K, V heads of a packed qkv, or one chunk of the rows) as long as
// each row's heads are packed: stride(3) == 1 and stride(2) == the tensor's own head
// width (Dqk or Dv); the row and batch strides are free. lse: stride(2) == 1. So no
// permute or gather copies are needed. Shapes are checked (an error naming the op and
// the tensor): k's head width must be q's, out's and dout's v's.
// dtypes: q, k, v, out, dout, dq, dk, dv share f32, bf16 or f16; math in f32.
//
// Attention dropout (AttentionDropout, attention.h): element (b, head, i, j) keeps
// attention_keep(seed, offset, b, first_head + h, q_start + i, k_start + j, seq, p),
// the mask of one attention call over the whole sequence of `seq` tokens, so a
// computation split into blocks (over ranks, in any order) drops exactly what the
// single call drops.
//
// Backward of one block whose rows are part of a longer softmax: with O and L the
// MERGED output and log-sum-exp of those rows (over every key block),
//   P   = exp(scale·q·kᵀ − L) on this block's visible keys (0 elsewhere), D_i = dO_i·O_i
//   dS  = P ∘ (dO·vᵀ ∘ M/(1 − p) − D)           (M: the dropout keep mask)
//   dq  = scale·dS·k,  dk = scale·dSᵀ·q,  dv = (P ∘ M/(1 − p))ᵀ·dO
// dq (q's shape, Dqk), dk (k's shape, Dqk), dv (v's shape, Dv) are this block's share,
// overwritten (dout has out's shape, Dv); dk and dv of a kv group sum over
// the group's NH/G query heads. The shares of all blocks add up to the gradient of
// the whole attention. With blk.bias, P is exp(scale·q·kᵀ + bias − L); with
// blk.bias_grad defined, backward ADDS Σ_b dS[b,h,i,j] (the unscaled dS above: the
// gradient of the loss w.r.t. bias[i, j, h]) into bias_grad[i, j, h]. Masked keys
// (causal, padding) get P = 0, dK = dV = 0 and add 0 to bias_grad. With blk.softcap = c > 0, P is
// exp(c·tanh(U/c) − L) (U = scale·q·kᵀ + bias, the score before the cap) and the dS that dq, dk and
// bias_grad take is P ∘ (dO·vᵀ ∘ M/(1 − p) − D) ∘ (1 − tanh²(U/c)): the gradient w.r.t. U.
//
// CPU: one implementation with attention_forward/backward (tensor/cpu/attention.cpp).
// CUDA: cuDNN fused attention where its mask forms cover the block (16-bit, no
// dropout, aligned: the diagonal block (top-left causal, Tq = Tk, q_start = k_start),
// a block every query sees whole (no mask), or bottom-right causal (q_start + Tq =
// k_start + Tk)) and cuDNN accepts the head widths (Dqk != Dv is cuDNN's d_qk != d_v:
// e.g. 192/128 on Hopper; the graph's support check decides, once per shape); otherwise
// — and always with bias, kv_lengths or softcap — the cuBLAS + softmax fallback, as
// attention.h, which takes any Dqk and Dv.
#pragma once
#include <cstdint>

#include "tensor/attention.h"
#include "tensor/tensor.h"

namespace mpitron {

// Where a block's rows sit in the whole sequence, and its optional padding mask and
// score bias (AttentionBlock{q_start, k_start, seq, causal}, then set those fields).
struct AttentionBlock {
  AttentionBlock() = default;
  AttentionBlock(int64_t q_start_, int64_t k_start_, int64_t seq_, bool causal_ = true)
      : q_start(q_start_), k_start(k_start_), seq(seq_), causal(causal_) {}

  int64_t q_start = 0;  // global position of query row 0
  int64_t k_start = 0;  // global position of key row 0
  int64_t seq = 0;      // the whole sequence's length T (the dropout mask's keying); 0: Tq
  bool causal = true;   // key p visible from query q iff p <= q
  // Optional (undefined: none; every field above is unchanged by them):
  Tensor kv_lengths;  // (B) i32 on the op's device: key j of this block (local index) is masked for
                      // every query of sample b when j >= kv_lengths[b] (T5's encoder padding in
                      // cross-attention and encoder self-attention); combines with causal. Values
                      // in [0, Tk] (checked when on the host; the CUDA fallback clamps).
  Tensor bias;        // (Tq, Tk, NH) f32 contiguous, on the op's device: added to the scaled scores,
                      // S[b,h,i,j] = scale·q_i·k_j + bias[i, j, h] (h: this call's local head index),
                      // shared by every sample b (T5's relative position bias). lse includes it.
  Tensor bias_grad;   // (Tq, Tk, NH) f32 contiguous, on the op's device: backward ADDS Σ_b dS[b,h,i,j]
                      // (d loss / d bias) into it when defined; forward ignores it.
  float softcap = 0.0f;  // c > 0: scores (bias included) become c·tanh(S/c) before the softmax
                         // (Gemma 2's attn_logit_softcapping); 0: off. Finite, >= 0.
};

// Which keys of the block query row i sees: j < visible_keys(i) (keys are a prefix),
// before the padding mask of kv_lengths.
inline int64_t attention_block_visible(const AttentionBlock& b, int64_t i, int64_t tk) {
  if (!b.causal) return tk;
  const int64_t hi = b.q_start + i - b.k_start + 1;
  return hi < 0 ? 0 : hi > tk ? tk : hi;
}

void attention_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                             const Tensor& lse, float scale, const AttentionBlock& blk,
                             const AttentionDropout& drop = {}, Stream s = Stream());
// out, lse: the merged (whole-row) values; dout (out's shape); dq (q's shape), dk (k's shape),
// dv (v's shape) overwritten.
void attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& lse, const Tensor& dq, const Tensor& dk,
                              const Tensor& dv, float scale, const AttentionBlock& blk,
                              const AttentionDropout& drop = {}, Stream s = Stream());

// Merges a block's partial result into a running one (the log-sum-exp rescaling of
// flash attention and ring attention):
//   acc     (B, T, NH, D) f32, acc_lse (B, NH, T) f32  — start at 0 and −∞ (D: out's head
//           width, Dv of attention_block_forward)
//   part    (B, T, NH, D) any float dtype, part_lse (B, NH, T) f32
//   L = log(e^acc_lse + e^part_lse);  acc ← acc·e^(acc_lse − L) + part·e^(part_lse − L);  acc_lse ← L
// A row with part_lse = −∞ is left unchanged; acc and acc_lse must be contiguous,
// part and part_lse may be views as above.
void attention_merge(const Tensor& acc, const Tensor& acc_lse, const Tensor& part, const Tensor& part_lse,
                     Stream s = Stream());

}  // namespace mpitron
