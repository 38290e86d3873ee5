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

AdamWOptimizer::AdamWOptimizer(ParamSet& params, const OptimizerConfig& cfg, Communicator* norm_group)
    : params_(params), norm_group_(norm_group), adam_(params.values(), 0, flat_params(params), cfg) {}

StepResult AdamWOptimizer::step(float lr, float loss_scale, const std::function<bool(double)>& veto) {
  return adam_.reduced_step(params_.grads(), nullptr, norm_group_, loss_scale, lr, veto);
}

LossScaler::LossScaler(const LossScalerConfig& c) : cfg_(c) {
  scale_ = c.constant > 0 ? c.constant : c.initial_scale;
  hysteresis_tracker_ = c.hysteresis;
}

void LossScaler::update(bool found_inf) {
  if (!enabled_ || cfg_.constant > 0) return;
  if (found_inf) {
    growth_tracker_ = 0;
    if (--hysteresis_tracker_ <= 0) scale_ = std::max(scale_ * 0.5f, cfg_.min_scale);
  } else {
    if (++growth_tracker_ == cfg_.window) {
      growth_tracker_ = 0;
      hysteresis_tracker_ = cfg_.hysteresis;
      scale_ *= 2.0f;
    }
  }
}

void LossScaler::set_state(const State& s) {
  scale_ = s.scale;
  growth_tracker_ = s.growth_tracker;
  hysteresis_tracker_ = s.hysteresis_tracker;
}

}  // namespace mpitron
