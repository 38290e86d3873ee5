#include "model/layers/cross_attention_layer.h"

#include <algorithm>
#include <cmath>

#include "model/block.h"
#include "model/layers/linear_grad.h"
#include "model/param_rows.h"
#include "tensor/ops.h"

namespace mpitron {

namespace {

// The block form's description of the call: every key of the encoder visible, bar its padding.
AttentionBlock cross_block(const BlockShape& s) {
  AttentionBlock b;
  b.causal = false;
  b.seq = std::max(s.seq, s.cross.seq);  // the dropout keys i·seq + j stay distinct for Td ≠ Te
  b.kv_lengths = s.cross.lengths;
  return b;
}

AttentionDropout cross_dropout(const BlockShape& s, const AttentionSpec& a, uint64_t seed) {
  if (s.attention_dropout == 0.0f) return {};
  return {s.attention_dropout, seed, s.cross.attention_offset, s.tp.rank * a.local_heads(s.tp)};
}

// (B, T, heads, HD) views of q and of kv's key and value heads.
struct CrossViews {
  Tensor q, k, v;
};
CrossViews views(const BlockShape& s, const AttentionSpec& a, const Tensor& q, const Tensor& kv) {
  const int64_t HD = a.head_dim, Gl = a.local_groups(s.tp);
  const Tensor kv4 = kv.view({s.batch, s.cross.seq, 2 * Gl, HD});
  return {q.view({s.batch, s.seq, a.local_heads(s.tp), HD}), kv4.slice(2, 0, Gl), kv4.slice(2, Gl, 2 * Gl)};
}

struct CrossAttentionParams {
  Var q_w, q_b;        // (NH·HD, C) split by rows (heads); bias may be undefined
  Var kv_w, kv_b;      // (2·G·HD, C) parts K | V, each split by rows
  Var proj_w, proj_b;  // (C, NH·HD) split by columns; bias may be undefined
};

CrossAttentionParams cross_params(const BlockParams& p) {
  return {p[ParamRole::CrossQWeight], p[ParamRole::CrossQBias], p[ParamRole::CrossKvWeight],
          p[ParamRole::CrossKvBias], p[ParamRole::CrossProjWeight], p[ParamRole::CrossProjBias]};
}

}  // namespace

Tensor cross_attention_kv(const BlockShape& s, const BlockParams& bp) {
  const CrossAttentionParams p = cross_params(bp);
  const Tensor& mem = s.cross.memory;
  const int64_t M = s.batch * s.cross.seq, KVl = p.kv_w.value().dim(0);  // this rank's 2·Gl·HD rows
  Tensor kv = Tensor::empty({M, KVl}, mem.dtype(), mem.device());
  linear_forward(gather_rows(s, mem), p.kv_w, p.kv_b, kv);
  return kv;
}

void CrossAttention::rows(std::vector<ParamSpec>& v) const {
  const int64_t C = hidden_, HD = spec_.head_dim, q = spec_.heads * HD, kv = spec_.groups * HD, l = layer_;
  const std::string p = str("layers.", l, ".xattn.");
  using R = ParamRole;
  using I = ParamInit;
  const ParamPlace L = ParamPlace::Layer;
  v.push_back(matmul_row(tp_split(param_row(p + "q.weight", R::CrossQWeight, {q, C}, I::Normal, L, l), 0)));
  if (spec_.qkv_bias) v.push_back(tp_split(param_row(p + "q.bias", R::CrossQBias, {q}, I::Zeros, L, l), 0));
  v.push_back(matmul_row(tp_split(param_row(p + "kv.weight", R::CrossKvWeight, {2 * kv, C}, I::Normal, L, l), 0, {kv, kv})));
  if (spec_.qkv_bias) v.push_back(tp_split(param_row(p + "kv.bias", R::CrossKvBias, {2 * kv}, I::Zeros, L, l), 0, {kv, kv}));
  v.push_back(matmul_row(tp_split(param_row(p + "proj.weight", R::CrossProjWeight, {C, q}, I::OutputNormal, L, l), 1)));
  if (spec_.proj_bias) v.push_back(param_row(p + "proj.bias", R::CrossProjBias, {C}, I::Zeros, L, l));
}

Tensor CrossAttention::forward(const BlockShape& s, const BlockParams& bp, const Tensor& in,
                               std::unique_ptr<SublayerActs>& acts, uint64_t seed) const {
  const AttentionSpec& sp = spec_;
  const CrossAttentionParams p = cross_params(bp);
  auto owned = std::make_unique<CrossAttentionActs>();
  CrossAttentionActs& a = *owned;
  const int64_t N = s.tokens(), M = s.batch * s.cross.seq, C = s.hidden, HD = sp.head_dim;
  const int64_t Cl = sp.local_att(s.tp), KVl = 2 * sp.local_groups(s.tp) * HD;
  a.in = in;
  a.q = Tensor::empty({N, Cl}, in.dtype(), in.device());
  linear_forward(gather_rows(s, in), p.q_w, p.q_b, a.q);
  a.kv = s.cross.kv.defined() ? s.cross.kv : cross_attention_kv(s, bp);
  MPT_CHECK(a.kv.shape() == Shape({M, KVl}),
            str("cross-attention of layer ", layer_, ": keys and values ", shape_str(a.kv.shape()), ", expected (", M,
                ", ", KVl, ")"),
            "");
  a.att = Tensor::empty({N, Cl}, in.dtype(), in.device());
  a.lse = Tensor::empty({s.batch, sp.local_heads(s.tp), s.seq}, DType::F32, in.device());
  const CrossViews v = views(s, sp, a.q, a.kv);
  attention_block_forward(v.q, v.k, v.v, a.att.view({s.batch, s.seq, sp.local_heads(s.tp), HD}), a.lse,
                          1.0f / std::sqrt(static_cast<float>(HD)), cross_block(s), cross_dropout(s, sp, seed));
  Tensor out = Tensor::empty({N, C}, in.dtype(), in.device());
  linear_forward(a.att, p.proj_w, s.tp.rank == 0 ? p.proj_b : Var(), out);  // row-parallel bias: added once
  acts = std::move(owned);
  return reduce_rows(s, out);
}

Tensor CrossAttention::backward(const BlockShape& s, const BlockParams& bp, const SublayerActs& acts,
                                const Tensor& dout, uint64_t seed, WeightGradWork* defer) const {
  const AttentionSpec& sp = spec_;
  const CrossAttentionParams p = cross_params(bp);
  const CrossAttentionActs& a = static_cast<const CrossAttentionActs&>(acts);
  const int64_t N = s.tokens(), M = s.batch * s.cross.seq, C = s.hidden, HD = sp.head_dim;
  const Tensor dout_f = gather_rows(s, dout);  // (N, C)
  Tensor datt = Tensor::empty(a.att.shape(), dout.dtype(), dout.device());
  linear_backward_input(dout_f, p.proj_w, datt);
  linear_backward_weight(dout_f, a.att, p.proj_w, p.proj_b, defer);
  Tensor dq = Tensor::empty(a.q.shape(), dout.dtype(), dout.device());
  Tensor dkv = Tensor::empty(a.kv.shape(), dout.dtype(), dout.device());
  const CrossViews v = views(s, sp, a.q, a.kv), dv = views(s, sp, dq, dkv);
  const Shape o4{s.batch, s.seq, sp.local_heads(s.tp), HD};
  attention_block_backward(datt.view(o4), v.q, v.k, v.v, a.att.view(o4), a.lse, dv.q, dv.k, dv.v,
                           1.0f / std::sqrt(static_cast<float>(HD)), cross_block(s), cross_dropout(s, sp, seed));
  // The encoder's share: d(mem) = dkv · Wkv, summed over the TP ranks' heads (reduce-scattered with SP).
  Tensor dmem_f = Tensor::empty({M, C}, dout.dtype(), dout.device());
  linear_backward_input(dkv, p.kv_w, dmem_f);
  linear_backward_weight(dkv, gather_rows(s, s.cross.memory), p.kv_w, p.kv_b, defer);
  axpby(1.0f, reduce_rows(s, dmem_f), 1.0f, s.cross.memory_grad);
  Tensor din_f = Tensor::empty({N, C}, dout.dtype(), dout.device());
  linear_backward_input(dq, p.q_w, din_f);
  linear_backward_weight(dq, gather_rows(s, a.in), p.q_w, p.q_b, defer);
  return reduce_rows(s, din_f);
}

void CrossAttention::memory(const BlockShape& s, BlockMemory& m) const {
  // M = B·Te memory rows: q and att (N, Cl), kv (M, 2·Gl·HD), lse (B, NHl, Td) f32. Its backward holds
  // datt, dq (N, Cl), dkv (M, 2·Gl·HD) and d(mem) (M, C).
  const int64_t N = s.tokens(), M = s.batch * s.cross.seq, KV = 2 * spec_.local_groups(s.tp) * spec_.head_dim;
  const int64_t Cl = spec_.local_att(s.tp);
  m.saved_act += 2 * N * Cl + M * KV;
  m.saved_f32 += s.batch * spec_.local_heads(s.tp) * s.seq;
  m.backward_act += 2 * N * Cl + M * (KV + s.hidden);
  m.deferred_act += 2 * N * Cl + M * (KV + s.hidden);
}

}  // namespace mpitron
