#include "model/training/optimizer.h"

#include <algorithm>
#include <cmath>

#include "model/param_table.h"
#include "parallel/communicator.h"
#include "tensor/ops.h"

namespace mpitron {

// Every parameter's slice of the flat buffers (parallel/data_parallel.h's view of a ParamSet).
std::vector<FlatParam> flat_params(const ParamSet& params) {
  std::vector<FlatParam> v;
  for (const ParamInfo& p : params.infos()) {
    FlatParam f{p.offset, p.numel(), p.weight_decay, p.canonical, p.expert};
    if (p.shape.size() == 2 && !is_embedding_or_output(p.role)) {  // a matrix muon orthogonalises
      f.rows = p.shape[0];
      f.cols = p.shape[1];
      f.tp_axis = p.tp.axis;
      f.tp_size = p.tp.size;
      const int64_t local = p.tp.axis == 0 ? p.tp.size : 1;
      if (p.role == ParamRole::QkvWeight && p.tp.parts.size() > 1)
        for (const int64_t rows : p.tp.parts) f.row_parts.push_back(rows / local);
    }
    v.push_back(f);
  }
  return v;
}

ReplicatedOptimizer::ReplicatedOptimizer(ParamSet& params, const OptimizerConfig& cfg, Communicator* norm_group)
    : params_(params), norm_group_(norm_group), adam_(params.values(), 0, flat_params(params), cfg) {}

StepResult ReplicatedOptimizer::step(float lr, float loss_scale, const std::function<bool(double)>& veto) {
  return adam_.reduced_step(params_.grads(), nullptr, norm_group_, loss_scale, lr, veto);
}

}  // namespace mpitron
