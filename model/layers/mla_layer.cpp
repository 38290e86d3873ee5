#include "model/layers/mla_layer.h"

#include <cmath>

#include "core/error.h"
#include "model/block.h"
#include "model/layers/attention_core.h"
#include "model/layers/linear_grad.h"
#include "model/param_rows.h"
#include "tensor/ops.h"

namespace mpitron {

void MultiLatentAttention::rows(std::vector<ParamSpec>& v) const {
  const int64_t C = hidden_, NH = spec_.heads, l = layer_, qr = spec_.q_lora_rank, kr = spec_.kv_lora_rank;
  const int64_t Dqk = spec_.qk_dim(), dr = spec_.qk_rope, dn = spec_.qk_nope, dv = spec_.v_dim;
  const std::string p = str("layers.", l, ".attn.");
  using R = ParamRole;
  using I = ParamInit;
  const ParamPlace L = ParamPlace::Layer;
  const I one = spec_.latent_norm.one_plus ? I::Zeros : I::Ones;
  if (qr > 0) {
    v.push_back(matmul_row(param_row(p + "q_down.weight", R::MlaQDownWeight, {qr, C}, I::Normal, L, l)));
    v.push_back(param_row(p + "q_down_norm.weight", R::MlaQDownNormWeight, {qr}, one, L, l));
    v.push_back(matmul_row(tp_split(param_row(p + "q_up.weight", R::MlaQUpWeight, {NH * Dqk, qr}, I::Normal, L, l), 0)));
  } else {
    v.push_back(matmul_row(tp_split(param_row(p + "q.weight", R::MlaQWeight, {NH * Dqk, C}, I::Normal, L, l), 0)));
  }
  v.push_back(matmul_row(param_row(p + "kv_down.weight", R::MlaKvDownWeight, {kr + dr, C}, I::Normal, L, l)));
  v.push_back(param_row(p + "kv_down_norm.weight", R::MlaKvDownNormWeight, {kr}, one, L, l));
  v.push_back(matmul_row(tp_split(param_row(p + "kv_up.weight", R::MlaKvUpWeight, {NH * (dn + dv), kr}, I::Normal, L, l), 0)));
  v.push_back(matmul_row(tp_split(param_row(p + "proj.weight", R::ProjWeight, {C, NH * dv}, I::OutputNormal, L, l), 1)));
}

namespace {

Tensor like(const Tensor& x, const Shape& shape) { return Tensor::empty(shape, x.dtype(), x.device()); }

// Rope over (N, H, D) contiguous rows of the call's (B, T) tokens, in place (its transpose with inverse);
// decoding: each row at the position its core gives.
void rope_heads(const BlockShape& s, const Tensor& x, const RopeArgs& args, bool inverse) {
  const AttentionCore& core = attention_core(s);
  if (const std::vector<int64_t>* pos = core.positions()) {
    const std::vector<int64_t>* lens = core.rope_lengths();
    for (int64_t i = 0; i < x.dim(0); ++i) {
      RopeArgs a = args;
      a.position_offset = (*pos)[static_cast<size_t>(i)];
      a.scaling.dynamic_seq_len = lens ? (*lens)[static_cast<size_t>(i)] : a.position_offset + 1;
      const Tensor r = x.slice(0, i, i + 1).view({1, 1, x.dim(1), x.dim(2)});
      if (inverse) rope_backward(r, r, x.dim(1), a);
      else rope_forward(r, r, x.dim(1), a);
    }
    return;
  }
  RopeArgs a = args;
  a.scaling.dynamic_seq_len = s.global_seq();
  const Tensor x4 = x.view({s.batch, s.seq, x.dim(1), x.dim(2)});
  if (inverse) rope_backward(x4, x4, x.dim(1), a);
  else rope_forward(x4, x4, x.dim(1), a);
}

void check_call(const BlockShape& s) {
  MPT_CHECK(!s.cp.active(), "context parallelism with --multi-latent-attention is not built",
            "train multi-latent attention without --context-parallel-size (TP, SP, PP, DP/ZeRO and EP take it)");
  MPT_CHECK(!s.core || !s.core->trains(),
            "multi-latent attention runs its own causal attention: no bias, padding or other training core",
            "train multi-latent attention as a causal decoder");
}

AttentionDropout mla_dropout(const BlockShape& s, const MlaSpec& m, uint64_t seed) {
  if (s.attention_dropout == 0.0f) return {};
  return {s.attention_dropout, seed, s.attention_offset, s.tp.rank * m.local_heads(s.tp)};
}

// x·Wᵀ into a new (rows, W.rows) tensor.
Tensor linear(const Tensor& x, const Var& w) {
  Tensor y = like(x, {x.dim(0), w.value().dim(0)});
  linear_forward(x, w, Var(), y);
  return y;
}

}  // namespace

// Decoding over the latent KV cache (the call's core is a decoding core: model/inference/paged_kv_cache.h),
// the up-projections absorbed: with W_uk,h (dn, kr) and W_uv,h (dv, kr) head h's rows of kv_up,
//   q_lat,h (kr + dr) = [q_nope,h · W_uk,h | q_pe,h]   the query against the cached [c | k_pe] rows
//   o_h (kr)          = softmax(scale · q_lat,h · [c | k_pe]ᵀ) · c   over the sequence's cached tokens
//   att_h (dv)        = o_h · W_uv,hᵀ
// which is exactly the attention of forward() (q_nope,h · k_nope,h = (q_nope,h · W_uk,h) · c, and
// Σ p · v_h = W_uv,h · Σ p · c), with kr + dr values per token in the cache instead of NH·(Dqk + dv).
Tensor MultiLatentAttention::decode(const BlockShape& s, const BlockParams& p, const Tensor& in) const {
  const MlaSpec& m = spec_;
  const int64_t n = in.dim(0), NHl = m.local_heads(s.tp), dn = m.qk_nope, dr = m.qk_rope, dv = m.v_dim, Dqk = m.qk_dim();
  const int64_t kr = m.kv_lora_rank;
  Tensor q;
  if (m.q_lora_rank > 0) {
    const Tensor qa = linear(in, p[ParamRole::MlaQDownWeight]);
    Tensor qn = like(in, qa.shape());
    NormActs na;
    norm_forward(Normalization::RMSNorm, m.latent_norm.eps, {p[ParamRole::MlaQDownNormWeight], Var(), m.latent_norm.one_plus},
                 qa, qn, na);
    q = linear(qn, p[ParamRole::MlaQUpWeight]).view({n, NHl, Dqk});
  } else {
    q = linear(in, p[ParamRole::MlaQWeight]).view({n, NHl, Dqk});
  }
  const Tensor kva = linear(in, p[ParamRole::MlaKvDownWeight]);  // (n, kr + dr) = [c | k_pe]
  const Tensor c = kva.slice(1, 0, kr).contiguous();
  Tensor row = like(in, {n, kr + dr});  // the cached row [norm(c) | rope(k_pe)]
  {
    Tensor cn = like(in, c.shape());
    NormActs na;
    norm_forward(Normalization::RMSNorm, m.latent_norm.eps, {p[ParamRole::MlaKvDownNormWeight], Var(), m.latent_norm.one_plus},
                 c, cn, na);
    row.slice(1, 0, kr).copy_from(cn);
    Tensor k_pe = kva.slice(1, kr, kr + dr).contiguous().view({n, 1, dr});
    rope_heads(s, k_pe, m.rope_args, false);
    row.slice(1, kr, kr + dr).copy_from(k_pe.view({n, dr}));
  }
  Tensor q_pe = q.slice(2, dn, Dqk).contiguous();
  rope_heads(s, q_pe, m.rope_args, false);
  const Tensor w = p[ParamRole::MlaKvUpWeight].value();  // (NHl·(dn + dv), kr): per head [W_uk (dn) | W_uv (dv)]
  Tensor q_lat = like(in, {n, NHl, kr + dr});
  Tensor o = like(in, {n, NHl, kr}), att = like(in, {n, NHl * dv});
  Tensor t_kr = like(in, {n, kr}), t_dv = like(in, {n, dv});
  for (int64_t h = 0; h < NHl; ++h) {
    const Tensor w_uk = w.slice(0, h * (dn + dv), h * (dn + dv) + dn);  // (dn, kr), contiguous rows
    gemm(q.select(1, h).slice(1, 0, dn).contiguous(), w_uk, t_kr, GemmArgs{});
    q_lat.select(1, h).slice(1, 0, kr).copy_from(t_kr);
    q_lat.select(1, h).slice(1, kr, kr + dr).copy_from(q_pe.select(1, h));
  }
  attention_core(s).latent_forward(s, q_lat, row, o, m.scale);
  for (int64_t h = 0; h < NHl; ++h) {
    const Tensor w_uv = w.slice(0, h * (dn + dv) + dn, (h + 1) * (dn + dv));  // (dv, kr)
    gemm(o.select(1, h).contiguous(), w_uv, t_dv, GemmArgs{false, true, 1.0f, 0.0f});
    att.slice(1, h * dv, (h + 1) * dv).copy_from(t_dv);
  }
  Tensor out = like(in, {n, s.hidden});
  linear_forward(att, p[ParamRole::ProjWeight], Var(), out);
  return reduce_rows(s, out);
}

Tensor MultiLatentAttention::forward(const BlockShape& s, const BlockParams& p, const Tensor& in,
                                     std::unique_ptr<SublayerActs>& acts, uint64_t seed) const {
  check_call(s);
  if (s.core && !s.core->trains()) return decode(s, p, in);
  const MlaSpec& m = spec_;
  const int64_t N = s.tokens(), NHl = m.local_heads(s.tp), dn = m.qk_nope, dr = m.qk_rope, dv = m.v_dim, Dqk = m.qk_dim();
  const int64_t kr = m.kv_lora_rank;
  auto a = std::make_unique<MlaActs>();
  a->in = in;
  const Tensor in_f = gather_rows(s, in);  // (N, C)
  // Queries: (N, NHl, Dqk).
  Tensor q;
  if (m.q_lora_rank > 0) {
    a->qa = linear(in_f, p[ParamRole::MlaQDownWeight]);
    a->qn = like(in, a->qa.shape());
    norm_forward(Normalization::RMSNorm, m.latent_norm.eps, {p[ParamRole::MlaQDownNormWeight], Var(), m.latent_norm.one_plus},
                 a->qa, a->qn, a->qa_norm);
    q = linear(a->qn, p[ParamRole::MlaQUpWeight]);
  } else {
    q = linear(in_f, p[ParamRole::MlaQWeight]);
  }
  a->q = q.view({N, NHl, Dqk});
  // The latent and the shared rope key: kva (N, kr + dr) = [c | k_pe].
  const Tensor kva = linear(in_f, p[ParamRole::MlaKvDownWeight]);
  a->c = kva.slice(1, 0, kr).contiguous();
  a->cn = like(in, a->c.shape());
  norm_forward(Normalization::RMSNorm, m.latent_norm.eps, {p[ParamRole::MlaKvDownNormWeight], Var(), m.latent_norm.one_plus},
               a->c, a->cn, a->c_norm);
  const Tensor kv = linear(a->cn, p[ParamRole::MlaKvUpWeight]).view({N, NHl, dn + dv});
  // Rope on q's rope dims and on the shared k_pe, then the heads' keys [k_nope | k_pe] and values.
  Tensor q_pe = a->q.slice(2, dn, Dqk).contiguous();
  rope_heads(s, q_pe, m.rope_args, false);
  a->q.slice(2, dn, Dqk).copy_from(q_pe);
  Tensor k_pe = kva.slice(1, kr, kr + dr).contiguous().view({N, 1, dr});
  rope_heads(s, k_pe, m.rope_args, false);
  a->k = like(in, {N, NHl, Dqk});
  a->k.slice(2, 0, dn).copy_from(kv.slice(2, 0, dn));
  for (int64_t h = 0; h < NHl; ++h) a->k.slice(1, h, h + 1).slice(2, dn, Dqk).copy_from(k_pe);
  a->v = kv.slice(2, dn, dn + dv).contiguous();
  a->att = like(in, {N, NHl * dv});
  a->lse = Tensor::empty({s.batch, NHl, s.seq}, DType::F32, in.device());
  AttentionBlock blk;
  blk.seq = s.seq;
  blk.causal = true;
  const auto v4 = [&](const Tensor& t, int64_t d) { return t.view({s.batch, s.seq, NHl, d}); };
  attention_block_forward(v4(a->q, Dqk), v4(a->k, Dqk), v4(a->v, dv), v4(a->att, dv), a->lse, m.scale, blk,
                          mla_dropout(s, m, seed));
  Tensor out = like(in, {N, s.hidden});
  linear_forward(a->att, p[ParamRole::ProjWeight], Var(), out);
  acts = std::move(a);
  return reduce_rows(s, out);
}

Tensor MultiLatentAttention::backward(const BlockShape& s, const BlockParams& p, const SublayerActs& acts,
                                      const Tensor& dout, uint64_t seed, WeightGradWork* defer) const {
  const MlaActs& a = static_cast<const MlaActs&>(acts);
  const MlaSpec& m = spec_;
  const int64_t N = s.tokens(), NHl = m.local_heads(s.tp), dn = m.qk_nope, dr = m.qk_rope, dv = m.v_dim, Dqk = m.qk_dim();
  const int64_t kr = m.kv_lora_rank;
  const Tensor dout_f = gather_rows(s, dout);  // (N, C)
  Tensor datt = like(dout, a.att.shape());
  linear_backward_input(dout_f, p[ParamRole::ProjWeight], datt);
  linear_backward_weight(dout_f, a.att, p[ParamRole::ProjWeight], Var(), defer);
  // Attention: dq, dk (N, NHl, Dqk), dv (N, NHl, dv).
  Tensor dq = like(dout, {N, NHl, Dqk}), dk = like(dout, {N, NHl, Dqk}), dvv = like(dout, {N, NHl, dv});
  AttentionBlock blk;
  blk.seq = s.seq;
  blk.causal = true;
  const auto v4 = [&](const Tensor& t, int64_t d) { return t.view({s.batch, s.seq, NHl, d}); };
  attention_block_backward(v4(datt, dv), v4(a.q, Dqk), v4(a.k, Dqk), v4(a.v, dv), v4(a.att, dv), a.lse, v4(dq, Dqk),
                           v4(dk, Dqk), v4(dvv, dv), m.scale, blk, mla_dropout(s, m, seed));
  // Rope's transpose on the query's rope dims.
  Tensor dq_pe = dq.slice(2, dn, Dqk).contiguous();
  rope_heads(s, dq_pe, m.rope_args, true);
  dq.slice(2, dn, Dqk).copy_from(dq_pe);
  // d(kv) = [dk_nope | dv] per head; d(k_pe) = Σ over every rank's heads, then rope's transpose.
  Tensor dkv = like(dout, {N, NHl, dn + dv});
  dkv.slice(2, 0, dn).copy_from(dk.slice(2, 0, dn));
  dkv.slice(2, dn, dn + dv).copy_from(dvv);
  Tensor dk_pe = Tensor::zeros({N, 1, dr}, DType::F32, dout.device());
  for (int64_t h = 0; h < NHl; ++h) {
    Tensor part = Tensor::empty({N, 1, dr}, DType::F32, dout.device());
    cast(dk.slice(1, h, h + 1).slice(2, dn, Dqk).contiguous(), part);
    add_forward(dk_pe, part, dk_pe);
  }
  tp_all_reduce(s.tp, dk_pe);
  Tensor dk_pe_c = like(dout, {N, 1, dr});
  cast(dk_pe, dk_pe_c);
  rope_heads(s, dk_pe_c, m.rope_args, true);
  // The latent: d(cn) (all-reduced: every rank's heads read it), the norm, d(kva) = [dc | dk_pe].
  const Tensor dkv2 = dkv.view({N, NHl * (dn + dv)});
  Tensor dcn = like(dout, {N, kr});
  linear_backward_input(dkv2, p[ParamRole::MlaKvUpWeight], dcn);
  linear_backward_weight(dkv2, a.cn, p[ParamRole::MlaKvUpWeight], Var(), defer);
  tp_all_reduce(s.tp, dcn);
  const NormParams cnorm{p[ParamRole::MlaKvDownNormWeight], Var(), m.latent_norm.one_plus};
  Tensor dkva = Tensor::zeros({N, kr + dr}, dout.dtype(), dout.device());
  Tensor dc = Tensor::zeros({N, kr}, dout.dtype(), dout.device());
  norm_backward_input(Normalization::RMSNorm, cnorm, a.c, a.c_norm, dcn, dc);
  dkva.slice(1, 0, kr).copy_from(dc);
  dkva.slice(1, kr, kr + dr).copy_from(dk_pe_c.view({N, dr}));
  const Tensor in_f = gather_rows(s, a.in);
  linear_backward_weight(dkva, in_f, p[ParamRole::MlaKvDownWeight], Var(), defer);
  Tensor din_f = Tensor::zeros({N, s.hidden}, dout.dtype(), dout.device());
  // The replicated down-projections' input gradient: the same on every TP rank, added once.
  if (s.tp.rank == 0) linear_backward_input(dkva, p[ParamRole::MlaKvDownWeight], din_f);
  std::vector<std::pair<NormParams, std::pair<Tensor, Tensor>>> norms{{cnorm, {a.c, dcn}}};
  std::vector<NormActs> norm_acts{a.c_norm};
  const Tensor dq2 = dq.view({N, NHl * Dqk});
  if (m.q_lora_rank > 0) {
    Tensor dqn = like(dout, {N, m.q_lora_rank});
    linear_backward_input(dq2, p[ParamRole::MlaQUpWeight], dqn);
    linear_backward_weight(dq2, a.qn, p[ParamRole::MlaQUpWeight], Var(), defer);
    tp_all_reduce(s.tp, dqn);
    const NormParams qnorm{p[ParamRole::MlaQDownNormWeight], Var(), m.latent_norm.one_plus};
    Tensor dqa = Tensor::zeros({N, m.q_lora_rank}, dout.dtype(), dout.device());
    norm_backward_input(Normalization::RMSNorm, qnorm, a.qa, a.qa_norm, dqn, dqa);
    linear_backward_weight(dqa, in_f, p[ParamRole::MlaQDownWeight], Var(), defer);
    if (s.tp.rank == 0) {
      Tensor t = like(dout, {N, s.hidden});
      linear_backward_input(dqa, p[ParamRole::MlaQDownWeight], t);
      add_forward(din_f, t, din_f);
    }
    norms.push_back({qnorm, {a.qa, dqn}});
    norm_acts.push_back(a.qa_norm);
  } else {
    Tensor t = like(dout, {N, s.hidden});
    linear_backward_input(dq2, p[ParamRole::MlaQWeight], t);  // column-parallel: this rank's heads' share
    add_forward(din_f, t, din_f);
    linear_backward_weight(dq2, in_f, p[ParamRole::MlaQWeight], Var(), defer);
  }
  // The latent norms' weights: full rows and all-reduced gradients, so equal on every TP rank.
  auto norm_weights = [norms, norm_acts] {
    for (size_t i = 0; i < norms.size(); ++i) {
      const auto& [np, xd] = norms[i];
      norm_backward_weight(Normalization::RMSNorm, np, xd.first, norm_acts[i], xd.second, np.w.grad_or_zeros(), Tensor());
    }
  };
  if (defer) defer->add(std::move(norm_weights));
  else norm_weights();
  return reduce_rows(s, din_f);
}

void MultiLatentAttention::memory(const BlockShape& s, BlockMemory& mem) const {
  // Saved: the latents (before and after their norms), q, k, v, att (N rows) and lse; the backward's
  // dq, dk, dv, d(kv), datt and the latents' gradients; the weight part's inputs and output gradients.
  const MlaSpec& m = spec_;
  const int64_t N = s.tokens(), NHl = m.local_heads(s.tp), Dqk = m.qk_dim(), dv = m.v_dim, dn = m.qk_nope;
  const int64_t lat = 2 * (m.q_lora_rank + m.kv_lora_rank) + m.qk_rope;
  mem.saved_act += N * (lat + 2 * NHl * Dqk + 2 * NHl * dv);
  mem.saved_f32 += s.batch * NHl * s.seq + 2 * N;
  mem.backward_act += N * (2 * NHl * Dqk + 2 * NHl * dv + NHl * (dn + dv) + lat + s.hidden);
  mem.deferred_act += N * (NHl * Dqk + NHl * (dn + dv) + NHl * dv + lat + 2 * s.hidden);
}

double MultiLatentAttention::attention_flops_per_token(int64_t seq) const {
  // Scores over Dqk and values over dv, causal (T/2 keys), × 3 with backward.
  return 6.0 * static_cast<double>(spec_.heads * (spec_.qk_dim() + spec_.v_dim)) * static_cast<double>(seq) / 2.0;
}

int64_t MultiLatentAttention::kv_elements_per_token(const TensorParallel&) const {
  return spec_.kv_lora_rank + spec_.qk_rope;
}

}  // namespace mpitron
