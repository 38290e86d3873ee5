#include "model/layers/mlp_layer.h"

#include "model/layers/linear_grad.h"
#include "model/layers/moe_layer.h"
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

Tensor mlp_core_forward(const BlockShape& s, const MlpParams& p, const Tensor& in_f, MlpActs& a) {
  const int64_t N = in_f.dim(0), C = s.hidden;
  a.fc = Tensor::empty({N, s.local_fc()}, in_f.dtype(), in_f.device());
  linear_forward(in_f, p.fc_w, p.fc_b, a.fc);
  a.g = Tensor::empty({N, s.local_ffn()}, in_f.dtype(), in_f.device());
  activation_forward(s.mlp, a.fc, a.g);
  Tensor out = Tensor::empty({N, C}, in_f.dtype(), in_f.device());
  linear_forward(a.g, p.proj_w, s.tp.rank == 0 ? p.proj_b : Var(), out);  // row-parallel bias: added once
  return out;
}

Tensor mlp_core_backward(const BlockShape& s, const MlpParams& p, const MlpActs& a, const Tensor& in,
                         const Tensor& dout_f, WeightGradWork* defer) {
  const int64_t N = dout_f.dim(0), C = s.hidden;
  Tensor dg = Tensor::empty({N, s.local_ffn()}, dout_f.dtype(), dout_f.device());
  linear_backward_input(dout_f, p.proj_w, dg);
  linear_backward_weight(dout_f, a.g, p.proj_w, p.proj_b, defer);
  const Tensor dfc = activation_backward(s.mlp, dg, a.fc);
  Tensor din_f = Tensor::empty({N, C}, dout_f.dtype(), dout_f.device());
  linear_backward_input(dfc, p.fc_w, din_f);
  linear_backward_weight(dfc, gather_rows(s, in), p.fc_w, p.fc_b, defer);
  return din_f;
}

Tensor mlp_layer_forward(const BlockShape& s, const MlpParams& p, const Tensor& in, MlpActs& a) {
  if (s.moe.active()) return moe_layer_forward(s, p.moe, in, a);
  a.in = in;
  return reduce_rows(s, mlp_core_forward(s, p, gather_rows(s, in), a));
}

Tensor mlp_layer_backward(const BlockShape& s, const MlpParams& p, const MlpActs& a, const Tensor& dout,
                          WeightGradWork* defer) {
  if (s.moe.active()) return moe_layer_backward(s, p.moe, a, dout, defer);
  return reduce_rows(s, mlp_core_backward(s, p, a, a.in, gather_rows(s, dout), defer));
}

}  // namespace mpitron
