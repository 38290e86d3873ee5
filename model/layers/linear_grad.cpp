#include "model/layers/linear_grad.h"

#include "tensor/ops.h"

namespace mpitron {

namespace {
const GemmArgs kLinear{false, true, 1.0f, 0.0f};  // y = x · Wᵀ
}

void linear_forward(const Tensor& x, const Var& w, const Var& b, const Tensor& y) {
  gemm(x, w.value(), y, kLinear, b.defined() ? b.value() : Tensor());
}

void linear_backward_input(const Tensor& dy, const Var& w, const Tensor& dx) {
  gemm(dy, w.value(), dx, GemmArgs{false, false, 1.0f, 0.0f});  // (N, out) · (out, in)
}

void linear_backward_weight(const Tensor& dy, const Tensor& x, const Var& w, const Var& b, WeightGradWork* defer) {
  auto work = [dy, x, w, b] {
    gemm_backward(dy, x, w.value(), Tensor(), w.grad_or_zeros(), b.defined() ? b.grad_or_zeros() : Tensor(), kLinear,
                  false, true);
  };
  if (defer) defer->add(std::move(work));
  else work();
}

}  // namespace mpitron
