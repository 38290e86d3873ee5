// model/layers/linear_grad.h — a linear layer y (N, out) = x (N, in) · Wᵀ + b
// (b undefined: none) and the two halves of its backward:
//   input  (B): dx (N, in) = dy · W          (overwritten)
//   weight (W): dW (out, in) += dyᵀ · x,  db (out) += Σ_rows dy
// linear_backward_weight runs now, or appends itself to `defer` holding dy and x.
#pragma once
#include "autograd/tape.h"

namespace mpitron {

void linear_forward(const Tensor& x, const Var& w, const Var& b, const Tensor& y);
void linear_backward_input(const Tensor& dy, const Var& w, const Tensor& dx);
void linear_backward_weight(const Tensor& dy, const Tensor& x, const Var& w, const Var& b, WeightGradWork* defer);

}  // namespace mpitron
