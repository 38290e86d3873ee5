// tensor/attention.h — scaled-dot-product self-attention over a fused QKV, causal
// (GPT) or bidirectional with a key padding mask (BERT), multi-head (MHA) or
// grouped-query (GQA: fewer key/value heads than query heads).
//
//   qkv: the fused QKV projection output, per token Q, then K, then V, heads contiguous:
//        (B, T, 3, NH, HD)   MHA: NH heads each (B, T, 3·C), C = NH·HD; or
//        (B, T, NH + 2G, HD) GQA (Megatron's --group-query-attention --num-query-groups G,
//                            HF's num_key_value_heads): NH query heads, then G key heads,
//                            then G value heads. Query head h uses kv group h / (NH/G)
//                            (HF's repeat_kv); NH must be divisible by G. G = NH is MHA
//                            (the same bytes as the 5-D form), G = 1 multi-query attention.
//        NH is out's head count, so G = (qkv.dim(2) − NH)/2 follows from the shapes.
//   out: (B, T, NH, HD)  = softmax(Q_h·K_gᵀ·scale, mask) · V_g  per (batch, head h)
//   lse: (B, NH, T) f32  = log Σ_j exp(score_ij) of each (scaled, masked) row;
//        saved by forward for backward (the flash-attention statistics).
//   mask (AttentionMask below): query i of sample b sees key j iff
//        j < len_b (the key padding mask; len_b = kv_lengths[b], T without it) and,
//        when causal, j <= i, and, with a sliding window W > 0, i − W <= j. Masked scores are −∞ before the softmax (dropout acts
//        after it, on the kept probabilities).
//   softcap (mask.softcap = c > 0, Gemma 2's attn_logit_softcapping): the scaled scores are
//        capped before the mask and the softmax, score_ij = c·tanh(scale·q_i·k_j / c) (lse
//        includes it); backward multiplies dS by 1 − tanh²(scale·q_i·k_j / c). 0: off. A row with no visible key (only
//        possible with len_b = 0, which the op rejects) would be out 0, lse −∞,
//        gradient 0: the CUDA fallback clamps len_b to [0, T] and does exactly that.
// dtypes: qkv/out/dout/dqkv share f32, bf16 or f16; math in f32.
//
// Attention dropout (Megatron's --attention-dropout; drop.p = 0: none, exactly the
// op without it). P = softmax(S) and lse are unchanged; with M the Bernoulli(1 − p)
// keep mask of attention_keep (below):
//   forward   O  = (P ∘ M / (1 − p)) · V
//   backward  dV = (P ∘ M / (1 − p))ᵀ · dO;  dP = (dO · Vᵀ) ∘ M / (1 − p);
//             D_i = Σ_d dO_id·O_id;  dS = P ∘ (dP − D);  dQ, dK from dS as without dropout.
// The mask is never stored: backward regenerates it, so a recomputed forward and
// every backend use the same one.
// CUDA: cuDNN fused flash attention when available (bf16/f16), otherwise a
// cuBLAS + softmax path (always with dropout or softcap); CPU: a direct implementation (the reference).
#pragma once
#include <cstdint>

#include "core/philox.h"
#include "tensor/tensor.h"

namespace mpitron {

// Dropout on the attention probabilities. first_head: the global index of this
// call's head 0 (TP rank r of t holds heads r·NH/t …, so it passes r·NH/t): the
// mask is a pure function of (seed, offset, batch b, GLOBAL head, i, j) and a
// tensor-parallel run, or a recompute, draws the single-process masks.
struct AttentionDropout {
  float p = 0.0f;          // 0 <= p < 1
  uint64_t seed = 0;       // Philox key
  uint64_t offset = 0;     // Philox counter base of this call (a layer's own stream)
  int64_t first_head = 0;  // global index of out's head 0
};

// Keep element (b, global head h, query i, key j) of a T×T attention: Philox
// block offset + (i·T + j)/4 lane (i·T + j) % 4 under key seed, with the high
// counter word (1 << 63) | b << 24 | h — so its streams never meet the hidden
// dropout's (high word 0) for any offset. Needs h < 2^24, b < 2^39. Within one
// (b, h) the call uses blocks [offset, offset + ⌈T²/4⌉): callers give layers
// offsets at least that far apart.
MPT_HD bool attention_keep(uint64_t seed, uint64_t offset, int64_t b, int64_t h, int64_t i, int64_t j, int64_t T,
                           float p) {
  const uint64_t e = static_cast<uint64_t>(i * T + j);
  const uint64_t hi = (uint64_t{1} << 63) | (static_cast<uint64_t>(b) << 24) | static_cast<uint64_t>(h);
  const Philox4 r = philox4x32_10(offset + (e >> 2), hi, seed);
  return static_cast<float>(r.x[e & 3] >> 8) * (1.0f / 16777216.0f) >= p;
}

// Which keys each query sees. The default is causal attention over every key (GPT).
// BERT: causal = false and kv_lengths = each sample's unpadded length (Megatron's
// BERT padding mask with the padding at the end of each sample; HF's
// attention_mask [1…1 0…0]: keys j >= len_b are masked for every query, padded
// query rows included, which therefore still attend the sample's real tokens).
//   kv_lengths: (B) i32 on the op's device, 1 <= len_b <= T; undefined: all T keys.
//   The values are checked (an error naming the op) where that is free — a CPU
//   tensor; a device tensor is not read back (no stream sync): the CUDA fallback
//   clamps to [0, T], cuDNN takes them as its seq_len_kv.
// window W > 0: sliding-window attention (Mistral's sliding_window, Megatron's
//   --window-size W,0; causal only): query i sees keys i − W … i, W + 1 keys (flash
//   attention's window_size = (W, 0), HF Mistral's mask). 0: every earlier key.
// softcap c > 0: logit soft-capping (above), finite; 0: off. Not a mask, but like one it
//   changes which scores the softmax sees, and every call that masks takes it.
struct AttentionMask {
  bool causal = true;
  Tensor kv_lengths;
  int64_t window = 0;
  float softcap = 0.0f;
};

void attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& lse, float scale,
                       const AttentionDropout& drop = {}, const AttentionMask& mask = {}, Stream s = Stream());
// dqkv (qkv's shape): overwritten; dK and dV of a kv group sum over the group's NH/G query heads.
// mask: the forward's (lse holds its statistics). Masked keys get dK = dV = 0.
void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                        const Tensor& dqkv, float scale, const AttentionDropout& drop = {},
                        const AttentionMask& mask = {}, Stream s = Stream());

// Which implementation attention_* uses on CUDA right now ("cudnn" or "cublas").
std::string cuda_attention_backend();
// Force the cuBLAS + softmax path (tests compare the two).
void cuda_attention_force_fallback(bool on);

}  // namespace mpitron
