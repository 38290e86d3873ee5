#include "model/layers/mlp_layer.h"

#include "model/block.h"
#include "model/layers/linear_grad.h"
#include "model/param_rows.h"
#include "tensor/ops.h"

namespace mpitron {

void activation_forward(MlpKind k, const Tensor& fc, const Tensor& g) {
  switch (k) {
    case MlpKind::GeluTanh: gelu_forward(fc, g, false); break;
    case MlpKind::GeluErf: gelu_forward(fc, g, true); break;
    case MlpKind::SwiGLU: swiglu_forward(fc, g); break;
    case MlpKind::GeGLU: geglu_forward(fc, g); break;
    case MlpKind::ReLU: relu_forward(fc, g); break;
  }
}

Tensor activation_backward(MlpKind k, const Tensor& dg, const Tensor& fc) {
  if (!mlp_gated(k)) {
    switch (k) {
      case MlpKind::GeluErf: gelu_backward(dg, fc, dg, true); break;
      case MlpKind::ReLU: relu_backward(dg, fc, dg); break;
      default: gelu_backward(dg, fc, dg, false); break;
    }
    return dg;
  }
  Tensor dfc = Tensor::empty(fc.shape(), fc.dtype(), fc.device());
  if (k == MlpKind::SwiGLU) swiglu_backward(dg, fc, dfc);
  else geglu_backward(dg, fc, dfc);
  return dfc;
}

void DenseMlp::rows(std::vector<ParamSpec>& v) const {
  const int64_t C = hidden_, F = spec_.ffn, FC = mlp_gated(spec_.kind) ? 2 * F : F, l = layer_;
  const std::vector<int64_t> parts = mlp_gated(spec_.kind) ? std::vector<int64_t>{F, F} : std::vector<int64_t>{};
  const std::string p = str("layers.", l, ".mlp.");
  const ParamPlace L = ParamPlace::Layer;
  v.push_back(matmul_row(tp_split(param_row(p + "fc.weight", ParamRole::FcWeight, {FC, C}, ParamInit::Normal, L, l), 0, parts)));
  if (spec_.bias) v.push_back(tp_split(param_row(p + "fc.bias", ParamRole::FcBias, {FC}, ParamInit::Zeros, L, l), 0, parts));
  v.push_back(matmul_row(tp_split(param_row(p + "proj.weight", ParamRole::MlpProjWeight, {C, F}, ParamInit::OutputNormal, L, l), 1)));
  if (spec_.bias) v.push_back(param_row(p + "proj.bias", ParamRole::MlpProjBias, {C}, ParamInit::Zeros, L, l));
}

Tensor mlp_core_forward(const BlockShape& s, const MlpSpec& m, const MlpParams& p, const Tensor& in_f, MlpActs& a) {
  const int64_t N = in_f.dim(0), C = s.hidden;
  a.fc = Tensor::empty({N, m.local_fc(s.tp)}, in_f.dtype(), in_f.device());
  linear_forward(in_f, p.fc_w, p.fc_b, a.fc);
  a.g = Tensor::empty({N, m.local_ffn(s.tp)}, in_f.dtype(), in_f.device());
  activation_forward(m.kind, a.fc, a.g);
  Tensor out = Tensor::empty({N, C}, in_f.dtype(), in_f.device());
  linear_forward(a.g, p.proj_w, s.tp.rank == 0 ? p.proj_b : Var(), out);  // row-parallel bias: added once
  return out;
}

Tensor mlp_core_backward(const BlockShape& s, const MlpSpec& m, const MlpParams& p, const MlpActs& a,
                         const Tensor& in_f, const Tensor& dout_f, WeightGradWork* defer) {
  const int64_t N = dout_f.dim(0), C = s.hidden;
  Tensor dg = Tensor::empty({N, m.local_ffn(s.tp)}, dout_f.dtype(), dout_f.device());
  linear_backward_input(dout_f, p.proj_w, dg);
  linear_backward_weight(dout_f, a.g, p.proj_w, p.proj_b, defer);
  const Tensor dfc = activation_backward(m.kind, dg, a.fc);
  Tensor din_f = Tensor::empty({N, C}, dout_f.dtype(), dout_f.device());
  linear_backward_input(dfc, p.fc_w, din_f);
  linear_backward_weight(dfc, in_f, p.fc_w, p.fc_b, defer);
  return din_f;
}

namespace {
MlpParams dense_params(const BlockParams& p) {
  return {p[ParamRole::FcWeight], p[ParamRole::FcBias], p[ParamRole::MlpProjWeight], p[ParamRole::MlpProjBias]};
}
}  // namespace

Tensor DenseMlp::forward(const BlockShape& s, const BlockParams& p, const Tensor& in, std::unique_ptr<SublayerActs>& acts,
                         uint64_t) const {
  auto a = std::make_unique<MlpActs>();
  a->in = in;
  const Tensor out = mlp_core_forward(s, spec_, dense_params(p), gather_rows(s, in), *a);
  acts = std::move(a);
  return reduce_rows(s, out);
}

Tensor DenseMlp::backward(const BlockShape& s, const BlockParams& p, const SublayerActs& acts, const Tensor& dout,
                          uint64_t, WeightGradWork* defer) const {
  const MlpActs& a = static_cast<const MlpActs&>(acts);
  const Tensor dout_f = gather_rows(s, dout);
  return reduce_rows(s, mlp_core_backward(s, spec_, dense_params(p), a, gather_rows(s, a.in), dout_f, defer));
}

void DenseMlp::memory(const BlockShape& s, BlockMemory& m) const {
  // fc and g saved; the backward's dg (N, Fl) and, gated, dfc (N, FCl); the weight part's inputs.
  const int64_t N = s.tokens(), FCl = spec_.local_fc(s.tp), Fl = spec_.local_ffn(s.tp);
  m.saved_act += N * (FCl + Fl);
  m.backward_act += N * Fl + (mlp_gated(spec_.kind) ? N * FCl : 0);
  m.deferred_act += N * Fl + N * FCl;
}

}  // namespace mpitron
