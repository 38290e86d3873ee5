#include "model/layers/cross_attention_layer.h"

#include <algorithm>
#include <cmath>

#include "model/layers/linear_grad.h"
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

AttentionDropout cross_dropout(const BlockShape& s, uint64_t seed) {
  if (s.attention_dropout == 0.0f) return {};
  return {s.attention_dropout, seed, s.cross.attention_offset, s.tp.rank * s.local_heads()};
}

// (B, T, heads, HD) views of q and of kv's key and value heads.
struct CrossViews {
  Tensor q, k, v;
};
CrossViews views(const BlockShape& s, const Tensor& q, const Tensor& kv) {
  const int64_t HD = s.head_dim(), Gl = s.local_groups();
  const Tensor kv4 = kv.view({s.batch, s.cross.seq, 2 * Gl, HD});
  return {q.view({s.batch, s.seq, s.local_heads(), HD}), kv4.slice(2, 0, Gl), kv4.slice(2, Gl, 2 * Gl)};
}

}  // namespace

Tensor cross_attention_forward(const BlockShape& s, const CrossAttentionParams& p, const Tensor& in,
                               CrossAttentionActs& a, uint64_t seed) {
  const int64_t N = s.tokens(), M = s.batch * s.cross.seq, C = s.hidden, HD = s.head_dim();
  const int64_t Cl = s.local_att(), KVl = 2 * s.local_groups() * HD;
  a.in = in;
  a.q = Tensor::empty({N, Cl}, in.dtype(), in.device());
  linear_forward(gather_rows(s, in), p.q_w, p.q_b, a.q);
  a.kv = Tensor::empty({M, KVl}, in.dtype(), in.device());
  linear_forward(gather_rows(s, s.cross.memory), p.kv_w, p.kv_b, a.kv);
  a.att = Tensor::empty({N, Cl}, in.dtype(), in.device());
  a.lse = Tensor::empty({s.batch, s.local_heads(), s.seq}, DType::F32, in.device());
  const CrossViews v = views(s, a.q, a.kv);
  attention_block_forward(v.q, v.k, v.v, a.att.view({s.batch, s.seq, s.local_heads(), HD}), a.lse,
                          1.0f / std::sqrt(static_cast<float>(HD)), cross_block(s), cross_dropout(s, seed));
  Tensor out = Tensor::empty({N, C}, in.dtype(), in.device());
  linear_forward(a.att, p.proj_w, s.tp.rank == 0 ? p.proj_b : Var(), out);  // row-parallel bias: added once
  return reduce_rows(s, out);
}

Tensor cross_attention_backward(const BlockShape& s, const CrossAttentionParams& p, const CrossAttentionActs& a,
                                const Tensor& dout, uint64_t seed, WeightGradWork* defer) {
  const int64_t N = s.tokens(), M = s.batch * s.cross.seq, C = s.hidden, HD = s.head_dim();
  const Tensor dout_f = gather_rows(s, dout);  // (N, C)
  Tensor datt = Tensor::empty(a.att.shape(), dout.dtype(), dout.device());
  linear_backward_input(dout_f, p.proj_w, datt);
  linear_backward_weight(dout_f, a.att, p.proj_w, p.proj_b, defer);
  Tensor dq = Tensor::empty(a.q.shape(), dout.dtype(), dout.device());
  Tensor dkv = Tensor::empty(a.kv.shape(), dout.dtype(), dout.device());
  const CrossViews v = views(s, a.q, a.kv), dv = views(s, dq, dkv);
  const Shape o4{s.batch, s.seq, s.local_heads(), HD};
  attention_block_backward(datt.view(o4), v.q, v.k, v.v, a.att.view(o4), a.lse, dv.q, dv.k, dv.v,
                           1.0f / std::sqrt(static_cast<float>(HD)), cross_block(s), cross_dropout(s, seed));
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

}  // namespace mpitron
