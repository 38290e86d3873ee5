#include "model/block.h"

#include "tensor/ops.h"

namespace mpitron {

BlockShape block_shape(const GPTConfig& c, int64_t batch, int64_t seq, const TensorParallel& tp, bool train,
                       int64_t layer, const ContextParallel& cp) {
  BlockShape s;
  s.batch = batch;
  s.seq = seq;
  s.hidden = c.hidden_size;
  s.dropout = train ? c.hidden_dropout : 0.0f;
  s.tp = tp;
  s.attention_dropout = train ? c.attention_dropout : 0.0f;
  s.cp = cp;
  // Attention dropout: layer l's Philox blocks [l·⌈T²/4⌉, (l+1)·⌈T²/4⌉) of each (batch, head) (T: the whole sequence).
  const int64_t T = s.global_seq();
  s.attention_offset = static_cast<uint64_t>(layer) * static_cast<uint64_t>((T * T + 3) / 4);
  if (c.is_decoder_layer(layer)) s.cross.seq = c.seq_length;  // T5: the encoder's length (the memory's rows)
  s.moe.layer = layer;
  return s;
}

BlockParams BlockParams::from(const ParamSet& ps, const GPTConfig& cfg, int64_t layer) {
  BlockParams p;
  p.spec = layer_spec(cfg, layer);
  for (const ParamSpec& spec : p.spec->rows())  // (under EP, only this rank's experts)
    if (spec.expert < 0 || ps.has(spec.name)) p.rows.push_back({spec.role, ps.var(spec.name)});
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

void block_forward(const BlockShape& s, const BlockParams& p, const Tensor& x, const Tensor& y, BlockActs& a,
                   uint64_t seed, uint64_t offset) {
  const int64_t Nl = s.local_rows(), C = s.hidden;
  const std::vector<Branch>& branches = p.spec->branches;
  a.branches.clear();
  a.branches.resize(branches.size());
  Tensor xb = x;
  for (size_t i = 0; i < branches.size(); ++i) {
    const Branch& b = branches[i];
    BranchActs& A = a.branches[i];
    const bool last = i + 1 == branches.size();
    A.in = xb;
    Tensor h = xb;
    if (b.input_norm()) {
      h = like(x, {Nl, C});
      norm_forward(b.spec.kind, b.spec.eps, p.norm(b.norm, b.spec), xb, h, A.norm);
    }
    Tensor o = b.op->forward(s, p, h, A.op, seed);  // (Nl, C)
    if (b.output_norm()) {
      A.raw = o;
      o = like(x, {Nl, C});
      norm_forward(b.spec.kind, b.spec.eps, p.norm(b.out, b.spec), A.raw, o, A.out);
    }
    if (s.dropout > 0) drop_rows(s, o, seed, offset + static_cast<uint64_t>(b.dropout_slot) * mlp_offset(s));
    if (b.residual_norm()) {
      A.sum = like(x, {Nl, C});
      add_forward(xb, o, A.sum);
      const Tensor out = last ? y : like(x, {Nl, C});
      norm_forward(b.spec.kind, b.spec.eps, p.norm(b.norm, b.spec), A.sum, out, A.norm);
      xb = out;
    } else {
      const Tensor out = last ? y : like(x, {Nl, C});
      add_forward(xb, o, out);
      xb = out;
    }
  }
}

namespace {
// One norm's weight-gradient inputs, for the weight part.
struct NormGrad {
  NormSpec spec;
  NormParams p;
  Tensor in, dout;
  NormActs acts;
};

// The norm weight gradients. With sequence parallelism each rank's are partial sums over its own
// rows: one buffer, all-reduced over the group.
void norm_weight_grads(const BlockShape& s, const std::vector<NormGrad>& norms) {
  auto pg = [](const Var& v) { return v.defined() ? v.grad_or_zeros() : Tensor(); };
  if (norms.empty()) return;
  if (!s.tp.sequence_parallel) {
    for (const NormGrad& n : norms) norm_backward_weight(n.spec.kind, n.p, n.in, n.acts, n.dout, pg(n.p.w), pg(n.p.b));
    return;
  }
  const int64_t C = s.hidden;
  int64_t parts = 0;
  for (const NormGrad& n : norms) parts += n.p.b.defined() ? 2 : 1;
  const Tensor partial = Tensor::zeros({parts * C}, DType::F32, norms[0].in.device());
  auto part = [&](int64_t i) { return partial.flat_range(i * C, C); };
  int64_t at = 0;
  for (const NormGrad& g : norms) {
    const bool bias = g.p.b.defined();
    norm_backward_weight(g.spec.kind, g.p, g.in, g.acts, g.dout, part(at), bias ? part(at + 1) : Tensor());
    at += bias ? 2 : 1;
  }
  tp_all_reduce(s.tp, partial);
  at = 0;
  for (const NormGrad& g : norms) {
    axpby(1.0f, part(at), 1.0f, pg(g.p.w));
    if (g.p.b.defined()) axpby(1.0f, part(at + 1), 1.0f, pg(g.p.b));
    at += g.p.b.defined() ? 2 : 1;
  }
}
}  // namespace

void block_backward_input(const BlockShape& s, const BlockParams& p, const Tensor& x, const Tensor& dy,
                          const Tensor& dx, const BlockActs& a, uint64_t seed, uint64_t offset,
                          WeightGradWork* defer) {
  (void)x;
  const int64_t Nl = s.local_rows(), C = s.hidden;
  const std::vector<Branch>& branches = p.spec->branches;
  std::vector<NormGrad> norms;
  Tensor d = dy;  // the gradient of the current branch's output
  for (size_t i = branches.size(); i-- > 0;) {
    const Branch& b = branches[i];
    const BranchActs& A = a.branches[i];
    Tensor dsum = d;  // d(x + drop(o))
    if (b.residual_norm()) {
      dsum = Tensor::zeros({Nl, C}, dy.dtype(), dy.device());
      const NormParams np = p.norm(b.norm, b.spec);
      norm_backward_input(b.spec.kind, np, A.sum, A.norm, d, dsum);
      norms.push_back({b.spec, np, A.sum, d, A.norm});
    }
    Tensor dout = like(dy, {Nl, C});
    if (s.dropout > 0) drop_rows_backward(s, dsum, dout, seed, offset + static_cast<uint64_t>(b.dropout_slot) * mlp_offset(s));
    else dout.copy_from(dsum);
    if (b.output_norm()) {
      Tensor draw = Tensor::zeros({Nl, C}, dy.dtype(), dy.device());
      const NormParams np = p.norm(b.out, b.spec);
      norm_backward_input(b.spec.kind, np, A.raw, A.out, dout, draw);
      norms.push_back({b.spec, np, A.raw, dout, A.out});
      dout = draw;
    }
    const Tensor dh = b.op->backward(s, p, *A.op, dout, seed, defer);
    const Tensor dxb = i == 0 ? dx : like(dy, {Nl, C});
    if (b.input_norm()) {
      dxb.copy_from(dsum);  // dsum + normᵀ(dh)
      const NormParams np = p.norm(b.norm, b.spec);
      norm_backward_input(b.spec.kind, np, A.in, A.norm, dh, dxb);
      norms.push_back({b.spec, np, A.in, dh, A.norm});
    } else {
      add_forward(dsum, dh, dxb);
    }
    d = dxb;
  }
  auto weights = [s, norms] { norm_weight_grads(s, norms); };
  if (defer) defer->add(std::move(weights));
  else weights();
}

BlockMemory block_memory(const BlockShape& s, const LayerSpec& spec) {
  const int64_t N = s.tokens(), Nl = s.local_rows(), C = s.hidden;
  const bool sp = s.tp.sequence_parallel;
  BlockMemory m;
  // Per branch: the norm's output (the sublayer's input) and the branch's output saved, the norm's
  // statistics (f32); the backward's d(out) and d(x) (Nl, C), d(sum) with a norm after the residual;
  // the weight part's norm inputs and output gradients. An output norm adds its input and statistics.
  for (const Branch& b : spec.branches) {
    const int64_t stats = (b.spec.kind == Normalization::LayerNorm ? 2 : 1) * Nl;
    m.saved_act += 2 * Nl * C;
    m.saved_f32 += stats;
    m.backward_act += (b.residual_norm() ? 3 : 2) * Nl * C;
    m.deferred_act += 2 * Nl * C;
    if (b.output_norm()) {
      m.saved_act += Nl * C;
      m.saved_f32 += stats;
      m.backward_act += Nl * C;
      m.deferred_act += 2 * Nl * C;
    }
    b.op->memory(s, m);
  }
  // The gathered output gradient (SP) and d(in) (N, C); the weight part's linear inputs and output
  // gradients (the gathered copies with sequence parallelism).
  const int64_t in_rows = sp ? N : Nl;
  m.backward_act += (sp ? 2 : 1) * N * C;
  m.deferred_act += (sp ? N : Nl) * C * 2 + 2 * in_rows * C;
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
