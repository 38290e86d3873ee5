#include "model/block.h"

#include "tensor/ops.h"

namespace mpitron {

BlockShape block_shape(const GPTConfig& c, int64_t batch, int64_t seq, const TensorParallel& tp, bool train,
                       int64_t layer, const ContextParallel& cp) {
  BlockShape s{batch, seq, c.hidden_size, c.num_attention_heads, c.ffn(), train ? c.hidden_dropout : 0.0f,
               c.layernorm_epsilon, tp, train ? c.attention_dropout : 0.0f};
  s.cp = cp;
  // Attention dropout: layer l's Philox blocks [l·⌈T²/4⌉, (l+1)·⌈T²/4⌉) of each (batch, head) (T: the whole sequence).
  const int64_t T = s.global_seq();
  s.attention_offset = static_cast<uint64_t>(layer) * static_cast<uint64_t>((T * T + 3) / 4);
  s.groups = c.query_groups();
  s.kv_channels = c.kv_channels;
  s.norm = c.normalization;
  s.mlp = c.mlp;
  s.rope = c.position_embedding == PositionEmbedding::Rope;
  s.rope_args.base = c.rotary_base;
  s.rope_args.percent = c.rotary_percent;
  s.mask = c.attention_mask(layer);
  s.window = c.window_size;
  s.post_ln = c.post_ln;
  if (c.is_decoder_layer(layer)) s.cross.seq = c.seq_length;  // T5: the encoder's length (the memory's rows)
  if (c.is_moe_layer(layer)) {
    s.moe.experts = c.num_experts;
    s.moe.topk = c.moe_router_topk;
    s.moe.ffn = c.moe_ffn();
    s.moe.shared_ffn = c.moe_shared_expert_intermediate_size;
    s.moe.shared_gate = c.moe_shared_expert_gate;
    s.moe.score = c.moe_router_score_function;
    s.moe.pre_softmax = c.moe_router_pre_softmax;
    s.moe.scaling = c.moe_router_topk_scaling_factor;
  }
  return s;
}

BlockParams BlockParams::from(const ParamSet& ps, const GPTConfig& cfg, int64_t layer) {
  BlockParams p;
  for (const ParamSpec& spec : block_param_table(cfg, layer))  // (under EP, only this rank's experts)
    if (spec.expert < 0 || ps.has(spec.name)) p.rows.push_back({spec.role, ps.var(spec.name)});
  p.norm_1p = cfg.layernorm_1p;
  return p;
}

const Var& BlockParams::operator[](ParamRole r) const {
  static const Var none;
  for (const auto& [role, v] : rows)
    if (role == r) return v;
  return none;
}

std::vector<Var> BlockParams::all(ParamRole r) const {
  std::vector<Var> v;
  for (const auto& [role, var] : rows)
    if (role == r) v.push_back(var);
  return v;
}

std::vector<RowRun> activation_row_runs(int64_t batch, int64_t seq, const TensorParallel& tp,
                                        const ContextParallel& cp) {
  const int64_t n = batch * seq, first = tp.first_row(n), rows = tp.local_rows(n);
  if (!cp.active()) return {{0, first, rows}};
  const int64_t T = seq * cp.size;
  std::vector<RowRun> v;
  for (int64_t b = 0; b < batch; ++b)
    for (const ContextParallel::Run& r : cp.runs(T)) {
      // local rows [b·seq + r.local, + r.len) are global rows [b·T + r.global, + r.len); keep this TP rank's part
      const int64_t lo = std::max(b * seq + r.local, first), hi = std::min(b * seq + r.local + r.len, first + rows);
      if (lo < hi) v.push_back({lo - first, b * T + r.global + (lo - b * seq - r.local), hi - lo});
    }
  return v;
}
std::vector<RowRun> activation_row_runs(const BlockShape& s) { return activation_row_runs(s.batch, s.seq, s.tp, s.cp); }

namespace {
Tensor like(const Tensor& x, const Shape& shape) { return Tensor::empty(shape, x.dtype(), x.device()); }

// The (N, C) masks of a block are named by the single-process element index: Philox
// offsets count blocks of 4 numbers (core/philox.h), so global row g starts block
// g·C/4 (C % 4 == 0 whenever the rows are split). mlp_offset: the MLP mask follows
// the attention one's B·T·C elements.
uint64_t mlp_offset(const BlockShape& s) { return static_cast<uint64_t>(s.global_tokens() * s.hidden); }
// In place on this rank's rows (Nl, C), run by run.
void drop_rows(const BlockShape& s, const Tensor& t, uint64_t seed, uint64_t base) {
  for (const RowRun& r : activation_row_runs(s))
    dropout_forward(t.slice(0, r.local, r.local + r.len), t.slice(0, r.local, r.local + r.len), s.dropout, seed,
                    base + static_cast<uint64_t>(r.global * s.hidden / 4));
}
void drop_rows_backward(const BlockShape& s, const Tensor& dy, const Tensor& dx, uint64_t seed, uint64_t base) {
  for (const RowRun& r : activation_row_runs(s))
    dropout_backward(dy.slice(0, r.local, r.local + r.len), dx.slice(0, r.local, r.local + r.len), s.dropout, seed,
                     base + static_cast<uint64_t>(r.global * s.hidden / 4));
}
}  // namespace

namespace {
// Post-LN (the original BERT): x2 = norm1(x + drop(attention(x))), y = norm2(x2 + drop(mlp(x2))).
void post_ln_forward(const BlockShape& s, const BlockParams& p, const Tensor& x, const Tensor& y, BlockActs& a,
                     uint64_t seed, uint64_t offset, const AttentionCore* core) {
  const int64_t Nl = s.local_rows(), C = s.hidden;
  Tensor att = attention_layer_forward(s, p.attn(), x, a.attn, seed, core);  // (Nl, C)
  if (s.dropout > 0) drop_rows(s, att, seed, offset);
  a.r1 = like(x, {Nl, C});
  add_forward(x, att, a.r1);
  a.x2 = like(x, {Nl, C});
  norm_forward(s.norm, s.eps, p.norm1(), a.r1, a.x2, a.n1);
  Tensor mlp = mlp_layer_forward(s, p.mlp(), a.x2, a.mlp);  // (Nl, C)
  if (s.dropout > 0) drop_rows(s, mlp, seed, offset + mlp_offset(s));
  a.r2 = like(x, {Nl, C});
  add_forward(a.x2, mlp, a.r2);
  norm_forward(s.norm, s.eps, p.norm2(), a.r2, y, a.n2);
}
}  // namespace

void block_forward(const BlockShape& s, const BlockParams& p, const Tensor& x, const Tensor& y, BlockActs& a,
                   uint64_t seed, uint64_t offset, const AttentionCore* core) {
  if (s.post_ln) return post_ln_forward(s, p, x, y, a, seed, offset, core);
  const int64_t Nl = s.local_rows(), C = s.hidden;
  Tensor h1 = like(x, {Nl, C});
  norm_forward(s.norm, s.eps, p.norm1(), x, h1, a.n1);
  Tensor att = attention_layer_forward(s, p.attn(), h1, a.attn, seed, core);  // (Nl, C)
  if (s.dropout > 0) drop_rows(s, att, seed, offset);
  a.x2 = like(x, {Nl, C});
  add_forward(x, att, a.x2);
  Tensor mid = a.x2;  // the MLP's residual input: x3 in a decoder block with cross-attention, else x2
  if (s.cross.active()) {
    Tensor h3 = like(x, {Nl, C});
    norm_forward(s.norm, s.eps, p.norm3(), a.x2, h3, a.n3);
    Tensor xatt = cross_attention_forward(s, p.cross(), h3, a.xattn, seed);  // (Nl, C)
    if (s.dropout > 0) drop_rows(s, xatt, seed, offset + 2 * mlp_offset(s));
    a.x3 = like(x, {Nl, C});
    add_forward(a.x2, xatt, a.x3);
    mid = a.x3;
  }
  Tensor h2 = like(x, {Nl, C});
  norm_forward(s.norm, s.eps, p.norm2(), mid, h2, a.n2);
  Tensor mlp = mlp_layer_forward(s, p.mlp(), h2, a.mlp);  // (Nl, C)
  if (s.dropout > 0) drop_rows(s, mlp, seed, offset + mlp_offset(s));
  add_forward(mid, mlp, y);
}

void block_backward_input(const BlockShape& s, const BlockParams& p, const Tensor& x, const Tensor& dy,
                          const Tensor& dx, const BlockActs& a, uint64_t seed, uint64_t offset,
                          WeightGradWork* defer) {
  const int64_t Nl = s.local_rows(), C = s.hidden;
  // Each norm's input and output gradient, for the weight part.
  Tensor in1 = x, dout1, in2 = s.cross.active() ? a.x3 : a.x2, dout2, dout3;
  if (s.post_ln) {
    // y = norm2(r2), r2 = x2 + drop(mlp(x2)), x2 = norm1(r1), r1 = x + drop(attention(x))
    Tensor dr2 = Tensor::zeros({Nl, C}, dy.dtype(), dy.device());
    norm_backward_input(s.norm, p.norm2(), a.r2, a.n2, dy, dr2);
    Tensor dmlp = like(dy, {Nl, C});
    if (s.dropout > 0) drop_rows_backward(s, dr2, dmlp, seed, offset + mlp_offset(s));
    else dmlp.copy_from(dr2);
    const Tensor dh2 = mlp_layer_backward(s, p.mlp(), a.mlp, dmlp, defer);
    Tensor dx2 = like(dy, {Nl, C});  // dr2 + mlpᵀ(dmlp)
    add_forward(dr2, dh2, dx2);
    Tensor dr1 = Tensor::zeros({Nl, C}, dy.dtype(), dy.device());
    norm_backward_input(s.norm, p.norm1(), a.r1, a.n1, dx2, dr1);
    Tensor datt = like(dy, {Nl, C});
    if (s.dropout > 0) drop_rows_backward(s, dr1, datt, seed, offset);
    else datt.copy_from(dr1);
    const Tensor dh1 = attention_layer_backward(s, p.attn(), a.attn, datt, seed, defer);
    add_forward(dr1, dh1, dx);
    in1 = a.r1, dout1 = dx2, in2 = a.r2, dout2 = dy;
  } else {
    // MLP: y = x2 + drop(mlp(h2))
    Tensor dmlp = like(dy, {Nl, C});
    if (s.dropout > 0) drop_rows_backward(s, dy, dmlp, seed, offset + mlp_offset(s));
    else dmlp.copy_from(dy);
    const Tensor dh2 = mlp_layer_backward(s, p.mlp(), a.mlp, dmlp, defer);
    Tensor dx2 = like(dy, {Nl, C});  // dy + norm2ᵀ(dh2): d(x3) with cross-attention, else d(x2)
    dx2.copy_from(dy);
    norm_backward_input(s.norm, p.norm2(), in2, a.n2, dh2, dx2);
    if (s.cross.active()) {  // x3 = x2 + drop(xattn(h3)): d(x2) = d(x3) + norm3ᵀ(xattnᵀ(drop(d(x3))))
      Tensor dxatt = like(dy, {Nl, C});
      if (s.dropout > 0) drop_rows_backward(s, dx2, dxatt, seed, offset + 2 * mlp_offset(s));
      else dxatt.copy_from(dx2);
      dout3 = cross_attention_backward(s, p.cross(), a.xattn, dxatt, seed, defer);
      norm_backward_input(s.norm, p.norm3(), a.x2, a.n3, dout3, dx2);
    }
    // Attention: x2 = x + drop(attention(h1))
    Tensor datt = like(dy, {Nl, C});
    if (s.dropout > 0) drop_rows_backward(s, dx2, datt, seed, offset);
    else datt.copy_from(dx2);
    const Tensor dh1 = attention_layer_backward(s, p.attn(), a.attn, datt, seed, defer);
    dx.copy_from(dx2);  // dx2 + norm1ᵀ(dh1)
    norm_backward_input(s.norm, p.norm1(), x, a.n1, dh1, dx);
    dout1 = dh1, dout2 = dh2;
  }
  // The norm weight gradients (norm2, norm1, and norm3 with cross-attention). With sequence parallelism
  // each rank's are partial sums over its own rows: one buffer, all-reduced over the group.
  struct NormGrad {
    NormParams p;
    Tensor in, dout;
    NormActs acts;
  };
  std::vector<NormGrad> norms{{p.norm2(), in2, dout2, a.n2}, {p.norm1(), in1, dout1, a.n1}};
  if (s.cross.active()) norms.push_back({p.norm3(), a.x2, dout3, a.n3});
  auto norm_weights = [s, norms] {
    auto pg = [](const Var& v) { return v.defined() ? v.grad_or_zeros() : Tensor(); };
    if (!s.tp.sequence_parallel) {
      for (const NormGrad& n : norms) norm_backward_weight(s.norm, n.p, n.in, n.acts, n.dout, pg(n.p.w), pg(n.p.b));
      return;
    }
    const int64_t C = s.hidden, k = norms[0].p.b.defined() ? 2 : 1, n = static_cast<int64_t>(norms.size());
    const Tensor partial = Tensor::zeros({n * k * C}, DType::F32, norms[0].in.device());
    auto part = [&](int64_t i) { return partial.flat_range(i * C, C); };
    for (int64_t i = 0; i < n; ++i) {
      const NormGrad& g = norms[static_cast<size_t>(i)];
      norm_backward_weight(s.norm, g.p, g.in, g.acts, g.dout, part(i * k), k == 2 ? part(i * k + 1) : Tensor());
    }
    tp_all_reduce(s.tp, partial);
    for (int64_t i = 0; i < n; ++i) {
      const NormGrad& g = norms[static_cast<size_t>(i)];
      axpby(1.0f, part(i * k), 1.0f, pg(g.p.w));
      if (k == 2) axpby(1.0f, part(i * k + 1), 1.0f, pg(g.p.b));
    }
  };
  if (defer) defer->add(std::move(norm_weights));
  else norm_weights();
}

BlockMemory block_memory(const BlockShape& s) {
  const int64_t N = s.tokens(), Nl = s.local_rows(), C = s.hidden, QL = s.local_qkv();
  const int64_t Cl = s.local_att(), FCl = s.local_fc(), Fl = s.local_ffn();
  BlockMemory m;
  // h1 (attn.in), x2, h2 (mlp.in), the output y; qkv, att; fc, g.
  m.saved_act = 4 * Nl * C + N * (QL + Cl) + N * (FCl + Fl);
  m.saved_f32 = (s.norm == Normalization::LayerNorm ? 4 : 2) * Nl + s.batch * s.local_heads() * s.seq;
  // dmlp, dx2, datt, dh (Nl, C each); the gathered output gradient (SP), d(in) (N, C);
  // dg, dfc (SwiGLU), datt (N, Cl), dqkv (N, QL).
  const bool sp = s.tp.sequence_parallel;
  m.backward_act = (s.post_ln ? 6 : 4) * Nl * C + (sp ? 2 : 1) * N * C + N * Fl + (mlp_gated(s.mlp) ? N * FCl : 0) + N * (Cl + QL);
  // The weight part's inputs: each linear's output gradient and input (the gathered
  // copies with sequence parallelism), the norms' inputs and output gradients.
  const int64_t in_rows = sp ? N : Nl;
  m.deferred_act = (sp ? N : Nl) * C * 2 + N * Cl + N * QL + 2 * in_rows * C + N * Fl + N * FCl + 4 * Nl * C;
  if (s.cross.seq > 0) {
    // T5's cross-attention (model/layers/cross_attention_layer.h), M = B·Te memory rows: its norm's output
    // and x3 (Nl, C each), q and att (N, Cl), kv (M, 2·Gl·HD), lse (B, NHl, Td) f32. Its backward holds
    // d(xatt) (Nl, C), datt, dq (N, Cl), dkv (M, 2·Gl·HD) and d(mem) (M, C).
    const int64_t M = s.batch * s.cross.seq, KV = 2 * s.local_groups() * s.head_dim();
    m.saved_act += 2 * Nl * C + 2 * N * Cl + M * KV;
    m.saved_f32 += s.batch * s.local_heads() * s.seq;
    m.backward_act += Nl * C + 2 * N * Cl + M * (KV + C);
    m.deferred_act += 2 * N * Cl + M * (KV + C) + 2 * Nl * C;
  }
  if (s.moe.active()) {
    // The MoE MLP (model/layers/moe_layer.h) in place of the dense one's fc and g: R ≤ N·k rows
    // (dropless: N·k), the router's logits (N, E), probabilities and choices (N, k) in f32,
    // xp, fc, g and yp per row; the shared experts' fc and g (N, FCsl + Fsl). Its backward
    // holds d(yp), d(g), d(fc) (gated), d(xp) and d(logits).
    const int64_t R = N * s.moe.topk, E = s.moe.experts, k = s.moe.topk;
    const int64_t FCel = s.local_expert_fc(), Fel = s.local_expert_ffn();
    const int64_t Fsl = s.moe.shared_ffn / s.tp.size, FCsl = (mlp_gated(s.mlp) ? 2 : 1) * Fsl;
    m.saved_act += R * (2 * C + FCel + Fel) + N * (FCsl + Fsl) - N * (FCl + Fl);
    m.saved_f32 += N * (E + 3 * k) + (s.moe.shared_gate ? 2 * N : 0);
    m.backward_act += R * (2 * C + Fel + (mlp_gated(s.mlp) ? FCel : 0)) + N * (Fsl + FCsl) + 2 * N * E -
                      N * Fl - (mlp_gated(s.mlp) ? N * FCl : 0);
    m.deferred_act += R * (2 * C + Fel + FCel) + N * (E + C) + N * (FCsl + Fsl) - N * Fl - N * FCl;
  }
  return m;
}

namespace {
struct BlockNode final : Node {
  BlockShape shape{};
  BlockParams params;
  Var x, y;
  BlockActs acts;
  uint64_t seed = 0, offset = 0;
  std::function<void()> grads_ready, before_backward;
  const char* name() const override { return "transformer_block"; }
  bool supports_recompute() const override { return true; }
  void release_saved() override { acts.release(); }
  void recompute() override {
    if (before_backward) before_backward();
    Tensor scratch = Tensor::empty(y.value().shape(), y.value().dtype(), y.value().device());
    BlockShape again = shape;
    again.moe.record = false;  // the MoE statistics were counted by the first forward
    block_forward(again, params, x.value(), scratch, acts, seed, offset);
  }
  void backward() override {
    WeightGradWork* defer = weight_grad_sink();
    if (before_backward) before_backward();
    backward_impl(defer);
    if (!grads_ready) return;
    if (defer) defer->add(grads_ready);  // final once the deferred weight part ran
    else grads_ready();
  }
  void backward_impl(WeightGradWork* defer) {
    if (!y.grad().defined()) return;
    const Tensor& xv = x.value();
    auto run = [&](const Tensor& dx) { block_backward_input(shape, params, xv, y.grad(), dx, acts, seed, offset, defer); };
    if (!x.requires_grad()) {
      run(Tensor::empty(xv.shape(), xv.dtype(), xv.device()));
    } else if (!x.grad().defined()) {
      Var(x).set_grad(Tensor::empty(xv.shape(), xv.dtype(), xv.device()));
      run(x.grad());
    } else {
      Tensor dx = Tensor::empty(xv.shape(), xv.dtype(), xv.device());
      run(dx);
      axpby(1.0f, dx, 1.0f, x.grad());
    }
  }
};
}  // namespace

Var block(Tape& tape, const BlockShape& s, const BlockParams& p, const Var& x, uint64_t seed, uint64_t offset,
          bool recompute, std::function<void()> grads_ready, std::function<void()> before_backward) {
  const Tensor& xv = x.value();
  Var y(Tensor::empty(xv.shape(), xv.dtype(), xv.device()), true);
  auto node = std::make_unique<BlockNode>();
  block_forward(s, p, xv, y.value(), node->acts, seed, offset);
  if (!tape.recording()) return y;
  node->shape = s, node->params = p, node->x = x, node->y = y, node->seed = seed, node->offset = offset;
  node->grads_ready = std::move(grads_ready);
  node->before_backward = std::move(before_backward);
  tape.record(std::move(node), recompute);
  return y;
}

}  // namespace mpitron
