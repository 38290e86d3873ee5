// model/layers/attention_core.h — how a self-attention sublayer's rotated q, k, v become its
// output: the attention proper over one call's rows. One interface, one implementation per way
// of running it; the sublayer (attention_layer.h) calls whichever the call's BlockShape::core
// names and never asks which:
//   LocalAttention           the micro-batch's own (B, T) keys: causal, a sliding window, or
//                            bidirectional with a key padding mask (tensor/attention.h)
//   ContextParallelAttention this rank's T/cp queries over the whole sequence's keys across the
//                            context-parallel group (parallel/context_parallel.h)
//   BiasedAttention          T5's: a score bias (T, T, NHl) added through the block form
//                            (tensor/attention_block.h), its gradient added into a buffer
//   PagedAttentionCore       decoding over the paged KV cache (model/inference/paged_kv_cache.h)
//
//   qkv (N, QL)     N = B·T rows, QL = (NHl + 2·Gl)·HD: NHl query heads, Gl key heads, Gl value
//                   heads, after rope (and QK-norm)
//   att (N, NHl·HD) written
//   lse (B, NHl, T) f32, written by cores that train (the backward reads it)
// The layer's mask, window, scale and soft-cap come from its AttentionSpec.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/layers/attention_spec.h"
#include "model/layers/block_shape.h"

namespace mpitron {

class AttentionCore {
 public:
  virtual ~AttentionCore() = default;
  // seed: the attention-dropout key (s.attention_offset names the layer's stream).
  virtual void forward(const BlockShape& s, const AttentionSpec& a, const Tensor& qkv, const Tensor& att,
                       const Tensor& lse, uint64_t seed) const = 0;
  // datt (N, NHl·HD) → dqkv (N, QL) overwritten (dK and dV of a group sum over its query heads).
  // The default refuses: decoding cores have no backward.
  virtual void backward(const BlockShape& s, const AttentionSpec& a, const Tensor& datt, const Tensor& qkv,
                        const Tensor& att, const Tensor& lse, const Tensor& dqkv, uint64_t seed) const;
  // Latent attention (multi-latent attention decoding, model/layers/mla_layer.h): every query head
  // against ONE key row per token whose first Dv values are also its value —
  //   q (N, NHl, Dk), kv (N, Dk) this call's rows' cached [latent | rope key], out (N, NHl, Dv) written,
  //   out_h = softmax(scale · q_h · Kᵀ) · K[:, :Dv] over the row's sequence's keys (causal).
  // Only decoding cores that keep a latent cache have it; the default refuses.
  virtual void latent_forward(const BlockShape& s, const Tensor& q, const Tensor& kv, const Tensor& out,
                              float scale) const;
  // false: a decoding core (no lse, no backward).
  virtual bool trains() const { return true; }
  // The position of each of the N rows, for rope; nullptr: row b·T + t is at t (at its global
  // position under context parallelism).
  virtual const std::vector<int64_t>* positions() const { return nullptr; }
  // With positions(): each row's sequence length for dynamic NTK rope (transformers' max position
  // seen + 1: the row's sequence's last position in this call + 1); nullptr: the whole sequence, T.
  virtual const std::vector<int64_t>* rope_lengths() const { return nullptr; }
};

// The attention-probability dropout of a call: the mask of (batch, GLOBAL head, i, j) — this rank's
// heads start at rank·NH/t — so TP ranks and a recompute draw the single-process masks.
AttentionDropout attention_dropout(const BlockShape& s, const AttentionSpec& a, uint64_t seed);

class LocalAttention final : public AttentionCore {
 public:
  // kv_lengths: (B) i32 on the device, keys j >= len[b] masked (BERT's padding); undefined: none.
  explicit LocalAttention(Tensor kv_lengths = Tensor()) : kv_lengths_(std::move(kv_lengths)) {}
  void forward(const BlockShape& s, const AttentionSpec& a, const Tensor& qkv, const Tensor& att, const Tensor& lse,
               uint64_t seed) const override;
  void backward(const BlockShape& s, const AttentionSpec& a, const Tensor& datt, const Tensor& qkv, const Tensor& att,
                const Tensor& lse, const Tensor& dqkv, uint64_t seed) const override;

 private:
  Tensor kv_lengths_;
};

class ContextParallelAttention final : public AttentionCore {
 public:
  void forward(const BlockShape& s, const AttentionSpec& a, const Tensor& qkv, const Tensor& att, const Tensor& lse,
               uint64_t seed) const override;
  void backward(const BlockShape& s, const AttentionSpec& a, const Tensor& datt, const Tensor& qkv, const Tensor& att,
                const Tensor& lse, const Tensor& dqkv, uint64_t seed) const override;
};

class BiasedAttention final : public AttentionCore {
 public:
  // bias (T, T, NHl) f32 added to the scores; bias_grad (T, T, NHl) f32, to which the backward adds
  // (undefined: none); kv_lengths as LocalAttention's (the encoder's padding).
  BiasedAttention(Tensor bias, Tensor bias_grad, Tensor kv_lengths)
      : bias_(std::move(bias)), bias_grad_(std::move(bias_grad)), kv_lengths_(std::move(kv_lengths)) {}
  void forward(const BlockShape& s, const AttentionSpec& a, const Tensor& qkv, const Tensor& att, const Tensor& lse,
               uint64_t seed) const override;
  void backward(const BlockShape& s, const AttentionSpec& a, const Tensor& datt, const Tensor& qkv, const Tensor& att,
                const Tensor& lse, const Tensor& dqkv, uint64_t seed) const override;

 private:
  Tensor bias_, bias_grad_, kv_lengths_;
};

// The core a call runs: s.core, or the local one.
const AttentionCore& attention_core(const BlockShape& s);

}  // namespace mpitron
