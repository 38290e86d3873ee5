#include "model/layers/attention_core.h"

#include "core/error.h"
#include "tensor/ops.h"

namespace mpitron {

namespace {

// (B, T, NHl + 2·Gl, HD) and (B, T, NHl, HD) views of the packed qkv and of att.
Tensor heads4(const BlockShape& s, const AttentionSpec& a, const Tensor& qkv) {
  return qkv.view({s.batch, s.seq, a.local_heads(s.tp) + 2 * a.local_groups(s.tp), a.head_dim});
}
Tensor out4(const BlockShape& s, const AttentionSpec& a, const Tensor& att) {
  return att.view({s.batch, s.seq, a.local_heads(s.tp), a.head_dim});
}

// (B, T, heads, HD) views of the packed qkv's query, key and value heads.
struct QkvViews {
  Tensor q, k, v;
};
QkvViews qkv_views(const BlockShape& s, const AttentionSpec& a, const Tensor& qkv) {
  const int64_t NHl = a.local_heads(s.tp), Gl = a.local_groups(s.tp);
  const Tensor t = heads4(s, a, qkv);
  return {t.slice(2, 0, NHl), t.slice(2, NHl, NHl + Gl), t.slice(2, NHl + Gl, NHl + 2 * Gl)};
}

}  // namespace

void AttentionCore::backward(const BlockShape&, const AttentionSpec&, const Tensor&, const Tensor&, const Tensor&,
                             const Tensor&, const Tensor&, uint64_t) const {
  MPT_THROW("this attention core has no backward (a decoding core)", "train with the training block's cores");
}

void AttentionCore::latent_forward(const BlockShape&, const Tensor&, const Tensor&, const Tensor&, float) const {
  MPT_THROW("this attention core has no latent attention (multi-latent attention decodes over a latent KV cache)",
            "decode multi-latent attention models through the paged KV cache (generate_text, the server)");
}

AttentionDropout attention_dropout(const BlockShape& s, const AttentionSpec& a, uint64_t seed) {
  if (s.attention_dropout == 0.0f) return {};
  return {s.attention_dropout, seed, s.attention_offset, s.tp.rank * a.local_heads(s.tp)};
}

const AttentionCore& attention_core(const BlockShape& s) {
  static const LocalAttention local;
  return s.core ? *s.core : local;
}

// ---- LocalAttention

namespace {
// The layer's mask: causal (decoders), within a sliding window (Mistral) or bidirectional (BERT),
// with the key padding (kv_lengths (B) i32: keys j >= len[b] are masked).
AttentionMask local_mask(const AttentionSpec& a, const Tensor& kv_lengths) {
  AttentionMask m;
  m.causal = a.mask != AttentionMaskKind::Padding;
  m.kv_lengths = kv_lengths;
  m.window = a.mask == AttentionMaskKind::SlidingWindow ? a.window : 0;
  m.softcap = a.softcap;
  return m;
}
}  // namespace

void LocalAttention::forward(const BlockShape& s, const AttentionSpec& a, const Tensor& qkv, const Tensor& att,
                             const Tensor& lse, uint64_t seed) const {
  attention_forward(heads4(s, a, qkv), out4(s, a, att), lse, a.scale, attention_dropout(s, a, seed),
                    local_mask(a, kv_lengths_));
}

void LocalAttention::backward(const BlockShape& s, const AttentionSpec& a, const Tensor& datt, const Tensor& qkv,
                              const Tensor& att, const Tensor& lse, const Tensor& dqkv, uint64_t seed) const {
  attention_backward(out4(s, a, datt), heads4(s, a, qkv), out4(s, a, att), lse, heads4(s, a, dqkv), a.scale,
                     attention_dropout(s, a, seed), local_mask(a, kv_lengths_));
}

// ---- ContextParallelAttention

namespace {
void check_cp(const AttentionSpec& a) {
  MPT_CHECK(a.mask == AttentionMaskKind::Causal,
            str("context parallelism runs causal attention; this layer's is ", to_string(a.mask)),
            "train without --context-parallel-size, or without --window-size / padding masks");
  MPT_CHECK(a.softcap == 0, "context parallelism with --attn-logit-softcapping is not built",
            "train without --context-parallel-size (Gemma 2's soft-capped attention runs under TP, PP, DP)");
}
}  // namespace

void ContextParallelAttention::forward(const BlockShape& s, const AttentionSpec& a, const Tensor& qkv,
                                       const Tensor& att, const Tensor& lse, uint64_t seed) const {
  check_cp(a);
  cp_attention_forward(s.cp, heads4(s, a, qkv), out4(s, a, att), lse, a.scale, attention_dropout(s, a, seed));
}

void ContextParallelAttention::backward(const BlockShape& s, const AttentionSpec& a, const Tensor& datt,
                                        const Tensor& qkv, const Tensor& att, const Tensor& lse, const Tensor& dqkv,
                                        uint64_t seed) const {
  check_cp(a);
  cp_attention_backward(s.cp, out4(s, a, datt), heads4(s, a, qkv), out4(s, a, att), lse, heads4(s, a, dqkv), a.scale,
                        attention_dropout(s, a, seed));
}

// ---- BiasedAttention: the block form over the whole sequence with the layer's mask.

namespace {
AttentionBlock biased_block(const BlockShape& s, const AttentionSpec& a, const Tensor& bias, const Tensor& bias_grad,
                            const Tensor& kv_lengths) {
  AttentionBlock b;
  b.seq = s.seq;
  b.causal = a.mask != AttentionMaskKind::Padding;
  if (!b.causal) b.kv_lengths = kv_lengths;
  b.bias = bias;
  b.bias_grad = bias_grad;
  b.softcap = a.softcap;
  return b;
}
}  // namespace

void BiasedAttention::forward(const BlockShape& s, const AttentionSpec& a, const Tensor& qkv, const Tensor& att,
                              const Tensor& lse, uint64_t seed) const {
  const QkvViews v = qkv_views(s, a, qkv);
  attention_block_forward(v.q, v.k, v.v, out4(s, a, att), lse, a.scale,
                          biased_block(s, a, bias_, Tensor(), kv_lengths_), attention_dropout(s, a, seed));
}

void BiasedAttention::backward(const BlockShape& s, const AttentionSpec& a, const Tensor& datt, const Tensor& qkv,
                               const Tensor& att, const Tensor& lse, const Tensor& dqkv, uint64_t seed) const {
  const QkvViews v = qkv_views(s, a, qkv), d = qkv_views(s, a, dqkv);
  attention_block_backward(out4(s, a, datt), v.q, v.k, v.v, out4(s, a, att), lse, d.q, d.k, d.v, a.scale,
                           biased_block(s, a, bias_, bias_grad_, kv_lengths_), attention_dropout(s, a, seed));
}

}  // namespace mpitron
