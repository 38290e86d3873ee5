#include "model/training/optimizer.h"

#include <algorithm>
#include <cmath>

#include "parallel/communicator.h"
#include "tensor/ops.h"

namespace mpitron {

AdamWOptimizer::AdamWOptimizer(ParamSet& params, const OptimizerConfig& cfg, Communicator* norm_group)
    : params_(params), cfg_(cfg), norm_group_(norm_group) {
  const Tensor& values = params.values();
  separate_master_ = values.dtype() != DType::F32;
  master_ = separate_master_ ? values.to(DType::F32) : values;
  m_ = Tensor::zeros({params.numel()}, DType::F32, values.device());
  v_ = Tensor::zeros({params.numel()}, DType::F32, values.device());
  for (const ParamInfo& p : params.infos()) {
    const bool decay = p.weight_decay && cfg.weight_decay != 0.0f;
    if (!segments_.empty() && segments_.back().decay == decay && segments_.back().end == p.offset)
      segments_.back().end = p.offset + p.numel();
    else
      segments_.push_back({p.offset, p.offset + p.numel(), decay});
  }
}

StepResult AdamWOptimizer::step(float lr, float loss_scale, const std::function<bool(double)>& veto) {
  StepResult r;
  double scaled_norm;
  bool all_canonical = true;
  for (const ParamInfo& p : params_.infos()) all_canonical = all_canonical && p.canonical;
  if (all_canonical && !norm_group_) {
    scaled_norm = global_l2_norm({params_.grads()});
  } else {
    Tensor sq = Tensor::zeros({1}, DType::F32, params_.grads().device());
    if (all_canonical) {
      sum_squares(params_.grads(), sq);
    } else {
      for (const ParamInfo& p : params_.infos())
        if (p.canonical) sum_squares(params_.grads().flat_range(p.offset, p.numel()), sq);
    }
    if (norm_group_) norm_group_->all_reduce(sq, ReduceOp::Sum);
    scaled_norm = std::sqrt(static_cast<double>(sq.item()));
  }
  r.grad_norm = scaled_norm / loss_scale;
  const bool vetoed = veto && veto(r.grad_norm);
  if (!std::isfinite(scaled_norm) || vetoed) {
    r.skipped = true;
    return r;
  }
  // torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), applied when < 1.
  float grad_scale = 1.0f / loss_scale;
  if (cfg_.clip_grad > 0) {
    const double coef = cfg_.clip_grad / (r.grad_norm + 1e-6);
    if (coef < 1.0) grad_scale = static_cast<float>(grad_scale * coef);
  }
  ++step_;
  AdamWArgs a;
  a.lr = lr;
  a.beta1 = cfg_.beta1;
  a.beta2 = cfg_.beta2;
  a.eps = cfg_.eps;
  a.grad_scale = grad_scale;
  a.step = step_;
  for (const Segment& s : segments_) {
    a.weight_decay = s.decay ? cfg_.weight_decay : 0.0f;
    const int64_t n = s.end - s.begin;
    adamw_step(master_.flat_range(s.begin, n), params_.grads().flat_range(s.begin, n), m_.flat_range(s.begin, n),
               v_.flat_range(s.begin, n), separate_master_ ? params_.values().flat_range(s.begin, n) : Tensor(), a);
  }
  return r;
}

void AdamWOptimizer::sync_values_from_master() {
  if (separate_master_) cast(master_, params_.values());
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
