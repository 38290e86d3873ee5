#include "model/layers/norm.h"

#include "tensor/ops.h"

namespace mpitron {

void norm_forward(Normalization kind, float eps, const NormParams& p, const Tensor& x, const Tensor& out,
                  NormActs& a) {
  const int64_t n = x.dim(0);
  a.rstd = Tensor::empty({n}, DType::F32, x.device());
  if (kind == Normalization::RMSNorm) {
    a.mean = Tensor();
    rmsnorm_forward(x, p.w.value(), out, a.rstd, eps);
    return;
  }
  a.mean = Tensor::empty({n}, DType::F32, x.device());
  layernorm_forward(x, p.w.value(), p.b.value(), out, a.mean, a.rstd, eps);
}

void norm_backward_input(Normalization kind, const NormParams& p, const Tensor& x, const NormActs& a,
                         const Tensor& dout, const Tensor& dx) {
  if (kind == Normalization::RMSNorm) rmsnorm_backward(dout, x, p.w.value(), a.rstd, dx, Tensor(), true);
  else layernorm_backward(dout, x, p.w.value(), a.mean, a.rstd, dx, Tensor(), Tensor(), true);
}

void norm_backward_weight(Normalization kind, const NormParams& p, const Tensor& x, const NormActs& a,
                          const Tensor& dout, const Tensor& dw, const Tensor& db) {
  if (kind == Normalization::RMSNorm) rmsnorm_backward(dout, x, p.w.value(), a.rstd, Tensor(), dw);
  else layernorm_backward(dout, x, p.w.value(), a.mean, a.rstd, Tensor(), dw, db);
}

}  // namespace mpitron
