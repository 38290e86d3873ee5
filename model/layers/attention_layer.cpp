#include "model/layers/attention_layer.h"

#include <cmath>

#include "model/layers/linear_grad.h"
#include "tensor/ops.h"

namespace mpitron {

namespace {

// The attention-probability dropout: the mask of (batch, GLOBAL head, i, j) — this
// rank's heads start at rank·NH/t — so TP ranks and a recompute draw the
// single-process masks.
AttentionDropout attention_dropout(const BlockShape& s, uint64_t seed) {
  if (s.attention_dropout == 0.0f) return {};
  return {s.attention_dropout, seed, s.attention_offset, s.tp.rank * s.local_heads()};
}

void apply_rope(const BlockShape& s, const Tensor& qkv, const AttentionCore* core, bool inverse) {
  if (!s.rope) return;
  const int64_t H = s.local_heads() + 2 * s.local_groups(), rot = s.local_heads() + s.local_groups();
  const std::vector<int64_t>* pos = core ? core->positions() : nullptr;
  auto run = [&](const Tensor& t, const RopeArgs& args) {
    if (inverse) rope_backward(t, t, rot, args);
    else rope_forward(t, t, rot, args);
  };
  if (!pos && s.cp.active()) {  // context parallelism: each sample's chunks at their global positions
    const int64_t row = H * s.head_dim();
    for (int64_t b = 0; b < s.batch; ++b)
      for (const ContextParallel::Run& r : s.cp.runs(s.global_seq())) {
        RopeArgs args = s.rope_args;
        args.position_offset = r.global;
        run(qkv.flat_range((b * s.seq + r.local) * row, r.len * row).view({1, r.len, H, s.head_dim()}), args);
      }
    return;
  }
  if (!pos) {
    run(qkv.view({s.batch, s.seq, H, s.head_dim()}), s.rope_args);
    return;
  }
  for (int64_t i = 0; i < qkv.dim(0); ++i) {  // decode: every row at its own position
    RopeArgs args = s.rope_args;
    args.position_offset = (*pos)[static_cast<size_t>(i)];
    run(qkv.slice(0, i, i + 1).view({1, 1, H, s.head_dim()}), args);
  }
}

// The block's attention mask: causal (decoders), within a sliding window (Mistral) or
// bidirectional (BERT), with BERT's key padding (kv_lengths (B) i32: keys j >= len[b] are masked).
AttentionMask attention_mask(const BlockShape& s) {
  return AttentionMask{s.mask != AttentionMaskKind::Padding, s.kv_lengths,
                       s.mask == AttentionMaskKind::SlidingWindow ? s.window : 0};
}

// T5's self-attention: the stack's relative position bias on the scores, through the block form
// (tensor/attention_block.h) over the whole sequence with the layer's mask.
bool biased(const BlockShape& s) { return s.attn_bias.defined(); }
AttentionBlock biased_block(const BlockShape& s, bool backward) {
  AttentionBlock b;
  b.seq = s.seq;
  b.causal = s.mask != AttentionMaskKind::Padding;
  if (!b.causal) b.kv_lengths = s.kv_lengths;
  b.bias = s.attn_bias;
  if (backward) b.bias_grad = s.attn_bias_grad;
  return b;
}
// (B, T, heads, HD) views of the packed qkv's query, key and value heads.
struct QkvViews {
  Tensor q, k, v;
};
QkvViews qkv_views(const BlockShape& s, const Tensor& qkv) {
  const int64_t NHl = s.local_heads(), Gl = s.local_groups();
  const Tensor t = qkv.view({s.batch, s.seq, NHl + 2 * Gl, s.head_dim()});
  return {t.slice(2, 0, NHl), t.slice(2, NHl, NHl + Gl), t.slice(2, NHl + Gl, NHl + 2 * Gl)};
}

}  // namespace

Tensor attention_layer_forward(const BlockShape& s, const AttentionParams& p, const Tensor& in, AttentionActs& a,
                               uint64_t seed, const AttentionCore* core) {
  const int64_t N = s.tokens(), C = s.hidden, HD = s.head_dim(), NHl = s.local_heads();
  const int64_t H = NHl + 2 * s.local_groups();
  a.in = in;
  const Tensor in_f = gather_rows(s, in);  // (N, C)
  a.qkv = Tensor::empty({N, s.local_qkv()}, in.dtype(), in.device());
  linear_forward(in_f, p.qkv_w, p.qkv_b, a.qkv);
  apply_rope(s, a.qkv, core, false);
  a.att = Tensor::empty({N, NHl * HD}, in.dtype(), in.device());
  if (core) {
    a.lse = Tensor();
    core->attend(s, a.qkv, a.att);
  } else {
    a.lse = Tensor::empty({s.batch, NHl, s.seq}, DType::F32, in.device());
    const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
    if (biased(s)) {
      const QkvViews v = qkv_views(s, a.qkv);
      attention_block_forward(v.q, v.k, v.v, a.att.view({s.batch, s.seq, NHl, HD}), a.lse, scale,
                              biased_block(s, false), attention_dropout(s, seed));
    } else if (s.cp.active())  // this rank's queries over the whole sequence's keys, across the cp group
      cp_attention_forward(s.cp, a.qkv.view({s.batch, s.seq, H, HD}), a.att.view({s.batch, s.seq, NHl, HD}), a.lse,
                           scale, attention_dropout(s, seed));
    else
      attention_forward(a.qkv.view({s.batch, s.seq, H, HD}), a.att.view({s.batch, s.seq, NHl, HD}), a.lse, scale,
                        attention_dropout(s, seed), attention_mask(s));
  }
  Tensor out = Tensor::empty({N, C}, in.dtype(), in.device());
  linear_forward(a.att, p.proj_w, s.tp.rank == 0 ? p.proj_b : Var(), out);  // row-parallel bias: added once
  return reduce_rows(s, out);
}

Tensor attention_layer_backward(const BlockShape& s, const AttentionParams& p, const AttentionActs& a,
                                const Tensor& dout, uint64_t seed, WeightGradWork* defer) {
  const int64_t N = s.tokens(), C = s.hidden, HD = s.head_dim(), NHl = s.local_heads();
  const int64_t H = NHl + 2 * s.local_groups();
  const Tensor dout_f = gather_rows(s, dout);  // (N, C): the full output gradient on every rank
  Tensor datt = Tensor::empty({N, NHl * HD}, dout.dtype(), dout.device());
  linear_backward_input(dout_f, p.proj_w, datt);
  linear_backward_weight(dout_f, a.att, p.proj_w, p.proj_b, defer);
  Tensor dqkv = Tensor::empty(a.qkv.shape(), dout.dtype(), dout.device());
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  if (biased(s)) {
    const QkvViews v = qkv_views(s, a.qkv), d = qkv_views(s, dqkv);
    attention_block_backward(datt.view({s.batch, s.seq, NHl, HD}), v.q, v.k, v.v, a.att.view({s.batch, s.seq, NHl, HD}),
                             a.lse, d.q, d.k, d.v, scale, biased_block(s, true), attention_dropout(s, seed));
  } else if (s.cp.active())
    cp_attention_backward(s.cp, datt.view({s.batch, s.seq, NHl, HD}), a.qkv.view({s.batch, s.seq, H, HD}),
                          a.att.view({s.batch, s.seq, NHl, HD}), a.lse, dqkv.view({s.batch, s.seq, H, HD}), scale,
                          attention_dropout(s, seed));
  else
    attention_backward(datt.view({s.batch, s.seq, NHl, HD}), a.qkv.view({s.batch, s.seq, H, HD}),
                       a.att.view({s.batch, s.seq, NHl, HD}), a.lse, dqkv.view({s.batch, s.seq, H, HD}), scale,
                       attention_dropout(s, seed), attention_mask(s));
  apply_rope(s, dqkv, nullptr, true);  // rope is a rotation: its transpose is the inverse
  Tensor din_f = Tensor::empty({N, C}, dout.dtype(), dout.device());
  linear_backward_input(dqkv, p.qkv_w, din_f);
  linear_backward_weight(dqkv, gather_rows(s, a.in), p.qkv_w, p.qkv_b, defer);
  return reduce_rows(s, din_f);
}

}  // namespace mpitron
