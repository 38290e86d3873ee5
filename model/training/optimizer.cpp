#include "model/training/optimizer.h"

#include <algorithm>
#include <cmath>

#include "parallel/communicator.h"
#include "tensor/ops.h"

namespace mpitron {

// Every parameter's slice of the flat buffers (parallel/data_parallel.h's view of a ParamSet).
std::vector<FlatParam> flat_params(const ParamSet& params) {
  std::vector<FlatParam> v;
  for (const ParamInfo& p : params.infos()) v.push_back({p.offset, p.numel(), p.weight_decay, p.canonical, p.expert});
  return v;
}

ReplicatedOptimizer::ReplicatedOptimizer(ParamSet& params, const OptimizerConfig& cfg, Communicator* norm_group)
    : params_(params), norm_group_(norm_group), adam_(params.values(), 0, flat_params(params), cfg) {}

StepResult ReplicatedOptimizer::step(float lr, float loss_scale, const std::function<bool(double)>& veto) {
  return adam_.reduced_step(params_.grads(), nullptr, norm_group_, loss_scale, lr, veto);
}

}  // namespace mpitron
