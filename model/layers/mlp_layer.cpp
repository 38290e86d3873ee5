#include "model/layers/mlp_layer.h"

#include "model/layers/linear_grad.h"
#include "tensor/ops.h"

namespace mpitron {

namespace {
const GemmArgs kLinear{false, true, 1.0f, 0.0f};  // y = x · Wᵀ
Tensor gather(const BlockShape& s, const Tensor& t) { return s.tp.sequence_parallel ? tp_all_gather_rows(s.tp, t) : t; }
Tensor reduce_rows(const BlockShape& s, const Tensor& full) {
  if (s.tp.sequence_parallel) return tp_reduce_scatter_rows(s.tp, full);
  tp_all_reduce(s.tp, full);
  return full;
}
}  // namespace

Tensor mlp_layer_forward(const BlockShape& s, const MlpParams& p, const Tensor& in, MlpActs& a) {
  const int64_t N = s.tokens(), C = s.hidden;
  a.in = in;
  const Tensor in_f = gather(s, in);  // (N, C)
  a.fc = Tensor::empty({N, s.local_fc()}, in.dtype(), in.device());
  gemm(in_f, p.fc_w.value(), a.fc, kLinear, p.fc_b.defined() ? p.fc_b.value() : Tensor());
  a.g = Tensor::empty({N, s.local_ffn()}, in.dtype(), in.device());
  if (s.swiglu) swiglu_forward(a.fc, a.g);
  else gelu_forward(a.fc, a.g);
  Tensor out = Tensor::empty({N, C}, in.dtype(), in.device());
  const bool bias_here = s.tp.rank == 0 && p.proj_b.defined();
  gemm(a.g, p.proj_w.value(), out, kLinear, bias_here ? p.proj_b.value() : Tensor());
  return reduce_rows(s, out);
}

Tensor mlp_layer_backward(const BlockShape& s, const MlpParams& p, const MlpActs& a, const Tensor& dout,
                          WeightGradWork* defer) {
  const int64_t N = s.tokens(), C = s.hidden;
  const Tensor dout_f = gather(s, dout);  // (N, C)
  Tensor dg = Tensor::empty({N, s.local_ffn()}, dout.dtype(), dout.device());
  linear_backward_input(dout_f, p.proj_w, dg);
  linear_backward_weight(dout_f, a.g, p.proj_w, p.proj_b, defer);
  Tensor dfc = dg;
  if (s.swiglu) {
    dfc = Tensor::empty(a.fc.shape(), dout.dtype(), dout.device());
    swiglu_backward(dg, a.fc, dfc);
  } else {
    gelu_backward(dg, a.fc, dg);
  }
  Tensor din_f = Tensor::empty({N, C}, dout.dtype(), dout.device());
  linear_backward_input(dfc, p.fc_w, din_f);
  linear_backward_weight(dfc, gather(s, a.in), p.fc_w, p.fc_b, defer);
  return reduce_rows(s, din_f);
}

}  // namespace mpitron
