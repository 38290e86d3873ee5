#include "model/layers/moe_layer.h"

#include <cmath>

#include "model/block.h"
#include "model/param_rows.h"

#include "tensor/grouped_gemm.h"
#include "tensor/moe_router.h"
#include "tensor/ops.h"

namespace mpitron {

namespace {

Tensor like(const Tensor& x, const Shape& shape, DType dt) { return Tensor::empty(shape, dt, x.device()); }

// t in f32 (itself when it is already).
Tensor as_f32(const Tensor& t) {
  if (t.dtype() == DType::F32) return t;
  Tensor o = like(t, t.shape(), DType::F32);
  cast(t, o);
  return o;
}

std::vector<Tensor> values(const std::vector<Var>& v) {
  std::vector<Tensor> t;
  for (const Var& x : v) t.push_back(x.value());
  return t;
}
std::vector<Tensor> grads(const std::vector<Var>& v) {
  std::vector<Tensor> t;
  for (const Var& x : v) t.push_back(x.grad_or_zeros());
  return t;
}

MoeRouterArgs router_args(const MoeShape& m, const MoeParams& p) {
  MoeRouterArgs r;
  r.score = m.score;
  r.pre_softmax = m.pre_softmax;
  r.topk = m.topk;
  r.scaling = m.scaling;
  r.num_groups = m.num_groups, r.group_topk = m.group_topk, r.group_score_topk = m.group_score_topk;
  r.expert_bias = p.expert_bias;
  return r;
}

// The shared experts run the dense MLP core on the gathered rows (no second gather).
BlockShape shared_shape(const BlockShape& s) {
  BlockShape t = s;
  t.tp.sequence_parallel = false;
  return t;
}
MlpParams shared_params(const MoeParams& p) { return {p.shared_fc, Var(), p.shared_proj, Var()}; }

// logits (N, R) f32 = x32 (N, C) · wᵀ, w (R, C) in f32 (the router and the shared gate run in f32).
Tensor linear_f32(const Tensor& x32, const Var& w) {
  Tensor out = like(x32, {x32.dim(0), w.value().dim(0)}, DType::F32);
  gemm(x32, as_f32(w.value()), out, GemmArgs{false, true, 1.0f, 0.0f});
  return out;
}

// The backward of linear_f32 given dlogits (N, R) f32: din_f (N, C) += dlogits · w on TP rank 0
// (every TP rank computes the same full dlogits; the layer's reduce sums the ranks), and the
// weight part dw += dlogitsᵀ · x32, to defer.
void linear_f32_backward(const BlockShape& s, const Tensor& dlogits, const Tensor& x32, const Var& w,
                         const Tensor& din_f, WeightGradWork* defer) {
  if (s.tp.rank == 0) {
    if (din_f.dtype() == DType::F32) {
      gemm(dlogits, as_f32(w.value()), din_f, GemmArgs{false, false, 1.0f, 1.0f});
    } else {
      Tensor d32 = like(din_f, din_f.shape(), DType::F32), d = like(din_f, din_f.shape(), din_f.dtype());
      gemm(dlogits, as_f32(w.value()), d32, GemmArgs{false, false, 1.0f, 0.0f});
      cast(d32, d);
      add_forward(din_f, d, din_f);
    }
  }
  auto work = [dlogits, x32, w] { gemm(dlogits, x32, w.grad_or_zeros(), GemmArgs{true, false, 1.0f, 1.0f}); };
  if (defer) defer->add(std::move(work));
  else work();
}


// The identity routing of N tokens with one choice each: the shared gate's weighting is an
// unpermute of the shared output by the gate values.
Tensor identity_dest(int64_t N, Device dev) {
  std::vector<int64_t> d(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) d[static_cast<size_t>(i)] = i;
  return Tensor::from_ints(d, {N}, DType::I32).to(dev);
}

}  // namespace

MoeParams MoeParams::from(const BlockParams& b) {
  return MoeParams{b[ParamRole::RouterWeight], b.all(ParamRole::ExpertFcWeight), b.all(ParamRole::ExpertFcBias),
                   b.all(ParamRole::ExpertProjWeight), b.all(ParamRole::ExpertProjBias),
                   b[ParamRole::SharedFcWeight], b[ParamRole::SharedProjWeight], b[ParamRole::SharedGateWeight],
                   b.expert_bias};
}

Tensor MoeMlp::forward(const BlockShape& s, const BlockParams& bp, const Tensor& in, std::unique_ptr<SublayerActs>& acts,
                       uint64_t) const {
  const MoeShape& m = m_;
  const MoeParams p = MoeParams::from(bp);
  const int64_t C = s.hidden, E = m.experts, k = m.topk;
  auto owned = std::make_unique<MoeActs>();
  MoeActs& a = *owned;
  a.in = in;
  const Tensor in_f = gather_rows(s, in);  // (N, C)
  const int64_t N = in_f.dim(0);
  // Router: logits in f32, then scores, top-k, probabilities.
  const Tensor x32 = as_f32(in_f);
  a.logits = linear_f32(x32, p.router);
  const MoeRun* run = s.moe.run;
  const bool stats = run && run->stats && s.moe.record;
  const bool aux = run && run->aux_loss_coeff > 0, z = run && run->z_loss_coeff > 0;
  a.probs = like(in, {N, k}, DType::F32);
  a.indices = like(in, {N, k}, DType::I32);
  const Tensor aux_sums = aux || stats ? like(in, {E}, DType::F32) : Tensor();
  a.lse = z || stats ? like(in, {N}, DType::F32) : Tensor();
  moe_router_forward(a.logits, router_args(m, p), a.probs, a.indices, aux_sums, a.lse);
  if (!z) a.lse = Tensor();
  // Tokens grouped by expert; capacity (Megatron's get_capacity: ⌈N·k / E · factor⌉) drops choices.
  const int64_t capacity =
      run && run->capacity_factor > 0
          ? static_cast<int64_t>(std::ceil(static_cast<double>(N * k) / static_cast<double>(E) * run->capacity_factor))
          : 0;
  const MoeRouting r = moe_routing(a.indices, E, capacity, run && run->drop_by_probs ? a.probs : Tensor());
  a.counts = r.counts;
  const int64_t R = r.rows();
  std::vector<int64_t> dest(r.dest.begin(), r.dest.end());
  a.dest = Tensor::from_ints(dest, {N * k}, DType::I32).to(in.device());
  // The load-balancing loss's weights: coeff · E / (N² · k) · count_e.
  const double norm = static_cast<double>(E) / (static_cast<double>(N) * static_cast<double>(N) * static_cast<double>(k));
  if (aux) {
    std::vector<float> w(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e)
      w[static_cast<size_t>(e)] = static_cast<float>(run->aux_loss_coeff * norm * static_cast<double>(r.chosen[static_cast<size_t>(e)]));
    a.aux_weight = Tensor::from_vector(w, {E}, DType::F32).to(in.device());
  }
  if (stats) {
    MoeStats& st = *run->stats;
    const Tensor sums = aux_sums.to(Device::cpu()), lse = a.lse.defined() ? a.lse.to(Device::cpu()) : Tensor();
    double al = 0;
    for (int64_t e = 0; e < E; ++e) al += static_cast<double>(sums.data<float>()[e]) * static_cast<double>(r.chosen[static_cast<size_t>(e)]);
    st.aux_loss += run->aux_loss_coeff * norm * al;
    if (lse.defined()) {
      double zl = 0;
      for (int64_t n = 0; n < N; ++n) zl += static_cast<double>(lse.data<float>()[n]) * lse.data<float>()[n];
      st.z_loss += run->z_loss_coeff * zl / static_cast<double>(N);
    }
    ++st.layers;
    if (st.tokens_per_expert.size() != static_cast<size_t>(E)) st.tokens_per_expert.assign(static_cast<size_t>(E), 0);
    for (int64_t e = 0; e < E; ++e) st.tokens_per_expert[static_cast<size_t>(e)] += r.chosen[static_cast<size_t>(e)];
    st.dropped += N * k - R;
    if (run->expert_bias_update_rate > 0) {
      std::vector<int64_t>& t = st.layer_tokens[s.moe.layer];
      t.resize(static_cast<size_t>(E), 0);
      for (int64_t e = 0; e < E; ++e) t[static_cast<size_t>(e)] += r.chosen[static_cast<size_t>(e)];
    }
  }
  // The experts: permute, (under EP: to the experts' ranks), grouped fc, activation, grouped proj,
  // (back), unpermute with the probabilities.
  Tensor xp = like(in, {R, C}, in.dtype());
  moe_permute(in_f, a.dest, xp);
  if (s.moe.ep.active()) {
    a.exchange = std::make_shared<const ExpertExchange>(s.moe.ep, r.counts, in.device());
    a.xe = a.exchange->to_experts(xp);
    a.counts = a.exchange->local_counts();
  } else {
    a.xe = xp;
  }
  const int64_t Re = a.xe.dim(0);
  const MlpSpec ex = expert_spec();
  a.fc = like(in, {Re, ex.local_fc(s.tp)}, in.dtype());
  grouped_gemm(a.xe, values(p.fc_w), a.counts, a.fc, values(p.fc_b));
  a.g = like(in, {Re, ex.local_ffn(s.tp)}, in.dtype());
  activation_forward(ex.kind, a.fc, a.g);
  Tensor ye = like(in, {Re, C}, in.dtype());
  grouped_gemm(a.g, values(p.proj_w), a.counts, ye, s.tp.rank == 0 ? values(p.proj_b) : std::vector<Tensor>{});
  a.yp = a.exchange ? a.exchange->from_experts(ye) : ye;
  Tensor out = like(in, {N, C}, in.dtype());
  moe_unpermute(a.yp, a.dest, a.probs, out);
  // Shared experts: a dense MLP of width Fs on every token, optionally gated by sigmoid(in_f · wgᵀ).
  if (p.shared_fc.defined()) {
    a.shared_out = mlp_core_forward(shared_shape(s), shared_spec(), shared_params(p), in_f, a.shared);
    Tensor shared = a.shared_out;
    if (p.shared_gate.defined()) {
      a.gate_logits = linear_f32(x32, p.shared_gate);  // (N, 1)
      a.gate = like(in, {N, 1}, DType::F32);
      MoeRouterArgs g;
      g.score = MoeScore::Sigmoid;
      g.topk = 1;
      const Tensor one = like(in, {N, 1}, DType::I32);
      moe_router_forward(a.gate_logits, g, a.gate, one, Tensor(), Tensor());  // one expert: gate = sigmoid(logit)
      shared = like(in, {N, C}, in.dtype());
      a.gate_dest = identity_dest(N, in.device());
      moe_unpermute(a.shared_out, a.gate_dest, a.gate, shared);
    }
    add_forward(out, shared, out);
  }
  acts = std::move(owned);
  return reduce_rows(s, out);
}

Tensor MoeMlp::backward(const BlockShape& s, const BlockParams& bp, const SublayerActs& acts, const Tensor& dout,
                        uint64_t, WeightGradWork* defer) const {
  const MoeShape& m = m_;
  const MoeParams p = MoeParams::from(bp);
  const MoeActs& a = static_cast<const MoeActs&>(acts);
  const int64_t C = s.hidden, k = m.topk;
  const Tensor dout_f = gather_rows(s, dout);  // (N, C)
  const int64_t N = dout_f.dim(0), R = a.yp.dim(0), Re = a.xe.dim(0);
  const Tensor in_f = gather_rows(s, a.in);
  const Tensor x32 = as_f32(in_f);
  // Unpermute: d(yp) and d(probs); the probabilities' gradient sums the TP ranks' partial outputs.
  Tensor dyp = like(dout, {R, C}, dout.dtype()), dprobs = like(dout, {N, k}, DType::F32);
  moe_unpermute_backward(dout_f, a.yp, a.dest, a.probs, dyp, dprobs);
  tp_all_reduce(s.tp, dprobs);
  // The experts (on their ranks under EP: from_experts' backward is to_experts), input part now,
  // weight part to defer.
  if (a.exchange) dyp = a.exchange->to_experts(dyp);
  const MlpSpec ex = expert_spec();
  Tensor dg = like(dout, {Re, ex.local_ffn(s.tp)}, dout.dtype());
  grouped_gemm_backward(dyp, a.g, values(p.proj_w), a.counts, dg, {}, {});
  // The row-parallel biases' gradient (Σ dyp) on every TP rank, as the dense MLP's: the replicas stay equal.
  auto proj_weights = [dyp, g = a.g, w = p.proj_w, counts = a.counts, b = p.proj_b] {
    grouped_gemm_backward(dyp, g, values(w), counts, Tensor(), grads(w), grads(b));
  };
  const Tensor dfc = activation_backward(ex.kind, dg, a.fc);
  Tensor dxe = like(dout, {Re, C}, dout.dtype());
  grouped_gemm_backward(dfc, a.xe, values(p.fc_w), a.counts, dxe, {}, {});
  auto fc_weights = [dfc, xp = a.xe, w = p.fc_w, counts = a.counts, b = p.fc_b] {
    grouped_gemm_backward(dfc, xp, values(w), counts, Tensor(), grads(w), grads(b));
  };
  if (defer) {
    defer->add(std::move(proj_weights));
    defer->add(std::move(fc_weights));
  } else {
    proj_weights();
    fc_weights();
  }
  const Tensor dxp = a.exchange ? a.exchange->from_experts(dxe) : dxe;  // (R, C)
  Tensor din_f = like(dout, {N, C}, dout.dtype());
  moe_permute_backward(dxp, a.dest, din_f);
  // The router: the probabilities' gradient, plus the auxiliary losses' at the main loss's scale.
  const MoeRun* run = s.moe.run;
  const float ls = run ? run->loss_scale : 1.0f;
  Tensor aux_w;
  if (a.aux_weight.defined()) {
    aux_w = like(dout, a.aux_weight.shape(), DType::F32);
    aux_w.copy_from(a.aux_weight);
    scale(aux_w, ls);
  }
  const float z_w = a.lse.defined() ? static_cast<float>(run->z_loss_coeff * ls / static_cast<double>(N)) : 0.0f;
  Tensor dlogits = like(dout, a.logits.shape(), DType::F32);
  moe_router_backward(dprobs, a.logits, a.indices, router_args(m, p), aux_w, z_w, dlogits);
  linear_f32_backward(s, dlogits, x32, p.router, din_f, defer);
  // Shared experts (and their gate).
  if (p.shared_fc.defined()) {
    Tensor dshared = dout_f;
    if (p.shared_gate.defined()) {
      dshared = like(dout, {N, C}, dout.dtype());
      Tensor dgate = like(dout, {N, 1}, DType::F32);
      moe_unpermute_backward(dout_f, a.shared_out, a.gate_dest, a.gate, dshared, dgate);
      tp_all_reduce(s.tp, dgate);
      MoeRouterArgs g;
      g.score = MoeScore::Sigmoid;
      g.topk = 1;
      const Tensor one = Tensor::zeros({N, 1}, DType::I32, dout.device());
      Tensor dgl = like(dout, {N, 1}, DType::F32);
      moe_router_backward(dgate, a.gate_logits, one, g, Tensor(), 0.0f, dgl);
      linear_f32_backward(s, dgl, x32, p.shared_gate, din_f, defer);
    }
    const Tensor dsh = mlp_core_backward(shared_shape(s), shared_spec(), shared_params(p), a.shared, in_f, dshared, defer);
    add_forward(din_f, dsh, din_f);
  }
  return reduce_rows(s, din_f);
}

// The router, the routed experts kind by kind (each kind's E rows consecutive: the grouped GEMM's
// operands), the shared experts and their gate.
void MoeMlp::rows(std::vector<ParamSpec>& v) const {
  const int64_t C = hidden_, E = m_.experts, Fe = m_.ffn, Fs = m_.shared_ffn, l = layer_;
  const bool gated = mlp_gated(mlp_.kind), bias = mlp_.bias;
  const int64_t FCe = gated ? 2 * Fe : Fe, FCs = gated ? 2 * Fs : Fs;
  const std::vector<int64_t> fc_parts = gated ? std::vector<int64_t>{Fe, Fe} : std::vector<int64_t>{};
  const std::string p = str("layers.", l, ".mlp.");
  using R = ParamRole;
  using I = ParamInit;
  const ParamPlace L = ParamPlace::Layer;
  v.push_back(matmul_row(param_row(p + "router.weight", R::RouterWeight, {E, C}, I::Normal, L, l)));
  for (int64_t e = 0; e < E; ++e)
    v.push_back(expert_row(matmul_row(tp_split(param_row(str(p, "experts.", e, ".fc.weight"), R::ExpertFcWeight, {FCe, C},
                                                         I::Normal, L, l), 0, fc_parts)), e));
  if (bias)
    for (int64_t e = 0; e < E; ++e)
      v.push_back(expert_row(tp_split(param_row(str(p, "experts.", e, ".fc.bias"), R::ExpertFcBias, {FCe}, I::Zeros, L, l),
                                      0, fc_parts), e));
  for (int64_t e = 0; e < E; ++e)
    v.push_back(expert_row(matmul_row(tp_split(param_row(str(p, "experts.", e, ".proj.weight"), R::ExpertProjWeight,
                                                         {C, Fe}, I::OutputNormal, L, l), 1)), e));
  if (bias)
    for (int64_t e = 0; e < E; ++e)
      v.push_back(expert_row(param_row(str(p, "experts.", e, ".proj.bias"), R::ExpertProjBias, {C}, I::Zeros, L, l), e));
  if (Fs > 0) {
    const std::vector<int64_t> sparts = gated ? std::vector<int64_t>{Fs, Fs} : std::vector<int64_t>{};
    v.push_back(matmul_row(tp_split(param_row(p + "shared.fc.weight", R::SharedFcWeight, {FCs, C}, I::Normal, L, l), 0, sparts)));
    v.push_back(matmul_row(tp_split(param_row(p + "shared.proj.weight", R::SharedProjWeight, {C, Fs}, I::OutputNormal, L, l), 1)));
    if (m_.shared_gate) v.push_back(matmul_row(param_row(p + "shared.gate.weight", R::SharedGateWeight, {1, C}, I::Normal, L, l)));
  }
}

void MoeMlp::memory(const BlockShape& s, BlockMemory& mem) const {
  // R ≤ N·k rows (dropless: N·k), the router's logits (N, E), probabilities and choices (N, k) in f32,
  // xp, fc, g and yp per row; the shared experts' fc and g (N, FCsl + Fsl). Its backward holds d(yp),
  // d(g), d(fc) (gated), d(xp) and d(logits).
  const int64_t N = s.tokens(), C = s.hidden, R = N * m_.topk, E = m_.experts, k = m_.topk;
  const MlpSpec ex = expert_spec(), sh = shared_spec();
  const int64_t FCel = ex.local_fc(s.tp), Fel = ex.local_ffn(s.tp), Fsl = sh.local_ffn(s.tp), FCsl = sh.local_fc(s.tp);
  const bool gated = mlp_gated(mlp_.kind);
  mem.saved_act += R * (2 * C + FCel + Fel) + N * (FCsl + Fsl);
  mem.saved_f32 += N * (E + 3 * k) + (m_.shared_gate ? 2 * N : 0);
  mem.backward_act += R * (2 * C + Fel + (gated ? FCel : 0)) + N * (Fsl + FCsl) + 2 * N * E;
  mem.deferred_act += R * (2 * C + Fel + FCel) + N * (E + C) + N * (FCsl + Fsl);
}

}  // namespace mpitron
