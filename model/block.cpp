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
}  // namespace

void block_forward(const BlockShape& s, const BlockParams& p, const Tensor& x, const Tensor& y, BlockActs& a,
                   uint64_t seed, uint64_t offset) {
  const int64_t N = s.tokens(), C = s.hidden, F = s.ffn, HD = C / s.heads;
  a.ln1 = act(x, {N, C});
  a.mean1 = f32(x, {N});
  a.rstd1 = f32(x, {N});
  layernorm_forward(x, p.ln1_w.value(), p.ln1_b.value(), a.ln1, a.mean1, a.rstd1, s.eps);
  a.qkv = act(x, {N, 3 * C});
  gemm(a.ln1, p.qkv_w.value(), a.qkv, kLinear, p.qkv_b.value());
  a.att = act(x, {N, C});
  a.lse = f32(x, {s.batch, s.heads, s.seq});
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  attention_forward(a.qkv.view({s.batch, s.seq, 3, s.heads, HD}), a.att.view({s.batch, s.seq, s.heads, HD}), a.lse,
                    scale);
  Tensor proj = act(x, {N, C});
  gemm(a.att, p.proj_w.value(), proj, kLinear, p.proj_b.value());
  if (s.dropout > 0) dropout_forward(proj, proj, s.dropout, seed, offset);
  a.x2 = act(x, {N, C});
  add_forward(x, proj, a.x2);
  a.ln2 = act(x, {N, C});
  a.mean2 = f32(x, {N});
  a.rstd2 = f32(x, {N});
  layernorm_forward(a.x2, p.ln2_w.value(), p.ln2_b.value(), a.ln2, a.mean2, a.rstd2, s.eps);
  a.fc = act(x, {N, F});
  gemm(a.ln2, p.fc_w.value(), a.fc, kLinear, p.fc_b.value());
  a.g = act(x, {N, F});
  gelu_forward(a.fc, a.g);
  Tensor mlp = proj;  // reuse the (N, C) buffer
  gemm(a.g, p.mproj_w.value(), mlp, kLinear, p.mproj_b.value());
  if (s.dropout > 0) dropout_forward(mlp, mlp, s.dropout, seed, offset + static_cast<uint64_t>(N * C));
  add_forward(a.x2, mlp, y);
}

void block_backward(const BlockShape& s, const BlockParams& p, const Tensor& x, const Tensor& dy, const Tensor& dx,
                    const BlockActs& a, uint64_t seed, uint64_t offset) {
  const int64_t N = s.tokens(), C = s.hidden, F = s.ffn, HD = C / s.heads;
  auto pg = [](const Var& v) { return v.grad_or_zeros(); };
  // MLP: y = x2 + drop(g · Wmpᵀ + bmp)
  Tensor dmlp = act(x, {N, C});
  if (s.dropout > 0) dropout_backward(dy, dmlp, s.dropout, seed, offset + static_cast<uint64_t>(N * C));
  else dmlp.copy_from(dy);
  Tensor dg = act(x, {N, F});
  gemm_backward(dmlp, a.g, p.mproj_w.value(), dg, pg(p.mproj_w), pg(p.mproj_b), kLinear, false, true);
  gelu_backward(dg, a.fc, dg);
  Tensor dln2 = act(x, {N, C});
  gemm_backward(dg, a.ln2, p.fc_w.value(), dln2, pg(p.fc_w), pg(p.fc_b), kLinear, false, true);
  // dx2 = dy + LN2ᵀ(dln2)
  Tensor dx2 = act(x, {N, C});
  dx2.copy_from(dy);
  layernorm_backward(dln2, a.x2, p.ln2_w.value(), a.mean2, a.rstd2, dx2, pg(p.ln2_w), pg(p.ln2_b), true);
  // Attention: x2 = x + drop(att · Wprojᵀ + bproj)
  Tensor dproj = dmlp;  // reuse (N, C)
  if (s.dropout > 0) dropout_backward(dx2, dproj, s.dropout, seed, offset);
  else dproj.copy_from(dx2);
  Tensor datt = dln2;  // reuse (N, C)
  gemm_backward(dproj, a.att, p.proj_w.value(), datt, pg(p.proj_w), pg(p.proj_b), kLinear, false, true);
  Tensor dqkv = act(x, {N, 3 * C});
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  attention_backward(datt.view({s.batch, s.seq, s.heads, HD}), a.qkv.view({s.batch, s.seq, 3, s.heads, HD}),
                     a.att.view({s.batch, s.seq, s.heads, HD}), a.lse, dqkv.view({s.batch, s.seq, 3, s.heads, HD}),
                     scale);
  Tensor dln1 = datt;
  gemm_backward(dqkv, a.ln1, p.qkv_w.value(), dln1, pg(p.qkv_w), pg(p.qkv_b), kLinear, false, true);
  // dx = dx2 + LN1ᵀ(dln1)
  dx.copy_from(dx2);
  layernorm_backward(dln1, x, p.ln1_w.value(), a.mean1, a.rstd1, dx, pg(p.ln1_w), pg(p.ln1_b), true);
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
