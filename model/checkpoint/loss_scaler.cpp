#include "model/checkpoint/loss_scaler.h"

#include <algorithm>

namespace mpitron {

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
