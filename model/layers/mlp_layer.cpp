#include "model/layers/mlp_layer.h"

#include "model/layers/linear_grad.h"
#include "tensor/ops.h"

namespace mpitron {

Tensor mlp_layer_forward(const BlockShape& s, const MlpParams& p, const Tensor& in, MlpActs& a) {
  const int64_t N = s.tokens(), C = s.hidden;
  a.in = in;
  const Tensor in_f = gather_rows(s, in);  // (N, C)
  a.fc = Tensor::empty({N, s.local_fc()}, in.dtype(), in.device());
  linear_forward(in_f, p.fc_w, p.fc_b, a.fc);
  a.g = Tensor::empty({N, s.local_ffn()}, in.dtype(), in.device());
  switch (s.mlp) {
    case MlpKind::GeluTanh: gelu_forward(a.fc, a.g, false); break;
    case MlpKind::GeluErf: gelu_forward(a.fc, a.g, true); break;
    case MlpKind::SwiGLU: swiglu_forward(a.fc, a.g); break;
    case MlpKind::GeGLU: geglu_forward(a.fc, a.g); break;
  }
  Tensor out = Tensor::empty({N, C}, in.dtype(), in.device());
  linear_forward(a.g, p.proj_w, s.tp.rank == 0 ? p.proj_b : Var(), out);  // row-parallel bias: added once
  return reduce_rows(s, out);
}

Tensor mlp_layer_backward(const BlockShape& s, const MlpParams& p, const MlpActs& a, const Tensor& dout,
                          WeightGradWork* defer) {
  const int64_t N = s.tokens(), C = s.hidden;
  const Tensor dout_f = gather_rows(s, dout);  // (N, C)
  Tensor dg = Tensor::empty({N, s.local_ffn()}, dout.dtype(), dout.device());
  linear_backward_input(dout_f, p.proj_w, dg);
  linear_backward_weight(dout_f, a.g, p.proj_w, p.proj_b, defer);
  Tensor dfc = dg;
  switch (s.mlp) {
    case MlpKind::GeluTanh: gelu_backward(dg, a.fc, dg, false); break;
    case MlpKind::GeluErf: gelu_backward(dg, a.fc, dg, true); break;
    case MlpKind::SwiGLU:
      dfc = Tensor::empty(a.fc.shape(), dout.dtype(), dout.device());
      swiglu_backward(dg, a.fc, dfc);
      break;
    case MlpKind::GeGLU:
      dfc = Tensor::empty(a.fc.shape(), dout.dtype(), dout.device());
      geglu_backward(dg, a.fc, dfc);
      break;
  }
  Tensor din_f = Tensor::empty({N, C}, dout.dtype(), dout.device());
  linear_backward_input(dfc, p.fc_w, din_f);
  linear_backward_weight(dfc, gather_rows(s, a.in), p.fc_w, p.fc_b, defer);
  return reduce_rows(s, din_f);
}

}  // namespace mpitron
