#include "model/layers/norm.h"

#include "tensor/ops.h"

namespace mpitron {

Tensor norm_scale(const NormParams& p) {
  const Tensor& w = p.w.value();
  if (!p.one_plus) return w;
  const Tensor s = Tensor::empty(w.shape(), w.dtype(), w.device());
  s.fill(1.0);
  axpby(1.0f, w, 1.0f, s);  // s = w + 1
  return s;
}

void norm_forward(Normalization kind, float eps, const NormParams& p, const Tensor& x, const Tensor& out,
                  NormActs& a) {
  const int64_t n = x.dim(0);
  a.rstd = Tensor::empty({n}, DType::F32, x.device());
  if (kind == Normalization::RMSNorm) {
    a.mean = Tensor();
    rmsnorm_forward(x, norm_scale(p), out, a.rstd, eps);
    return;
  }
  a.mean = Tensor::empty({n}, DType::F32, x.device());
  layernorm_forward(x, norm_scale(p), p.b.value(), out, a.mean, a.rstd, eps);
}

void norm_backward_input(Normalization kind, const NormParams& p, const Tensor& x, const NormActs& a,
                         const Tensor& dout, const Tensor& dx) {
  if (kind == Normalization::RMSNorm) rmsnorm_backward(dout, x, norm_scale(p), a.rstd, dx, Tensor(), true);
  else layernorm_backward(dout, x, norm_scale(p), a.mean, a.rstd, dx, Tensor(), Tensor(), true);
}

void norm_backward_weight(Normalization kind, const NormParams& p, const Tensor& x, const NormActs& a,
                          const Tensor& dout, const Tensor& dw, const Tensor& db) {
  if (kind == Normalization::RMSNorm) rmsnorm_backward(dout, x, p.w.value(), a.rstd, Tensor(), dw);
  else layernorm_backward(dout, x, p.w.value(), a.mean, a.rstd, Tensor(), dw, db);
}

}  // namespace mpitron
