#include "model/block.h"

#include <cmath>

#include "tensor/ops.h"

namespace mpitron {

BlockParams BlockParams::from(const ParamSet& ps, const std::string& pre) {
  BlockParams p;
  p.ln1_w = ps.var(pre + "ln1.weight");
  p.ln1_b = ps.var(pre + "ln1.bias");
  p.qkv_w = ps.var(pre + "attn.qkv.weight");
  p.qkv_b = ps.var(pre + "attn.qkv.bias");
  p.proj_w = ps.var(pre + "attn.proj.weight");
  p.proj_b = ps.var(pre + "attn.proj.bias");
  p.ln2_w = ps.var(pre + "ln2.weight");
  p.ln2_b = ps.var(pre + "ln2.bias");
  p.fc_w = ps.var(pre + "mlp.fc.weight");
  p.fc_b = ps.var(pre + "mlp.fc.bias");
  p.mproj_w = ps.var(pre + "mlp.proj.weight");
  p.mproj_b = ps.var(pre + "mlp.proj.bias");
  return p;
}

namespace {
Tensor act(const Tensor& like, const Shape& shape) { return Tensor::empty(shape, like.dtype(), like.device()); }
Tensor f32(const Tensor& like, const Shape& shape) { return Tensor::empty(shape, DType::F32, like.device()); }
const GemmArgs kLinear{false, true, 1.0f, 0.0f};  // y = x · Wᵀ

// The attention-probability dropout of a block: the mask of (batch, GLOBAL head,
// i, j) — this rank's heads start at rank·NH/t — so TP ranks and a recompute draw
// the single-process masks (the shape, with its stream, is saved for recompute).
AttentionDropout attention_dropout(const BlockShape& s, uint64_t seed) {
  if (s.attention_dropout == 0.0f) return {};
  return {s.attention_dropout, seed, s.attention_offset, s.tp.rank * (s.heads / s.tp.size)};
}
}  // namespace

// Shapes below: N tokens, Nl = N (or N/t with sequence parallelism) local rows,
// Cl = C/t, Fl = F/t, NHl = NH/t local heads.
void block_forward(const BlockShape& s, const BlockParams& p, const Tensor& x, const Tensor& y, BlockActs& a,
                   uint64_t seed, uint64_t offset) {
  const TensorParallel& tp = s.tp;
  const int64_t N = s.tokens(), Nl = s.local_rows(), C = s.hidden, HD = C / s.heads;
  const int64_t NHl = s.heads / tp.size, Cl = C / tp.size, Fl = s.ffn / tp.size;
  // Philox offsets count blocks of 4 numbers (core/philox.h): this rank's first
  // element (first_row·C, a multiple of 4) starts block first_row·C/4 of the mask.
  const uint64_t row0 = static_cast<uint64_t>(tp.first_row(N) * C / 4);
  const bool bias_here = tp.rank == 0;                                // row-parallel biases: added once
  Tensor ln1 = act(x, {Nl, C});
  a.mean1 = f32(x, {Nl});
  a.rstd1 = f32(x, {Nl});
  layernorm_forward(x, p.ln1_w.value(), p.ln1_b.value(), ln1, a.mean1, a.rstd1, s.eps);
  // Saved: this rank's rows only (Nl, C); the gathered (N, C) copy feeds the matmul
  // and is gathered again in backward (Megatron's sequence-parallel memory saving).
  a.ln1 = ln1;
  const Tensor ln1_full = tp.sequence_parallel ? tp_all_gather_rows(tp, ln1) : ln1;  // (N, C)
  a.qkv = act(x, {N, 3 * Cl});
  gemm(ln1_full, p.qkv_w.value(), a.qkv, kLinear, p.qkv_b.value());
  a.att = act(x, {N, Cl});
  a.lse = f32(x, {s.batch, NHl, s.seq});
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  attention_forward(a.qkv.view({s.batch, s.seq, 3, NHl, HD}), a.att.view({s.batch, s.seq, NHl, HD}), a.lse, scale,
                    attention_dropout(s, seed));
  Tensor proj = act(x, {N, C});
  gemm(a.att, p.proj_w.value(), proj, kLinear, bias_here ? p.proj_b.value() : Tensor());
  if (tp.sequence_parallel) proj = tp_reduce_scatter_rows(tp, proj);  // (Nl, C)
  else tp_all_reduce(tp, proj);
  if (s.dropout > 0) dropout_forward(proj, proj, s.dropout, seed, offset + row0);
  a.x2 = act(x, {Nl, C});
  add_forward(x, proj, a.x2);
  Tensor ln2 = act(x, {Nl, C});
  a.mean2 = f32(x, {Nl});
  a.rstd2 = f32(x, {Nl});
  layernorm_forward(a.x2, p.ln2_w.value(), p.ln2_b.value(), ln2, a.mean2, a.rstd2, s.eps);
  a.ln2 = ln2;
  const Tensor ln2_full = tp.sequence_parallel ? tp_all_gather_rows(tp, ln2) : ln2;  // (N, C)
  a.fc = act(x, {N, Fl});
  gemm(ln2_full, p.fc_w.value(), a.fc, kLinear, p.fc_b.value());
  a.g = act(x, {N, Fl});
  gelu_forward(a.fc, a.g);
  Tensor mlp = act(x, {N, C});
  gemm(a.g, p.mproj_w.value(), mlp, kLinear, bias_here ? p.mproj_b.value() : Tensor());
  if (tp.sequence_parallel) mlp = tp_reduce_scatter_rows(tp, mlp);  // (Nl, C)
  else tp_all_reduce(tp, mlp);
  if (s.dropout > 0) dropout_forward(mlp, mlp, s.dropout, seed, offset + static_cast<uint64_t>(N * C) + row0);
  add_forward(a.x2, mlp, y);
}

void block_backward(const BlockShape& s, const BlockParams& p, const Tensor& x, const Tensor& dy, const Tensor& dx,
                    const BlockActs& a, uint64_t seed, uint64_t offset) {
  const TensorParallel& tp = s.tp;
  const int64_t N = s.tokens(), Nl = s.local_rows(), C = s.hidden, HD = C / s.heads;
  const int64_t NHl = s.heads / tp.size, Cl = C / tp.size, Fl = s.ffn / tp.size;
  const uint64_t row0 = static_cast<uint64_t>(tp.first_row(N) * C / 4);  // see block_forward
  const bool sp = tp.sequence_parallel;
  auto pg = [](const Var& v) { return v.grad_or_zeros(); };
  // With sequence parallelism the layernorm gradients are partial sums over
  // this rank's rows: gather them in one (4C) buffer, all-reduced at the end.
  Tensor ln_partial;
  Tensor dln1_w, dln1_b, dln2_w, dln2_b;
  if (sp) {
    ln_partial = Tensor::zeros({4 * C}, DType::F32, x.device());
    dln1_w = ln_partial.flat_range(0, C), dln1_b = ln_partial.flat_range(C, C);
    dln2_w = ln_partial.flat_range(2 * C, C), dln2_b = ln_partial.flat_range(3 * C, C);
  } else {
    dln1_w = pg(p.ln1_w), dln1_b = pg(p.ln1_b), dln2_w = pg(p.ln2_w), dln2_b = pg(p.ln2_b);
  }
  // The local rows of a column-parallel input's partial gradient (N, C): summed over the group.
  auto reduce_rows = [&](const Tensor& full) {
    if (sp) return tp_reduce_scatter_rows(tp, full);
    tp_all_reduce(tp, full);
    return full;
  };
  // MLP: y = x2 + drop(g · Wmpᵀ + bmp)
  Tensor dmlp = act(x, {Nl, C});
  if (s.dropout > 0) dropout_backward(dy, dmlp, s.dropout, seed, offset + static_cast<uint64_t>(N * C) + row0);
  else dmlp.copy_from(dy);
  if (sp) dmlp = tp_all_gather_rows(tp, dmlp);  // (N, C)
  Tensor dg = act(x, {N, Fl});
  gemm_backward(dmlp, a.g, p.mproj_w.value(), dg, pg(p.mproj_w), pg(p.mproj_b), kLinear, false, true);
  gelu_backward(dg, a.fc, dg);
  Tensor dln2 = act(x, {N, C});
  gemm_backward(dg, sp ? tp_all_gather_rows(tp, a.ln2) : a.ln2, p.fc_w.value(), dln2, pg(p.fc_w), pg(p.fc_b),
                kLinear, false, true);
  dln2 = reduce_rows(dln2);  // (Nl, C)
  // dx2 = dy + LN2ᵀ(dln2)
  Tensor dx2 = act(x, {Nl, C});
  dx2.copy_from(dy);
  layernorm_backward(dln2, a.x2, p.ln2_w.value(), a.mean2, a.rstd2, dx2, dln2_w, dln2_b, true);
  // Attention: x2 = x + drop(att · Wprojᵀ + bproj)
  Tensor dproj = act(x, {Nl, C});
  if (s.dropout > 0) dropout_backward(dx2, dproj, s.dropout, seed, offset + row0);
  else dproj.copy_from(dx2);
  if (sp) dproj = tp_all_gather_rows(tp, dproj);  // (N, C)
  Tensor datt = act(x, {N, Cl});
  gemm_backward(dproj, a.att, p.proj_w.value(), datt, pg(p.proj_w), pg(p.proj_b), kLinear, false, true);
  Tensor dqkv = act(x, {N, 3 * Cl});
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  attention_backward(datt.view({s.batch, s.seq, NHl, HD}), a.qkv.view({s.batch, s.seq, 3, NHl, HD}),
                     a.att.view({s.batch, s.seq, NHl, HD}), a.lse, dqkv.view({s.batch, s.seq, 3, NHl, HD}), scale,
                     attention_dropout(s, seed));
  Tensor dln1 = act(x, {N, C});
  gemm_backward(dqkv, sp ? tp_all_gather_rows(tp, a.ln1) : a.ln1, p.qkv_w.value(), dln1, pg(p.qkv_w), pg(p.qkv_b),
                kLinear, false, true);
  dln1 = reduce_rows(dln1);  // (Nl, C)
  // dx = dx2 + LN1ᵀ(dln1)
  dx.copy_from(dx2);
  layernorm_backward(dln1, x, p.ln1_w.value(), a.mean1, a.rstd1, dx, dln1_w, dln1_b, true);
  if (sp) {
    tp_all_reduce(tp, ln_partial);
    axpby(1.0f, dln1_w, 1.0f, pg(p.ln1_w));
    axpby(1.0f, dln1_b, 1.0f, pg(p.ln1_b));
    axpby(1.0f, dln2_w, 1.0f, pg(p.ln2_w));
    axpby(1.0f, dln2_b, 1.0f, pg(p.ln2_b));
  }
}

namespace {
struct BlockNode final : Node {
  BlockShape shape{};
  BlockParams params;
  Var x, y;
  BlockActs acts;
  uint64_t seed = 0, offset = 0;
  std::function<void()> grads_ready;
  const char* name() const override { return "transformer_block"; }
  bool supports_recompute() const override { return true; }
  void release_saved() override { acts.release(); }
  void recompute() override {
    Tensor scratch = Tensor::empty(y.value().shape(), y.value().dtype(), y.value().device());
    block_forward(shape, params, x.value(), scratch, acts, seed, offset);
  }
  void backward() override {
    backward_impl();
    if (grads_ready) grads_ready();
  }
  void backward_impl() {
    if (!y.grad().defined()) return;
    const Tensor& xv = x.value();
    if (!x.requires_grad()) {
      Tensor dx = Tensor::empty(xv.shape(), xv.dtype(), xv.device());
      block_backward(shape, params, xv, y.grad(), dx, acts, seed, offset);
      return;
    }
    if (!x.grad().defined()) {
      Var(x).set_grad(Tensor::empty(xv.shape(), xv.dtype(), xv.device()));
      block_backward(shape, params, xv, y.grad(), x.grad(), acts, seed, offset);
    } else {
      Tensor dx = Tensor::empty(xv.shape(), xv.dtype(), xv.device());
      block_backward(shape, params, xv, y.grad(), dx, acts, seed, offset);
      axpby(1.0f, dx, 1.0f, x.grad());
    }
  }
};
}  // namespace

Var block(Tape& tape, const BlockShape& s, const BlockParams& p, const Var& x, uint64_t seed, uint64_t offset,
          bool recompute, std::function<void()> grads_ready) {
  const Tensor& xv = x.value();
  Var y(Tensor::empty(xv.shape(), xv.dtype(), xv.device()), true);
  auto node = std::make_unique<BlockNode>();
  block_forward(s, p, xv, y.value(), node->acts, seed, offset);
  if (!tape.recording()) return y;
  node->shape = s, node->params = p, node->x = x, node->y = y, node->seed = seed, node->offset = offset;
  node->grads_ready = std::move(grads_ready);
  tape.record(std::move(node), recompute);
  return y;
}

}  // namespace mpitron
