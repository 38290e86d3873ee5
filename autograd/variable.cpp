#include "autograd/variable.h"

namespace mpitron {

Var::Var(Tensor value, bool requires_grad, std::string name) : p_(std::make_shared<Impl>()) {
  p_->value = std::move(value);
  p_->requires_grad = requires_grad;
  p_->name = std::move(name);
}

void Var::set_grad(Tensor g) {
  MPT_CHECK(g.shape() == p_->value.shape(),
            str("set_grad: gradient ", g.describe(), " does not match value ", p_->value.describe()), "");
  p_->grad = std::move(g);
}

void Var::set_storage(Tensor value, Tensor grad) {
  MPT_CHECK(!value.defined() || !p_->value.defined() || value.shape() == p_->value.shape(),
            str("set_storage: value ", value.describe(), " does not match ", p_->value.describe()), "");
  MPT_CHECK(!grad.defined() || !value.defined() || grad.shape() == value.shape(),
            str("set_storage: gradient ", grad.describe(), " does not match value ", value.describe()), "");
  p_->value = std::move(value);
  p_->grad = std::move(grad);
}

const Tensor& Var::grad_or_zeros() const {
  if (!p_->grad.defined()) p_->grad = Tensor::zeros(p_->value.shape(), p_->value.dtype(), p_->value.device());
  return p_->grad;
}

void Var::zero_grad() const {
  if (p_->grad.defined()) p_->grad.zero();
}

}  // namespace mpitron
