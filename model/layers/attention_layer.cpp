#include "model/layers/attention_layer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/block.h"
#include "model/layers/linear_grad.h"
#include "model/layers/norm.h"
#include "model/param_rows.h"
#include "tensor/ops.h"

namespace mpitron {

SelfAttention::SelfAttention(const AttentionSpec& spec, int64_t layer, int64_t hidden)
    : spec_(spec), layer_(layer), hidden_(hidden) {}

void SelfAttention::rows(std::vector<ParamSpec>& v) const {
  const int64_t C = hidden_, HD = spec_.head_dim, q = spec_.heads * HD, kv = spec_.groups * HD, l = layer_;
  const std::string p = str("layers.", l, ".attn.");
  const ParamPlace L = ParamPlace::Layer;
  const std::vector<int64_t> parts{q, kv, kv};
  v.push_back(matmul_row(tp_split(param_row(p + "qkv.weight", ParamRole::QkvWeight, {q + 2 * kv, C}, ParamInit::Normal, L, l), 0, parts)));
  if (spec_.qkv_bias)
    v.push_back(tp_split(param_row(p + "qkv.bias", ParamRole::QkvBias, {q + 2 * kv}, ParamInit::Zeros, L, l), 0, parts));
  if (spec_.qk_norm != QkNorm::None) {  // per head: (HD) replicated; full width: (NH·HD), (G·HD) split with the heads
    const ParamInit one = spec_.qk_norm_spec.one_plus ? ParamInit::Zeros : ParamInit::Ones;
    const bool full = spec_.qk_norm == QkNorm::FullWidth;
    for (const bool k : {false, true}) {
      ParamSpec r = param_row(p + (k ? "k_norm.weight" : "q_norm.weight"), k ? ParamRole::KNormWeight : ParamRole::QNormWeight,
                              {full ? (k ? kv : q) : HD}, one, L, l);
      v.push_back(full ? tp_split(r, 0) : r);
    }
  }
  v.push_back(matmul_row(tp_split(param_row(p + "proj.weight", ParamRole::ProjWeight, {C, q}, ParamInit::OutputNormal, L, l), 1)));
  if (spec_.proj_bias) v.push_back(param_row(p + "proj.bias", ParamRole::ProjBias, {C}, ParamInit::Zeros, L, l));
}

void SelfAttention::apply_rope(const BlockShape& s, const Tensor& qkv, bool inverse) const {
  if (!spec_.rope) return;
  const int64_t HD = spec_.head_dim, NHl = spec_.local_heads(s.tp), Gl = spec_.local_groups(s.tp);
  const int64_t H = NHl + 2 * Gl, rot = NHl + Gl;
  const std::vector<int64_t>* pos = attention_core(s).positions();
  const std::vector<int64_t>* lens = attention_core(s).rope_lengths();
  RopeArgs whole = spec_.rope_args;
  whole.scaling.dynamic_seq_len = s.global_seq();  // dynamic NTK: transformers' max position + 1
  auto run = [&](const Tensor& t, const RopeArgs& args) {
    if (inverse) rope_backward(t, t, rot, args);
    else rope_forward(t, t, rot, args);
  };
  if (!pos && s.cp.active()) {  // context parallelism: each sample's chunks at their global positions
    const int64_t row = H * HD;
    for (int64_t b = 0; b < s.batch; ++b)
      for (const ContextParallel::Run& r : s.cp.runs(s.global_seq())) {
        RopeArgs args = whole;
        args.position_offset = r.global;
        run(qkv.flat_range((b * s.seq + r.local) * row, r.len * row).view({1, r.len, H, HD}), args);
      }
    return;
  }
  if (!pos) {
    run(qkv.view({s.batch, s.seq, H, HD}), whole);
    return;
  }
  for (int64_t i = 0; i < qkv.dim(0); ++i) {  // decode: every row at its own position
    RopeArgs args = spec_.rope_args;
    args.position_offset = (*pos)[static_cast<size_t>(i)];
    args.scaling.dynamic_seq_len = lens ? (*lens)[static_cast<size_t>(i)] : args.position_offset + 1;
    run(qkv.slice(0, i, i + 1).view({1, 1, H, HD}), args);
  }
}

namespace {
// The q (or k) heads of a packed qkv (N, QL): a (N, heads, HD) view.
Tensor qk_heads(const Tensor& qkv, const AttentionSpec& a, const TensorParallel& tp, bool k) {
  const int64_t NHl = a.local_heads(tp), Gl = a.local_groups(tp);
  const Tensor t = qkv.view({qkv.dim(0), NHl + 2 * Gl, a.head_dim});
  return k ? t.slice(1, NHl, NHl + Gl) : t.slice(1, 0, NHl);
}
}  // namespace

// QK-norm on the q and k heads of a->qkv, in place (tensor/head_norm.h): per head, or over the whole
// (TP-split) width with the sums of squares all-reduced over the tensor-parallel group.
void SelfAttention::qk_norm_forward(const BlockShape& s, const BlockParams& p, AttentionActs& a) const {
  const bool full = spec_.qk_norm == QkNorm::FullWidth;
  const int64_t N = a.qkv.dim(0);
  a.qkv_raw = a.qkv.clone();
  for (const bool k : {false, true}) {
    const Tensor x = qk_heads(a.qkv, spec_, s.tp, k);
    const int64_t H = x.dim(1), count = full ? (k ? spec_.groups : spec_.heads) * spec_.head_dim : spec_.head_dim;
    const Tensor ss = Tensor::empty({N, full ? 1 : H}, DType::F32, x.device());
    head_norm_sumsq(x, ss);
    if (full) tp_all_reduce(s.tp, ss);
    Tensor& rstd = k ? a.k_rstd : a.q_rstd;
    rstd = Tensor::empty(ss.shape(), DType::F32, x.device());
    const NormParams np{p[k ? ParamRole::KNormWeight : ParamRole::QNormWeight], Var(), spec_.qk_norm_spec.one_plus};
    head_norm_forward(x, ss, count, spec_.qk_norm_spec.eps, norm_scale(np), x, rstd);
  }
}

// dqkv's q and k heads from d(normalised) to d(raw), in place; the weights' gradients to the weight part
// (per head, the replicated weight's partial sums over this rank's heads are all-reduced there).
void SelfAttention::qk_norm_backward(const BlockShape& s, const BlockParams& p, const AttentionActs& a,
                                     const Tensor& dqkv, WeightGradWork* defer) const {
  const bool full = spec_.qk_norm == QkNorm::FullWidth;
  const int64_t N = dqkv.dim(0);
  for (const bool k : {false, true}) {
    const Tensor dx = qk_heads(dqkv, spec_, s.tp, k), x = qk_heads(a.qkv_raw, spec_, s.tp, k);
    const Tensor& rstd = k ? a.k_rstd : a.q_rstd;
    const int64_t count = full ? (k ? spec_.groups : spec_.heads) * spec_.head_dim : spec_.head_dim;
    const Var w = p[k ? ParamRole::KNormWeight : ParamRole::QNormWeight];
    const Tensor scale = norm_scale({w, Var(), spec_.qk_norm_spec.one_plus});
    const Tensor dot = Tensor::empty(rstd.shape(), DType::F32, dx.device());
    head_norm_backward_dot(dx, x, scale, rstd, dot);
    if (full) tp_all_reduce(s.tp, dot);
    const Tensor dw = Tensor::zeros(w.value().shape(), DType::F32, dx.device());
    head_norm_backward(dx, x, scale, rstd, dot, count, dx, dw);
    auto work = [dw, w, tp = s.tp, full] {
      if (!full) tp_all_reduce(tp, dw);  // the heads of every rank share the weight
      axpby(1.0f, dw, 1.0f, w.grad_or_zeros());
    };
    if (defer) defer->add(std::move(work));
    else work();
  }
  (void)N;
}

Tensor SelfAttention::forward(const BlockShape& s, const BlockParams& p, const Tensor& in,
                              std::unique_ptr<SublayerActs>& acts, uint64_t seed) const {
  const int64_t N = s.tokens(), C = s.hidden, NHl = spec_.local_heads(s.tp), HD = spec_.head_dim;
  auto a = std::make_unique<AttentionActs>();
  const AttentionCore& core = attention_core(s);
  a->in = in;
  const Tensor in_f = gather_rows(s, in);  // (N, C)
  a->qkv = Tensor::empty({N, spec_.local_qkv(s.tp)}, in.dtype(), in.device());
  linear_forward(in_f, p[ParamRole::QkvWeight], p[ParamRole::QkvBias], a->qkv);
  if (spec_.qk_norm != QkNorm::None) qk_norm_forward(s, p, *a);
  apply_rope(s, a->qkv, false);
  a->att = Tensor::empty({N, NHl * HD}, in.dtype(), in.device());
  a->lse = core.trains() ? Tensor::empty({s.batch, NHl, s.seq}, DType::F32, in.device()) : Tensor();
  core.forward(s, spec_, a->qkv, a->att, a->lse, seed);
  Tensor out = Tensor::empty({N, C}, in.dtype(), in.device());
  // row-parallel bias: added once
  linear_forward(a->att, p[ParamRole::ProjWeight], s.tp.rank == 0 ? p[ParamRole::ProjBias] : Var(), out);
  acts = std::move(a);
  return reduce_rows(s, out);
}

Tensor SelfAttention::backward(const BlockShape& s, const BlockParams& p, const SublayerActs& acts,
                               const Tensor& dout, uint64_t seed, WeightGradWork* defer) const {
  const AttentionActs& a = static_cast<const AttentionActs&>(acts);
  const int64_t N = s.tokens(), C = s.hidden;
  const Tensor dout_f = gather_rows(s, dout);  // (N, C): the full output gradient on every rank
  Tensor datt = Tensor::empty(a.att.shape(), dout.dtype(), dout.device());
  linear_backward_input(dout_f, p[ParamRole::ProjWeight], datt);
  linear_backward_weight(dout_f, a.att, p[ParamRole::ProjWeight], p[ParamRole::ProjBias], defer);
  Tensor dqkv = Tensor::empty(a.qkv.shape(), dout.dtype(), dout.device());
  attention_core(s).backward(s, spec_, datt, a.qkv, a.att, a.lse, dqkv, seed);
  apply_rope(s, dqkv, true);  // rope is a rotation: its transpose is the inverse
  if (spec_.qk_norm != QkNorm::None) qk_norm_backward(s, p, a, dqkv, defer);
  Tensor din_f = Tensor::empty({N, C}, dout.dtype(), dout.device());
  linear_backward_input(dqkv, p[ParamRole::QkvWeight], din_f);
  linear_backward_weight(dqkv, gather_rows(s, a.in), p[ParamRole::QkvWeight], p[ParamRole::QkvBias], defer);
  return reduce_rows(s, din_f);
}

void SelfAttention::memory(const BlockShape& s, BlockMemory& m) const {
  // qkv and att saved, with lse (f32); the backward's datt (N, Cl) and dqkv (N, QL); the weight part's
  // output gradients of the two linears.
  const int64_t N = s.tokens(), QL = spec_.local_qkv(s.tp), Cl = spec_.local_att(s.tp);
  m.saved_act += N * (QL + Cl);
  m.saved_f32 += s.batch * spec_.local_heads(s.tp) * s.seq;
  if (spec_.qk_norm != QkNorm::None) {  // the qkv before QK-norm and its statistics
    m.saved_act += N * QL;
    m.saved_f32 += N * (spec_.local_heads(s.tp) + spec_.local_groups(s.tp));
  }
  m.backward_act += N * (Cl + QL);
  m.deferred_act += N * Cl + N * QL;
}

double attended_keys(AttentionMaskKind mask, int64_t window, int64_t seq) {
  const double T = static_cast<double>(seq);
  if (mask == AttentionMaskKind::Padding) return T;
  if (mask != AttentionMaskKind::SlidingWindow || window <= 0) return T / 2;
  // Query i sees min(i, W) + 1 keys: Σ_i = (m + 1)(m + 2)/2 + (T − 1 − m)(W + 1), m = min(W, T − 1);
  // the mean less one half (T/2 again when W >= T − 1).
  const double W = static_cast<double>(window), m = std::min(W, T - 1);
  return ((m + 1) * (m + 2) / 2 + (T - 1 - m) * (W + 1)) / T - 0.5;
}

double SelfAttention::attention_flops_per_token(int64_t seq) const {
  // Scores and values: 2 matmuls of 2 FLOPs per (query, key, channel), × 3 with backward.
  return 12.0 * static_cast<double>(spec_.heads * spec_.head_dim) * attended_keys(spec_.mask, spec_.window, seq);
}

int64_t SelfAttention::kv_elements_per_token(const TensorParallel& tp) const {
  return 2 * spec_.local_groups(tp) * spec_.head_dim;
}

}  // namespace mpitron
