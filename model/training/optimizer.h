// model/training/optimizer.h — AdamW over the whole flat parameter buffer (one
// process, or replicated over data parallelism): parallel/flat_adamw.h over [0, N),
// with the grad norm summed over the model-parallel group; and fp16's loss scaler.
//
// With f32 compute the master weights ARE the parameter values; with bf16/f16
// compute a separate f32 master copy is updated and rounded into the values.
// Gradients arrive in the flat f32 grad buffer multiplied by the loss scale.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "model/params.h"
#include "parallel/flat_adamw.h"

namespace mpitron {

class Communicator;

// Every parameter's slice of the flat buffers (parallel/data_parallel.h's view of a ParamSet).
std::vector<FlatParam> flat_params(const ParamSet& params);

class AdamWOptimizer {
 public:
  // norm_group: with tensor/pipeline parallelism, the model-parallel group over
  // which the squared grad norm is summed (each rank counts only its canonical
  // parameters, ParamInfo::canonical).
  AdamWOptimizer(ParamSet& params, const OptimizerConfig& cfg, Communicator* norm_group = nullptr);

  // One update with learning rate lr; grads are divided by loss_scale. A
  // non-finite gradient norm skips the update; so does `veto` returning true
  // when given the (unscaled, unclipped) grad norm. Every rank of the norm
  // group calls step and veto (a veto may run collectives; it must decide the
  // same on every rank).
  StepResult step(float lr, float loss_scale, const std::function<bool(double)>& veto = {});

  int64_t steps_taken() const { return adam_.steps_taken(); }
  void set_steps_taken(int64_t s) { adam_.set_steps_taken(s); }
  const Tensor& master() const { return adam_.master(); }  // (numel) f32
  const Tensor& exp_avg() const { return adam_.exp_avg(); }      // (numel) f32
  const Tensor& exp_avg_sq() const { return adam_.exp_avg_sq(); }  // (numel) f32
  // After loading master weights: round them into the compute-dtype values.
  void sync_values_from_master() { adam_.sync_values_from_master(); }
  const OptimizerConfig& config() const { return adam_.config(); }

 private:
  ParamSet& params_;
  Communicator* norm_group_ = nullptr;
  FlatAdamW adam_;  // the state of the whole buffer [0, numel)
};

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
