// model/checkpoint/loss_scaler.h — fp16's loss scaler. Training steps it; every checkpoint
// holds its state (model/checkpoint/checkpointing.h), so it lives in the checkpoint layer,
// below training and inference.
#pragma once
#include <cstdint>

namespace mpitron {

// Megatron's dynamic loss scaler for --fp16 (DynamicGradScaler), or a constant.
struct LossScalerConfig {
  float initial_scale = 4294967296.0f;  // --initial-loss-scale (2^32)
  float min_scale = 1.0f;               // --min-loss-scale
  int64_t window = 1000;                // --loss-scale-window: clean steps before doubling
  int64_t hysteresis = 2;               // --hysteresis: overflows tolerated before halving
  float constant = 0.0f;                // --loss-scale: > 0 means a static scale
};

class LossScaler {
 public:
  LossScaler() : enabled_(false) {}
  explicit LossScaler(const LossScalerConfig& c);
  float scale() const { return enabled_ ? scale_ : 1.0f; }
  void update(bool found_inf);
  // State for checkpoints.
  struct State {
    float scale;
    int64_t growth_tracker, hysteresis_tracker;
  };
  State state() const { return {scale_, growth_tracker_, hysteresis_tracker_}; }
  void set_state(const State& s);
  bool enabled() const { return enabled_; }
  // A static scale, or a dynamic one already at --min-loss-scale: an overflow
  // now cannot be cured by scaling down.
  bool at_minimum() const { return enabled_ && (cfg_.constant > 0 || scale_ <= cfg_.min_scale); }

 private:
  bool enabled_ = true;
  LossScalerConfig cfg_;
  float scale_ = 1.0f;
  int64_t growth_tracker_ = 0, hysteresis_tracker_ = 0;
};

}  // namespace mpitron
