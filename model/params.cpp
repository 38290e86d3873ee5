#include "model/params.h"

namespace mpitron {

void ParamSet::add(const std::string& name, const Shape& shape, bool weight_decay) {
  MPT_CHECK(!values_.defined(), str("ParamSet::add(", name, ") after allocate()"), "");
  for (const ParamInfo& p : infos_) MPT_CHECK(p.name != name, str("parameter ", name, " declared twice"), "");
  ParamInfo p{name, shape, total_, weight_decay};
  total_ += p.numel();
  infos_.push_back(std::move(p));
}

void ParamSet::allocate(DType dtype, Device device) {
  values_ = Tensor::zeros({total_}, dtype, device);
  grads_ = Tensor::zeros({total_}, DType::F32, device);
  vars_.clear();
  for (const ParamInfo& p : infos_) {
    Var v(values_.flat_range(p.offset, p.numel()).view(p.shape), true, p.name);
    v.set_grad(grads_.flat_range(p.offset, p.numel()).view(p.shape));
    vars_.push_back(v);
  }
}

const ParamInfo& ParamSet::info(const std::string& name) const {
  for (const ParamInfo& p : infos_)
    if (p.name == name) return p;
  MPT_THROW(str("no parameter named ", name), "");
}

const Var& ParamSet::var(const std::string& name) const {
  for (size_t i = 0; i < infos_.size(); ++i)
    if (infos_[i].name == name) return vars_[i];
  MPT_THROW(str("no parameter named ", name), "");
}

}  // namespace mpitron
