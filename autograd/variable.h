// autograd/variable.h — Var: a tensor value plus the gradient the tape accumulates into it.
//
// Vars are shared handles: copies refer to the same value and grad. A
// parameter's grad is usually a view into the model's flat gradient buffer,
// set once with set_grad(); an activation's grad is allocated (zeroed) the
// first time a backward writes it.
#pragma once
#include <memory>
#include <string>

#include "tensor/tensor.h"

namespace mpitron {

class Var {
 public:
  Var() = default;
  explicit Var(Tensor value, bool requires_grad = false, std::string name = "");

  bool defined() const { return p_ != nullptr; }
  const Tensor& value() const { return p_->value; }
  const Tensor& grad() const { return p_->grad; }
  bool requires_grad() const { return p_ && p_->requires_grad; }
  const std::string& name() const { return p_->name; }
  const Shape& shape() const { return p_->value.shape(); }

  void set_grad(Tensor g);  // use `g` (e.g. a view into a flat buffer) as the gradient
  // Point the value and gradient at other storage (ZeRO-3's gathered units); either
  // may be undefined (released: nothing may read it until it is pointed again).
  void set_storage(Tensor value, Tensor grad);
  // The gradient, allocated and zeroed on first use (same shape, dtype and device as value
  // unless set_grad chose otherwise).
  const Tensor& grad_or_zeros() const;
  void zero_grad() const;
  bool same(const Var& o) const { return p_ == o.p_; }

 private:
  struct Impl {
    Tensor value, grad;
    bool requires_grad = false;
    std::string name;
  };
  std::shared_ptr<Impl> p_;
};

}  // namespace mpitron
